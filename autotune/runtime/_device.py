"""The one seam to the device: resolving it, its capabilities, its peak FLOP/s, NVML sampling."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import threading
import time
from typing import Any, NamedTuple

import torch

from autotune.estimator import table_peak_flops
from autotune.records import AutotuneError, Capabilities, NvmlSample

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        AutotuneError: CUDA asked for but not available, or an unknown name.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise AutotuneError(
            f"--device: unknown device {name!r} (auto, cpu, cuda, cuda:N)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AutotuneError(
            f"--device {name}: CUDA is not available (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda})"
        )
    if device.type not in ("cpu", "cuda"):
        raise AutotuneError(f"--device: {name!r} is not supported (auto, cpu, cuda, cuda:N)")
    return device


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a timer read after it is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new allocator peak on a CUDA device (a no-op elsewhere)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def allocator_peak(device: torch.device) -> tuple[int, int] | None:
    """``(max allocated, max reserved)`` bytes since the last reset, on a CUDA device.

    Allocated is what tensors held at the worst moment; reserved is what the caching
    allocator took from the driver (allocated plus its fragmentation and cache).

    Returns:
        ``None`` off CUDA: there the peak is counted from live tensors instead.
    """
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))


def blas_workspace(device: torch.device) -> int:
    """Bytes the device's matmul libraries hold once a training step has run one matmul forward
    and one backward: cuBLAS's workspace per (handle, stream), allocated through torch's caching
    allocator on first use, so in ``torch.cuda.max_memory_allocated`` but in no tensor. The
    backward runs on autograd's own thread for the device, whose handle gets a workspace of its
    own. Measured: the workspaces are cleared, a small linear layer's forward and backward run
    in fp32 and in bf16, every tensor is dropped, and what stays allocated is the answer
    (2 x 32 MiB with a little more on an H200 under torch 2.11). 0 off CUDA."""
    if device.type != "cuda":
        return 0
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    torch.cuda.synchronize(device)
    if clear is not None:
        clear()
    before = torch.cuda.memory_allocated(device)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(64, 64, device=device, dtype=dtype)
        weight = torch.randn(64, 64, device=device, dtype=dtype, requires_grad=True)
        bias = torch.zeros(64, device=device, dtype=dtype, requires_grad=True)
        torch.nn.functional.linear(x, weight, bias).sum().backward()
        del x, weight, bias
    torch.cuda.synchronize(device)
    return max(0, int(torch.cuda.memory_allocated(device)) - int(before))


def device_name(device: torch.device) -> str:
    """Human name of the device (GPU model, or the CPU's)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def device_count(device: torch.device) -> int:
    """Devices of this type visible to the process."""
    return torch.cuda.device_count() if device.type == "cuda" else 1


def device_memory(device: torch.device) -> int | None:
    """Total memory of the device in bytes (host RAM for the CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def flash_attn_available() -> bool:
    """Whether ``flash_attn`` really imports (a hollow install does not)."""
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        import flash_attn  # noqa: F401
    except Exception:
        return False
    return True


def device_capabilities(device: torch.device) -> Capabilities:
    """What the policy needs to know about the device, partly measured."""
    if device.type == "cuda":
        bf16 = bool(torch.cuda.is_bf16_supported())
        major, minor = torch.cuda.get_device_capability(device)
        capability: str | None = f"{major}.{minor}"
        fp16 = major >= 6
    else:
        # CPU autocast runs bf16 (speed measured below); DeepSpeed refuses fp16 on CPU.
        bf16, fp16, capability = True, False, None
    ratio = None
    if bf16:
        fp32_rate = matmul_flops(device, torch.float32)
        bf16_rate = matmul_flops(device, torch.bfloat16)
        ratio = bf16_rate / fp32_rate if fp32_rate > 0 else None
    return Capabilities(
        bf16_supported=bf16,
        fp16_supported=fp16,
        bf16_fp32_speed_ratio=ratio,
        sdpa_available=hasattr(torch.nn.functional, "scaled_dot_product_attention"),
        flash_attn_available=flash_attn_available(),
        compute_capability=capability,
    )


_MATMUL_CACHE: dict[tuple[str, torch.dtype], float] = {}


def matmul_flops(device: torch.device, dtype: torch.dtype, seconds: float = 0.1) -> float:
    """Measured FLOP/s of a square matmul in ``dtype`` (best of repeats, cached)."""
    key = (str(device), dtype)
    if key in _MATMUL_CACHE:
        return _MATMUL_CACHE[key]
    # Small on CPU: without AVX512-BF16 a bf16 matmul runs ~100x slower than fp32.
    size = 4096 if device.type == "cuda" else 256
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.matmul(a, b)
    synchronize(device)
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == float("inf"):
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    _MATMUL_CACHE[key] = 2 * size**3 / best
    return _MATMUL_CACHE[key]


def forget_matmuls(device: torch.device) -> None:
    """Drop the cached matmul rates of ``device``, so the next :func:`matmul_flops` measures again."""
    for key in [key for key in _MATMUL_CACHE if key[0] == str(device)]:
        del _MATMUL_CACHE[key]


def peak_flops(device: torch.device, dtype: str) -> tuple[float | None, str | None, str | None]:
    """Peak FLOP/s for ``dtype`` (``fp32``/``bf16``/``fp16``).

    Returns:
        ``(value, source, reason)``: source ``"table"`` for a known GPU,
        ``"measured_matmul"`` on the CPU; value ``None`` with a reason otherwise.
    """
    if device.type == "cpu":
        # Autocast on CPU runs some ops in fp32 whatever the dtype: the faster of the two
        # matmuls bounds what the step can reach.
        rate = max(matmul_flops(device, _DTYPES[dtype]), matmul_flops(device, torch.float32))
        return rate, "measured_matmul", None
    name = device_name(device)
    value = table_peak_flops(name, dtype)
    if value is not None:
        return value, "table", None
    return None, None, f"{name!r} is not in the table of known GPU peaks (no dense {dtype} peak)"


def versions() -> dict[str, str | None]:
    """torch, CUDA and DeepSpeed versions (DeepSpeed not imported: it prints on import)."""
    try:
        deepspeed: str | None = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        deepspeed = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "deepspeed": deepspeed}


PCIE_LANE_GBPS = {1: 2.0, 2: 4.0, 3: 7.877, 4: 15.754, 5: 31.508, 6: 60.5}
"""Usable Gbit/s of one PCIe lane, one direction, by generation (the line rate less its
encoding: 8b/10b to generation 2, 128b/130b from 3, FLIT from 6)."""


class Links(NamedTuple):
    """What NVML reads of a GPU's own links (``None`` where it could not; ``reason`` says why)."""

    memory_bytes_per_s: float | None
    """Device memory bandwidth: the maximum memory clock x 2 (double data rate) x bus width."""
    pcie_gbps: float | None
    """Host link, Gbit/s one way: the link's maximum generation and width as NVML reports them."""
    reason: str | None


def _nvml_handle(device: torch.device) -> tuple[Any, str | None]:
    """NVML's handle of a CUDA device, or ``None`` and why NVML cannot give one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        return pynvml.nvmlDeviceGetHandleByIndex(index), None
    except Exception as exc:  # NVMLError_LibraryNotFound and friends
        return None, f"NVML unavailable: {type(exc).__name__}: {exc}"


def nvml_links(device: torch.device) -> Links:
    """The device's memory bandwidth and PCIe link, read from NVML (a CUDA device only)."""
    if device.type != "cuda":
        return Links(None, None, "not a CUDA device")
    handle, unavailable = _nvml_handle(device)
    if handle is None:
        return Links(None, None, unavailable)
    import pynvml

    memory = pcie = None
    reasons = []
    try:
        clock_hz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM) * 1e6
        memory = 2 * clock_hz * pynvml.nvmlDeviceGetMemoryBusWidth(handle) / 8
    except Exception as exc:  # NVML_ERROR_NOT_SUPPORTED on some virtual GPUs
        reasons.append(f"memory bandwidth: {type(exc).__name__}: {exc}")
    try:
        generation = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)
        width = pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
        lane = PCIE_LANE_GBPS.get(generation)
        if lane is None or width <= 0:
            reasons.append(f"PCIe: generation {generation} x{width} not known")
        else:
            pcie = lane * width
    except Exception as exc:
        reasons.append(f"PCIe: {type(exc).__name__}: {exc}")
    return Links(memory or None, pcie, "; ".join(reasons) or None)


