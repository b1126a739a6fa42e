"""CUDA-only paths of the device seam: NVML sampling, the peak table, capabilities (skipped without a GPU)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_nvml_samples_utilisation_and_memory_while_the_gpu_works() -> None:
    import torch

    from autotune.runtime.device import NvmlSampler

    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    with NvmlSampler(device, interval=0.01) as sampler:
        for _ in range(200):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    sample = sampler.result()
    assert sample is not None, sampler.reason
    assert sample.samples >= 2
    assert sample.memory_used_bytes >= a.numel() * a.element_size()
    assert 0 <= sample.gpu_utilization_percent <= 100


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_peak_flops_come_from_the_table_and_bound_a_measured_matmul(dtype: str) -> None:
    import torch

    from autotune.runtime.device import matmul_flops, peak_flops

    device = torch.device("cuda")
    value, source, reason = peak_flops(device, dtype)
    if value is None:
        pytest.skip(f"GPU not in the peak table: {reason}")
    assert source == "table"
    measured = matmul_flops(device, torch.bfloat16 if dtype == "bf16" else torch.float16)
    assert 0.1 * value < measured <= 1.05 * value  # a real matmul reaches a fair share, never more


def test_capabilities_report_compute_capability_and_fast_bf16() -> None:
    import torch

    from autotune.runtime.device import device_capabilities

    caps = device_capabilities(torch.device("cuda"))
    major, minor = torch.cuda.get_device_capability()
    assert caps.compute_capability == f"{major}.{minor}"
    assert caps.fp16_supported
    if major >= 8:  # Ampere and newer: bf16 tensor cores beat fp32
        assert caps.bf16_supported and caps.bf16_fp32_speed_ratio is not None
        assert caps.bf16_fp32_speed_ratio > 1


def test_flash_attn_detection_matches_a_real_import() -> None:
    from autotune.runtime.device import flash_attn_available

    try:
        import flash_attn  # noqa: F401

        imported = True
    except Exception:
        imported = False
    assert flash_attn_available() is imported
