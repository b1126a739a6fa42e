"""One zoo model per family (transformers' own classes, tiny, random init, from ``examples/zoo``):
the measured peak against torch.profiler's memory timeline, and the pre-run estimate from the
config alone against the measured peak, through ``--hf-config``'s generated model file."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _memtracker import memtracker_peak
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
NO_ONEDNN = {"convnext"}
"""oneDNN's convolution scratch is no tensor: torch.profiler counts it, the live-tensor tracker
cannot (ConvNeXt's peak 59 % under the profiler's at batch 4, all of it an uncategorised
allocation); with oneDNN off the two agree within 1 %, so this row compares the two
instruments with oneDNN off (bench/RESULTS.md)."""
PROFILER_GAP = {"mamba"}
"""Rows where torch.profiler's timeline is not the reference: on Mamba's pure-PyTorch selective
scan it is 6-7 % under both the live-tensor tracker and torch's MemTracker, which agree within
0.1 % (bench/RESULTS.md); there the measured peak is held to MemTracker."""


@contextlib.contextmanager
def _kernels(name: str) -> Iterator[None]:
    if name in NO_ONEDNN:
        with torch.backends.mkldnn.flags(enabled=False):
            yield
    else:
        yield


@pytest.mark.slow
@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_zoo_model_measured_and_estimated(name: str) -> None:
    entry = json.loads((ZOO / "zoo.json").read_text())[name]
    config, seq_len, batch = ZOO / f"{name}.json", entry["seq_len"], entry["batch"]
    facts = facts_from_hf_config(config, seq_len, precisions=("fp32",))
    path = facts.activations["fp32"].path or ""
    assert path.startswith(PATHS[:2]) or path.startswith(PATHS[2].split("{")[0]), path
    estimate = estimate_plan(facts, Plan(micro_batch=batch)).memory.peak
    with hf.model_source(None, hf_config=str(config), seq_len=seq_len) as source, _kernels(name):
        record = profile(source.path, batch_size=batch, steps=1, warmup=1, device="cpu")
        reference = reference_step(source.path, batch)
        tracker = memtracker_peak(source.path, batch) if name in PROFILER_GAP else None
    measured = record.memory.peak
    assert record.model.parameters == facts.parameters
    if tracker is not None:
        assert measured == pytest.approx(tracker, rel=0.02)
        assert reference.peak < 0.98 * measured  # the gap is still there: revisit the row
    else:
        assert measured == pytest.approx(reference.peak, rel=0.02)
    assert estimate == pytest.approx(measured, rel=0.05), path