class NvmlSampler:
    """Samples GPU utilisation and memory in use on a thread while measured steps run."""

    def __init__(self, device: torch.device, interval: float = 0.05) -> None:
        self.device = device
        self.interval = interval
        self.reason: str | None = None
        self._samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None

    def __enter__(self) -> NvmlSampler:
        if self.device.type != "cuda":
            self.reason = "no NVIDIA GPU in use (device is cpu)"
            return self
        self._handle, self.reason = _nvml_handle(self.device)
        if self._handle is None:
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        import pynvml

        while not self._stop.is_set():
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(self._handle)
                mem = pynvml.nvmlDeviceGetMemoryInfo(self._handle)
            except Exception as exc:  # NVML_ERROR_NOT_SUPPORTED on some virtual GPUs
                self.reason = f"NVML sampling failed: {type(exc).__name__}: {exc}"
                return
            self._samples.append((float(util.gpu), int(mem.used)))
            self._stop.wait(self.interval)

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def result(self) -> NvmlSample | None:
        """Mean utilisation and the most memory in use seen, or ``None`` (see ``reason``)."""
        if not self._samples:
            if self.reason is None:
                self.reason = "NVML gave no samples (steps too short)"
            return None
        utils = [u for u, _ in self._samples]
        return NvmlSample(
            gpu_utilization_percent=sum(utils) / len(utils),
            memory_used_bytes=max(m for _, m in self._samples),
            samples=len(self._samples),
        )
