"""Issue 34 in the profiler: a bf16/fp32 matmul ratio outside its physical range is measured once
more, then refused (None, with the reason) and flagged; a sane second measurement is kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.estimator import BF16_RATIO_FIGURE
from autotune.runtime import _device as dev
from autotune.runtime import profiler
from autotune.runtime.profiler import profile

CPU = torch.device("cpu")


def _fake_matmuls(monkeypatch: pytest.MonkeyPatch, bf16_rates: list[float]) -> list[torch.dtype]:
    """``matmul_flops`` at 1 TFLOP/s in fp32 and the next of ``bf16_rates`` in bf16; the calls."""
    calls: list[torch.dtype] = []

    def matmul_flops(device: torch.device, dtype: torch.dtype) -> float:
        calls.append(dtype)
        if dtype != torch.bfloat16:
            return 1e12
        return bf16_rates.pop(0) if len(bf16_rates) > 1 else bf16_rates[0]

    monkeypatch.setattr(dev, "matmul_flops", matmul_flops)
    return calls


def test_an_impossible_ratio_twice_is_recorded_as_none_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, examples_dir: Path
) -> None:
    _fake_matmuls(monkeypatch, [56.7e12])
    record = profile(examples_dir / "mlp_dataloader.py", batch_size=4, steps=2, warmup=1,
                     device="cpu")  # fmt: skip
    assert record.environment.capabilities.bf16_fp32_speed_ratio is None
    why = record.environment.unavailable["capabilities.bf16_fp32_speed_ratio"]
    assert "refused after measuring twice (56.7x, 56.7x)" in why and "[0.001, 16]" in why
    assert record.flags[BF16_RATIO_FIGURE] == why


def test_a_possible_second_measurement_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_matmuls(monkeypatch, [56.7e12, 2.4e12])
    caps, refused = profiler._capabilities(CPU)
    assert caps.bf16_fp32_speed_ratio == pytest.approx(2.4) and refused is None
    assert calls.count(torch.bfloat16) == 2


def test_a_possible_first_measurement_is_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_matmuls(monkeypatch, [2.4e12])
    caps, refused = profiler._capabilities(CPU)
    assert caps.bf16_fp32_speed_ratio == pytest.approx(2.4) and refused is None
    assert calls.count(torch.bfloat16) == 1
