"""bf16 plans from an fp32 profile: the traced 16-bit activations against a real bf16 forward, and a
2-rank DeepSpeed bf16 trial's peak against the estimate (``bench/bf16_peaks.py``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.runtime import _memory as mem
from autotune.runtime.modelfile import load_model_file
from autotune.runtime.trace import traced_activations

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "tiny_llama.py"


def _saved_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    with mem.count_saved_tensors(model) as saved:
        loss = model(**batch).loss
    del loss
    return saved.activations


@pytest.mark.slow
def test_traced_bf16_activations_are_what_a_real_bf16_forward_saves() -> None:
    """Not fp32's halved: the Llama keeps its RMSNorm and loss inputs in fp32 (18 % more)."""
    spec = traced_activations(LLAMA, ("bf16",))["bf16"]
    model_file = load_model_file(LLAMA)
    torch.manual_seed(0)
    model = model_file.build_model().train()
    batch = model_file.module.build_batch(2)
    fp32 = _saved_bytes(model, batch)
    model = model.to(torch.bfloat16)
    for b in (1, 2):
        real = _saved_bytes(model, model_file.module.build_batch(b))
        assert spec.fixed + spec.per_sample * b == real
    assert spec.fixed + 2 * spec.per_sample > 1.1 * fp32 / 2
    assert spec.source == "traced" and spec.path
    # its loss upcasts the logits (transformers' ForCausalLMLoss): backward's buffers stay fp32,
    # as the 2-rank bf16 trials measured (bench/RESULTS.md "bf16 plans")
    assert spec.temporaries_vs_fp32 == 1.0


@pytest.mark.slow
def test_two_rank_deepspeed_bf16_plans_are_predicted_within_5_percent_of_the_trials_peak() -> None:
    """The trial's own live-tensor measure in each rank (what ``tune`` decides fit on), from a
    single fp32 profile plus the bf16 activations traced on fake tensors."""
    plans = ["stage=0,mb=2,precision=bf16", "stage=3,mb=2,precision=bf16"]
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bf16_peaks.py"), str(LLAMA), "--plans", *plans],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"\| (\S+) \| \d \| ([0-9.]+) \(\w+\) \| [0-9.]+ \([^)]*\) \| ([0-9.]+) ",
                      done.stdout)  # fmt: skip
    assert len(rows) == 2 * len(plans), done.stdout
    for _, measured, predicted in rows:
        assert float(measured) * 0.95 <= float(predicted) <= float(measured) * 1.05, done.stdout
