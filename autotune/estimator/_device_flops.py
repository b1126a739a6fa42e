"""Dense peak FLOP/s of known GPUs by dtype: the one table the profiler's MFU and the claim check read;
and the cuBLAS workspace a GPU step holds where no GPU is here to measure it.

Vendor datasheets, SXM parts unless named, no sparsity. Pure data and a lookup, no torch.
"""

from __future__ import annotations

import re

from autotune.records import AutotuneError

DENSE_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("H800", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    ("A800", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),
    ("A10", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
    ("L4", {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12}),
    ("V100", {"fp16": 125e12, "fp32": 15.7e12}),
    ("T4", {"fp16": 65e12, "fp32": 8.1e12}),
    ("RTX 4090", {"bf16": 165e12, "fp16": 165e12, "fp32": 82.6e12}),
    ("RTX 3090", {"bf16": 71e12, "fp16": 71e12, "fp32": 35.6e12}),
)
"""``(name, {dtype: FLOP/s})``, first match wins (so ``H100 PCIe`` precedes ``H100``).
A dtype a GPU has no fast path for (bf16 before Ampere) is absent."""

PEAK_DTYPE = {
    "fp32": "fp32",
    "amp_bf16": "bf16",
    "bf16": "bf16",
    "amp_fp16": "fp16",
    "fp16": "fp16",
}
"""The peak that bounds a plan precision's matmuls (autocast computes in the 16-bit type)."""


def table_peak_flops(device_name: str, dtype: str) -> float | None:
    """The dense peak of the first table entry named in ``device_name`` (case-insensitive).

    Returns:
        FLOP/s, or ``None`` when the device is not in the table or lacks ``dtype``.
    """
    name = device_name.lower()
    for key, peaks in DENSE_PEAKS:
        if key.lower() in name:
            return peaks.get(dtype)
    return None


def device_peak_flops(device_name: str, dtype: str, flag: str = "device") -> float:
    """:func:`table_peak_flops` for a name the user typed, e.g. ``A100``.

    Raises:
        AutotuneError: naming ``flag`` when the device is unknown or has no ``dtype`` peak.
    """
    name = device_name.strip().lower()
    for key, peaks in DENSE_PEAKS:
        if key.lower() in name:
            if dtype not in peaks:
                have = ", ".join(sorted(peaks))
                raise AutotuneError(f"{flag}={device_name}: no dense {dtype} peak (has {have})")
            return peaks[dtype]
    known = ", ".join(key for key, _ in DENSE_PEAKS)
    raise AutotuneError(f"{flag}={device_name}: not in the table of GPU peaks (known: {known})")


CUBLAS_DEFAULT_WORKSPACE = 32 * 2**20
"""torch's default cuBLAS workspace per handle and stream on compute capability 9.x, 10.x and
12.x (Hopper, Blackwell): ``:4096:8``; older GPUs get ``:4096:2:16:8``, 8.125 MiB
(``aten/src/ATen/cuda/CublasHandlePool.cpp``)."""
WORKSPACE_HANDLES = 2
"""Handles a training step's matmuls run on: the calling thread's (forward) and autograd's own
thread for the device (backward), each with its workspace: 2 x 32 MiB and 0.5 MiB more were in
every allocator peak on an H200 under torch 2.11 (bench/RESULTS-gpu.md's zoo)."""


def assumed_cublas_workspace(config: str | None) -> tuple[int, str]:
    """The cuBLAS workspace a step on a GPU this machine lacks holds, with where the figure came
    from: ``config`` (``CUBLAS_WORKSPACE_CONFIG``, ``:KiB:COUNT`` pairs) where set, else torch's
    default for current GPUs, per handle, for both handles of a step.

    Raises:
        AutotuneError: ``config`` set but not ``:KiB:COUNT`` pairs.
    """
    if config is None:
        per_handle = CUBLAS_DEFAULT_WORKSPACE
        why = "torch's default on compute capability 9.x-12.x"
    else:
        pairs = re.findall(r":(\d+):(\d+)", config)
        if not pairs or "".join(f":{a}:{b}" for a, b in pairs) != config.strip():
            raise AutotuneError(
                f"CUBLAS_WORKSPACE_CONFIG {config!r}: not ':KiB:COUNT' pairs (e.g. ':4096:8')"
            )
        per_handle = sum(int(size) * 1024 * int(count) for size, count in pairs)
        why = f"CUBLAS_WORKSPACE_CONFIG={config}"
    return WORKSPACE_HANDLES * per_handle, (
        f"assumed: {WORKSPACE_HANDLES} handles (forward, autograd's thread) x "
        f"{per_handle / 2**20:.3g} MiB, {why}; no GPU here to measure"
    )
