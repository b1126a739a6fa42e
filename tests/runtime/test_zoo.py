"""One zoo model per family (transformers' own classes, tiny, random init, from ``examples/zoo``):
the measured peak against torch.profiler's memory timeline, and the pre-run estimate from the
config alone against the measured peak, through ``--hf-config``'s generated model file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _reference import reference_step

from autotune.estimator import estimate_plan
from autotune.records import Plan
from autotune.runtime import hf
from autotune.runtime.profiler import profile
from autotune.runtime.trace import PATHS, facts_from_hf_config

ZOO = Path(__file__).resolve().parents[2] / "examples" / "zoo"
ONE_PER_FAMILY = [
    "bert",
    "t5",
    "llama_gqa",
    "mixtral",
    "vit",
    "convnext",
    "whisper",
    "mamba",
    "clip",
]


ESTIMATE_OUTSIDE_5 = {
    "convnext": "the real-step fallback scales oneDNN's convolution scratch (no tensor, now in the "
    "measured peak) linearly from micro-batch 1 and 2: -6.6 %",
}
"""Rows whose estimate is outside the 5 % bar, with the cause (bench/RESULTS.md's zoo section);
they are held to 8 % so that a change either way is seen."""


@pytest.mark.slow
@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_zoo_model_measured_and_estimated(name: str) -> None:
    entry = json.loads((ZOO / "zoo.json").read_text())[name]
    config, seq_len, batch = ZOO / f"{name}.json", entry["seq_len"], entry["batch"]
    facts = facts_from_hf_config(config, seq_len, precisions=("fp32",))
    path = facts.activations["fp32"].path or ""
    assert path.startswith(PATHS[:2]) or path.startswith(PATHS[2].split("{")[0]), path
    estimate = estimate_plan(facts, Plan(micro_batch=batch)).memory.peak
    with hf.model_source(None, hf_config=str(config), seq_len=seq_len) as source:
        record = profile(source.path, batch_size=batch, steps=1, warmup=1, device="cpu")
        reference = reference_step(source.path, batch)
    measured = record.memory.peak
    assert record.model.parameters == facts.parameters
    assert measured == pytest.approx(reference.peak, rel=0.02)
    bar = 0.08 if name in ESTIMATE_OUTSIDE_5 else 0.05
    assert estimate == pytest.approx(measured, rel=bar), path
