"""Every CUDA-only branch of the runtime, run on the CPU with the CUDA calls stubbed.

The stubs stand in for the driver: each test checks that autotune takes the
CUDA branch and passes the stub's figures through unchanged, or classifies the
stub's real exception type. ``tests/runtime/test_gpu.py`` runs the same paths
on a real GPU.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from _models import mlp_stack

from autotune.records import Plan, read_record
from autotune.runtime import _device as dev
from autotune.runtime import _memory as mem
from autotune.runtime import ab
from autotune.runtime._step import TrainRunner
from autotune.runtime.modelfile import load_model_file, rebuild_loader
from autotune.runtime.trial import steps as trial_steps
from autotune.runtime.trial import worker as trial_worker
from autotune.runtime.trial.entry_points import ENTRY_POINTS
from autotune.search import SubprocessRunner, TrialResult, TrialSettings, WorkerSpec
from autotune.search._outcome import classify_outcome

CUDA = torch.device("cuda", 0)
GiB = 1 << 30


class FakeCuda:
    """Records the ``torch.cuda`` calls autotune makes and answers them like a driver."""

    def __init__(self, allocated: int = 3 * GiB, reserved: int = 4 * GiB) -> None:
        self.allocated, self.reserved = allocated, reserved
        self.calls: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
        answers: dict[str, Any] = {
            "is_available": True,
            "synchronize": None,
            "reset_peak_memory_stats": None,
            "max_memory_allocated": self.allocated,
            "max_memory_reserved": self.reserved,
            "get_device_name": "NVIDIA H200",
            "device_count": 1,
            "current_device": 0,
            "get_device_properties": types.SimpleNamespace(total_memory=141 * GiB),
            "is_bf16_supported": True,
            "get_device_capability": (9, 0),
        }
        for name, answer in answers.items():
            monkeypatch.setattr(torch.cuda, name, self._answer(name, answer))
        return self

    def _answer(self, name: str, answer: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return answer

        return call


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda().install(monkeypatch)


def test_auto_resolves_to_cuda_when_a_gpu_is_visible(fake_cuda: FakeCuda) -> None:
    assert dev.resolve_device("auto") == torch.device("cuda")
    assert dev.resolve_device("cuda:0") == CUDA


def test_device_queries_go_to_the_driver_on_cuda_only(fake_cuda: FakeCuda) -> None:
    assert dev.device_name(CUDA) == "NVIDIA H200"
    assert dev.device_count(CUDA) == 1
    assert dev.device_memory(CUDA) == 141 * GiB
    dev.synchronize(CUDA)
    assert fake_cuda.calls == [
        "get_device_name", "device_count", "get_device_properties", "synchronize",
    ]  # fmt: skip
    fake_cuda.calls.clear()
    dev.synchronize(torch.device("cpu"))
    assert dev.device_count(torch.device("cpu")) == 1
    assert fake_cuda.calls == []


def test_allocator_peak_is_max_allocated_and_max_reserved_after_a_reset(
    fake_cuda: FakeCuda,
) -> None:
    dev.reset_peak_memory(CUDA)
    assert fake_cuda.calls == ["synchronize", "reset_peak_memory_stats"]
    assert dev.allocator_peak(CUDA) == (fake_cuda.allocated, fake_cuda.reserved)
    cpu = torch.device("cpu")
    fake_cuda.calls.clear()
    dev.reset_peak_memory(cpu)
    assert dev.allocator_peak(cpu) is None and fake_cuda.calls == []


@pytest.mark.parametrize(("capability", "fp16"), [((9, 0), True), ((8, 0), True), ((5, 2), False)])
def test_cuda_capabilities_come_from_the_driver(
    fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], fp16: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    rates = {torch.float32: 50e12, torch.bfloat16: 700e12}
    monkeypatch.setattr(dev, "matmul_flops", lambda device, dtype: rates[dtype])
    caps = dev.device_capabilities(CUDA)
    assert caps.compute_capability == f"{capability[0]}.{capability[1]}"
    assert caps.fp16_supported is fp16 and caps.bf16_supported
    assert caps.bf16_fp32_speed_ratio == pytest.approx(14.0)


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [("NVIDIA H200", "bf16", 989e12), ("NVIDIA H200", "fp32", 67e12),
     ("NVIDIA H100 PCIe", "bf16", 756e12), ("Tesla V100-SXM2-16GB", "bf16", None)],
)  # fmt: skip
def test_peak_flops_table_by_gpu_name(
    monkeypatch: pytest.MonkeyPatch, name: str, dtype: str, peak: float | None
) -> None:
    monkeypatch.setattr(dev, "device_name", lambda device: name)
    value, source, reason = dev.peak_flops(CUDA, dtype)
    assert value == peak
    assert (source, reason is None) == (("table", True) if peak else (None, False))


class FakeNvml(types.ModuleType):
    """A ``pynvml`` stand-in: utilisation and memory readings from fixed lists, cycled."""

    class NVMLError(Exception):
        pass

    def __init__(self, utils: list[int], used: list[int], fail: str | None = None) -> None:
        super().__init__("pynvml")
        self.utils, self.used, self.fail = utils, used, fail
        self.given: list[tuple[int, int]] = []
        self.index: int | None = None
        self._lock = threading.Lock()

    def nvmlInit(self) -> None:
        if self.fail == "init":
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.index = index
        return "handle"

    def _next(self) -> tuple[int, int]:
        if self.fail == "sample":
            raise self.NVMLError("Not Supported")
        with self._lock:
            n = len(self.given)
            reading = (self.utils[n % len(self.utils)], self.used[n % len(self.used)])
            self.given.append(reading)
        return reading

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        self._pending = self._next()
        return types.SimpleNamespace(gpu=self._pending[0])

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return types.SimpleNamespace(used=self._pending[1])


def _sample(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml, device: torch.device) -> Any:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with dev.NvmlSampler(device, interval=0.001) as sampler:
        while len(nvml.given) < 5 and nvml.fail is None:
            threading.Event().wait(0.001)
    return sampler


def test_nvml_sampler_averages_utilisation_and_keeps_the_most_memory(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: FakeCuda
) -> None:
    nvml = FakeNvml(utils=[40, 90, 65], used=[5 * GiB, 9 * GiB, 7 * GiB])
    sampler = _sample(monkeypatch, nvml, torch.device("cuda"))  # no index: the current device
    result = sampler.result()
    assert result is not None and nvml.index == 0 and "current_device" in fake_cuda.calls
    assert result.samples == len(nvml.given) >= 5
    assert result.gpu_utilization_percent == pytest.approx(
        sum(u for u, _ in nvml.given) / len(nvml.given)
    )
    assert result.memory_used_bytes == max(m for _, m in nvml.given)


@pytest.mark.parametrize(("fail", "reason"), [("init", "NVML unavailable: NVMLError: Driver Not Loaded"),
                                              ("sample", "NVML sampling failed: NVMLError: Not Supported")])  # fmt: skip
def test_nvml_failures_give_none_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, fail: str, reason: str
) -> None:
    sampler = _sample(monkeypatch, FakeNvml([1], [1], fail=fail), CUDA)
    assert sampler.result() is None and sampler.reason == reason


class LinkNvml(FakeNvml):
    """NVML as an H200 SXM answers for its links: HBM3e at 3201 MHz on a 6144-bit bus, PCIe
    generation 5 x16 (nvidia-smi's figures on the lent machine; the datasheet says 4.8 TB/s and
    128 GB/s both ways)."""

    NVML_CLOCK_MEM = 2

    def __init__(self, generation: int = 5, fail: str | None = None) -> None:
        super().__init__([1], [1], fail=fail)
        self.generation = generation

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> int:
        if self.fail == "memory":
            raise self.NVMLError("Not Supported")
        return {self.NVML_CLOCK_MEM: 3201}[clock]

    def nvmlDeviceGetMemoryBusWidth(self, handle: str) -> int:
        return 6144

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: str) -> int:
        return self.generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: str) -> int:
        return 16


def test_nvml_links_give_the_datasheets_memory_bandwidth_and_pcie_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", LinkNvml())
    links = dev.nvml_links(CUDA)
    assert links.reason is None
    assert links.memory_bytes_per_s == pytest.approx(4.8e12, rel=0.03)
    assert links.pcie_gbps == pytest.approx(128e9 / 2 * 8 / 1e9, rel=0.03)  # 512 Gbit/s one way


@pytest.mark.parametrize(("nvml", "memory", "reason"), [
    (LinkNvml(fail="init"), False, "NVML unavailable: NVMLError: Driver Not Loaded"),
    (LinkNvml(fail="memory"), False, "memory bandwidth: NVMLError: Not Supported"),
    (LinkNvml(generation=9), True, "PCIe: generation 9 x16 not known"),
])  # fmt: skip
def test_nvml_links_that_cannot_be_read_say_why(
    monkeypatch: pytest.MonkeyPatch, nvml: LinkNvml, memory: bool, reason: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    links = dev.nvml_links(CUDA)
    assert (links.memory_bytes_per_s is not None, links.reason) == (memory, reason)
    assert dev.nvml_links(torch.device("cpu")).reason == "not a CUDA device"


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.py"
    path.write_text(mlp_stack(blocks=2, width=16, hidden=32))
    return path


def _tracked_step(path: Path) -> mem.PeakResult:
    runner = TrainRunner(load_model_file(path), micro_batch=4)
    runner.step()  # optimizer states exist, as in the profiler's tracked step
    with mem.track_peak(runner.model, runner.optimizer, runner.device) as (tracker, out):
        loss = runner.forward(runner.next_batch())
        runner.backward(loss)
        del loss
        runner.optimizer_step()
    return out[0]


@pytest.mark.parametrize("excess", [5 * GiB, -1000])
def test_track_peak_takes_the_allocator_peak_and_reserved_on_cuda(
    monkeypatch: pytest.MonkeyPatch, mlp: Path, excess: int
) -> None:
    cpu = _tracked_step(mlp)
    assert cpu.source == "cpu_live_tensors" and cpu.cuda_reserved is None
    allocated = cpu.peak + excess
    monkeypatch.setattr(dev, "allocator_peak", lambda device: (allocated, allocated + GiB))
    monkeypatch.setattr(dev, "reset_peak_memory", lambda device: None)
    cuda = _tracked_step(mlp)
    parts = cuda.at_peak.model_dump()
    assert (cuda.source, cuda.peak, cuda.cuda_reserved) == (
        "cuda_max_allocated", allocated, allocated + GiB,
    )  # fmt: skip
    assert sum(parts.values()) == allocated  # the parts still add up to the allocator's peak
    assert min(parts.values()) >= 0
    if excess > 0:  # the allocator saw more than the live tensors: counted as temporaries
        assert parts["temporaries"] == cpu.at_peak.temporaries + excess


def test_profile_on_cuda_judges_fit_on_the_allocator_peak(
    monkeypatch: pytest.MonkeyPatch, mlp: Path
) -> None:
    from autotune.runtime.profiler import profile

    monkeypatch.setattr(dev, "allocator_peak", lambda device: (7 * GiB, 8 * GiB))
    record = profile(mlp, batch_size=2, steps=1, warmup=0, device="cpu")
    memory = record.memory
    assert (memory.peak, memory.cuda_reserved, memory.peak_source) == (
        7 * GiB, 8 * GiB, "cuda_max_allocated",
    )  # fmt: skip
    assert memory.fits_judged_on == "memory.peak (torch.cuda.max_memory_allocated)"


def test_ab_blocks_report_the_allocator_peak(monkeypatch: pytest.MonkeyPatch, mlp: Path) -> None:
    runner = TrainRunner(load_model_file(mlp), micro_batch=2)
    assert ab._block(runner, steps=1, settle=0)[2] is None
    resets: list[torch.device] = []
    monkeypatch.setattr(dev, "reset_peak_memory", resets.append)
    monkeypatch.setattr(dev, "allocator_peak", lambda device: (123, 456))
    assert ab._block(runner, steps=1, settle=0)[2] == 123 and resets == [runner.device]


def test_trial_peaks_prefer_the_allocator_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "allocator_peak", lambda device: (11 * GiB, 12 * GiB))
    assert trial_steps.cuda_peak(CUDA) == 11 * GiB
    watch = trial_worker.MemoryWatch(None)
    try:
        on_gpu = trial_worker._peaks({"cuda": 11 * GiB, "live": 9 * GiB}, watch)
        on_cpu = trial_worker._peaks({"cuda": None, "live": 9 * GiB}, watch)
    finally:
        watch.stop()
    assert (on_gpu["peak_memory_bytes"], on_gpu["peak_source"]) == (
        [11 * GiB],
        "cuda_max_allocated",
    )
    assert (on_cpu["peak_memory_bytes"], on_cpu["peak_source"]) == ([9 * GiB], "cpu_live_tensors")


OOM_MODEL = """
import torch

def build_model():
    return torch.nn.Linear(4, 1)

def build_batch(batch_size):
    return torch.randn(batch_size, 4)

def loss_fn(model, batch):
    if batch.shape[0] >= 4:  # what the CUDA caching allocator raises when a block does not fit
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
            "139.72 GiB of which 1.19 GiB is free."
        )
    return model(batch).pow(2).mean()
"""


@pytest.mark.parametrize(("micro_batch", "outcome"), [(4, "oom"), (2, "ok")])
def test_a_real_cuda_oom_exception_is_classified_oom(
    tmp_path: Path, micro_batch: int, outcome: str
) -> None:
    model = tmp_path / "oom.py"
    model.write_text(OOM_MODEL)
    settings = TrialSettings(model_file=str(model), steps=1, warmup=0, device="cpu")
    result_path = tmp_path / "result.json"
    spec = WorkerSpec(
        settings=settings, plan=Plan(micro_batch=micro_batch), result_path=str(result_path)
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    returncode = trial_worker.main([str(spec_path)])  # the worker's own entry, in this process
    result = read_record(result_path, TrialResult, "result")
    assert classify_outcome(returncode, False, result, "") == outcome
    if outcome == "oom":
        assert result.error is not None and result.error.startswith(
            "OutOfMemoryError: CUDA out of memory"
        )


def test_cuda_trials_put_deepspeed_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # as CPU CI and .ci/run export it
    runner = SubprocessRunner(entry_points=ENTRY_POINTS)
    plan = Plan(precision="bf16")
    for device, accelerator in [("cuda", "cuda"), ("cuda:0", "cuda"), ("cpu", "cpu")]:
        env = runner.child_env(plan, TrialSettings(model_file="m.py", device=device), 1234)
        assert env["DS_ACCELERATOR"] == accelerator


def test_pinned_memory_only_where_cuda_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    assert rebuild_loader(loader, 0, pin_memory=True).pin_memory is torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert rebuild_loader(loader, 0, pin_memory=True).pin_memory is True
    assert rebuild_loader(loader, 0, pin_memory=False).pin_memory is False


def test_deepspeed_import_on_a_gpu_machine_leaves_the_accelerator_to_deepspeed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.runtime.ds_validate import deepspeed_version

    assert deepspeed_version() is not None  # imported once, with the CPU accelerator
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert deepspeed_version() is not None
    assert "DS_ACCELERATOR" not in os.environ


@pytest.mark.parametrize(
    ("precision", "scaled"), [("fp16", True), ("bf16", False), ("fp32", False)]
)
def test_fp16_autocast_steps_through_a_dynamic_loss_scaler(
    mlp: Path, precision: str, scaled: bool
) -> None:
    runner = TrainRunner(load_model_file(mlp), micro_batch=2, precision=precision)  # type: ignore[arg-type]
    timing = runner.step()
    assert runner.scaler.is_enabled() is scaled
    if scaled:  # torch's GradScaler starts at 2**16 and halves on inf/NaN gradients
        assert 0 < runner.scaler.get_scale() <= 2.0**16
    assert timing.loss == timing.loss  # not NaN: the scaled step unscaled its gradients
