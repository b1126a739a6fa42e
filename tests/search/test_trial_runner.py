"""The runner contract, passed by the fake, the real (subprocess) and the pooled runner; timeouts; two ranks."""

from __future__ import annotations

import json
import math
import os
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from _models import mlp_stack, mlp_stack_parameters

from autotune.records import Plan
from autotune.runtime.trial.entry_points import ENTRY_POINTS
from autotune.search import PoolRunner, SubprocessRunner, TrialResult, TrialRunner, TrialSettings
from autotune.search._outcome import classify_outcome
from autotune.search._runner import FakeRunner

MODEL = mlp_stack(blocks=2, hidden=32)
PARAMETERS = mlp_stack_parameters(blocks=2, hidden=32)

HANG = textwrap.dedent(
    """
    import os, subprocess, sys, time
    import torch

    def build_model():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.environ["GRANDCHILD_PID_FILE"], "w") as f:
            f.write(str(child.pid))
        time.sleep(600)

    def build_batch(batch_size):
        return torch.zeros(batch_size, 1)
    """
)


def fake_behaviour(plan: Plan, settings: TrialSettings) -> TrialResult | str:
    """What the real worker does, faked: hang.py hangs; the peak grows with the micro-batch."""
    if settings.model_file.endswith("hang.py"):
        return "timeout"
    steps = settings.warmup + settings.steps
    peaks = [1000 * plan.micro_batch] * plan.world_size
    return TrialResult(completed_steps=steps, samples_per_s=5.0, step_time=plan.global_batch / 5.0,
                       peak_memory_bytes=peaks, peak_source="fake", loss_first=1.0, loss_last=0.9,
                       device_memory=settings.device_memory)  # fmt: skip


@pytest.fixture(params=["fake", "subprocess", "pool"])
def runner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TrialRunner]:
    if request.param == "fake":
        yield FakeRunner(fake_behaviour)
    elif request.param == "subprocess":
        yield SubprocessRunner(
            entry_points=ENTRY_POINTS, env={"OMP_NUM_THREADS": "1"}, workdir=tmp_path / "trials"
        )
    else:
        with PoolRunner(
            entry_points=ENTRY_POINTS, env={"OMP_NUM_THREADS": "1"}, workdir=tmp_path / "trials"
        ) as pool:
            yield pool


@pytest.fixture
def model(tmp_path: Path) -> str:
    path = tmp_path / "mlp.py"
    path.write_text(MODEL)
    return str(path)


def _settings(model: str, **kw: object) -> TrialSettings:
    values: dict[str, object] = {"steps": 2, "warmup": 1, "device": "cpu", "timeout_s": 120, **kw}
    return TrialSettings(model_file=model, **values)  # type: ignore[arg-type]


def test_contract_ok(runner: TrialRunner, model: str) -> None:
    plan = Plan(micro_batch=2, grad_accum=2)
    report = runner.run(plan, _settings(model))
    result = report.result
    assert classify_outcome(report.returncode, report.timed_out, result, report.stderr_tail) == "ok"
    assert result is not None and result.completed_steps == 3
    assert result.samples_per_s is not None and result.samples_per_s > 0
    assert result.step_time is not None
    assert math.isclose(result.samples_per_s, plan.global_batch / result.step_time, rel_tol=1e-6)
    assert len(result.peak_memory_bytes) == 1 and result.peak is not None and result.peak > 0
    assert result.peak_source is not None
    assert result.loss_first is not None and math.isfinite(result.loss_first)
    if isinstance(runner, SubprocessRunner):
        # Judged on the profile's own CPU measure (c10's allocator); RSS growth kept beside it.
        assert result.peak_source == "cpu_allocator"
        assert result.live_tensor_bytes == result.peak_memory_bytes
        assert len(result.rss_delta_bytes) == 1
        # At least the parameters, gradients and Adam's two states, 4 floats per parameter.
        assert result.peak >= 4 * 4 * PARAMETERS


@pytest.mark.slow
def test_trial_peak_matches_the_profilers(examples_dir: Path, tmp_path: Path) -> None:
    from autotune.runtime.profiler import profile

    model = str(examples_dir / "tiny_llama.py")
    profiled = profile(model, batch_size=2, steps=1, warmup=1, device="cpu")
    runner = SubprocessRunner(
        entry_points=ENTRY_POINTS, env={"OMP_NUM_THREADS": "1"}, workdir=tmp_path / "trials"
    )
    report = runner.run(Plan(micro_batch=2), _settings(model, timeout_s=300))
    result = report.result
    assert result is not None and result.peak is not None, report.stderr_tail[-2000:]
    assert result.peak_source == profiled.memory.peak_source == "cpu_allocator"
    assert abs(result.peak - profiled.memory.peak) <= 0.05 * profiled.memory.peak
    # RSS growth (allocator caches, library memory) is the larger, different measure.
    assert result.rss_delta_bytes[0] > result.peak


def test_contract_peak_over_budget_is_oom(runner: TrialRunner, model: str) -> None:
    report = runner.run(Plan(micro_batch=4), _settings(model, device_memory=1))
    outcome = classify_outcome(
        report.returncode, report.timed_out, report.result, report.stderr_tail
    )
    assert outcome == "oom"
    assert report.result is not None and report.result.device_memory == 1


def test_contract_hang_is_a_timeout(
    runner: TrialRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hang = tmp_path / "hang.py"
    hang.write_text(HANG)
    pid_file = tmp_path / "grandchild.pid"
    monkeypatch.setenv("GRANDCHILD_PID_FILE", str(pid_file))
    start = time.monotonic()
    report = runner.run(Plan(), _settings(str(hang), timeout_s=20))
    assert (
        classify_outcome(report.returncode, report.timed_out, report.result, report.stderr_tail)
        == "timeout"
    )
    assert report.result is None or report.result.completed_steps == 0
    if isinstance(runner, SubprocessRunner):
        assert time.monotonic() - start < 120  # killed, not waited out (600 s sleeps)
        grandchild = int(pid_file.read_text())
        assert _gone(grandchild), "the model's grandchild process outlived the timeout"


def _gone(pid: int) -> bool:
    for _ in range(50):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


COUNTING = MODEL + textwrap.dedent(
    """
    import os
    _mse = loss_fn

    def loss_fn(model, batch):
        with open(os.environ["LOSS_LOG"], "a") as log:
            log.write("1\\n")
        return _mse(model, batch)
    """
)


STUBBED_GPU = COUNTING + textwrap.dedent(
    """
    # a GPU's allocator, stubbed on this CPU: the trial reads this peak of its timed steps
    from autotune.runtime.trial import deepspeed_engine
    deepspeed_engine.cuda_peak = lambda device: 123_456_789
    """
)


@pytest.mark.slow
def test_one_rank_zero2_trial_peak_matches_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peak the warm-up step gives matches the estimate and the peak of one more, untimed
    step after the timed ones (``peak_step`` extra); a re-run that needs no peak
    (``measure_peak`` off) runs exactly the warm-up and the timed steps (the model's own loss
    calls counted) and reports none; so does a run whose device's allocator (a GPU's, stubbed)
    gives the peak where a step more would have measured it."""
    from autotune.estimator import estimate_plan, facts_from_profile
    from autotune.runtime.profiler import profile

    model, log = tmp_path / "counting.py", tmp_path / "losses"
    model.write_text(COUNTING)
    monkeypatch.setenv("LOSS_LOG", str(tmp_path / "profile-losses"))
    facts = facts_from_profile(profile(model, batch_size=2, steps=1, warmup=1, device="cpu"))
    plan = Plan(zero_stage=2, micro_batch=2, grad_accum=2)
    predicted = estimate_plan(facts, plan).memory
    runner = SubprocessRunner(entry_points=ENTRY_POINTS, workdir=tmp_path / "trials",
                              env={"OMP_NUM_THREADS": "1", "LOSS_LOG": str(log)})  # fmt: skip
    report = runner.run(plan, _settings(str(model), timeout_s=300))
    result = report.result
    outcome = classify_outcome(report.returncode, report.timed_out, result, report.stderr_tail)
    assert outcome == "ok", report.stderr_tail[-2000:]
    assert result is not None and result.engine == "deepspeed" and result.peak is not None
    assert result.peak_source == "cpu_live_tensors"
    # The buckets are in the prediction and small: two fp32 buckets of the model's size
    # (rounded up to an even count), not DeepSpeed's default 2 x 2 GB.
    buckets = 2 * 4 * (PARAMETERS + PARAMETERS % 2)
    assert f"ZeRO gradient buckets of {buckets:,} bytes" in predicted.peak_composition
    assert abs(result.peak - predicted.peak) <= 0.10 * predicted.peak
    # 1 warm-up (its peak tracked) + 2 timed steps, 2 micro-batches each
    assert len(log.read_text().splitlines()) == 3 * 2
    log.unlink()
    extra = runner.run(plan, _settings(str(model), timeout_s=300, peak_step="extra")).result
    assert extra is not None and extra.peak is not None
    assert len(log.read_text().splitlines()) == 4 * 2  # one step more
    assert abs(extra.peak - result.peak) <= 0.005 * extra.peak
    log.unlink()
    again = runner.run(plan, _settings(str(model), timeout_s=300, measure_peak=False)).result
    assert again is not None and again.samples_per_s is not None and again.completed_steps == 3
    assert again.peak_memory_bytes == [] and again.peak is None and again.peak_source is None
    assert len(log.read_text().splitlines()) == 3 * 2
    # where the device's allocator gives the timed steps' peak, no step more is run for it
    log.unlink()
    gpu = tmp_path / "stubbed_gpu.py"
    gpu.write_text(STUBBED_GPU)
    stubbed = runner.run(plan, _settings(str(gpu), timeout_s=300, peak_step="extra")).result
    assert stubbed is not None and stubbed.samples_per_s is not None
    assert stubbed.peak_source == "cuda_max_allocated" and stubbed.peak_memory_bytes == [
        123_456_789
    ]
    assert stubbed.live_tensor_bytes == []
    assert len(log.read_text().splitlines()) == 3 * 2


def test_the_warmup_step_is_tracked_on_a_cpu_only_where_a_peak_is_wanted_from_it() -> None:
    import torch

    from autotune.records import WorkerSpec
    from autotune.runtime.trial.steps import MemoryWatch, Steps

    watch = MemoryWatch(None)

    def tracks(device: object, **kw: object) -> bool:
        spec = WorkerSpec(settings=_settings("model.py", **kw), plan=Plan(), result_path="r")
        return Steps(spec, lambda result: None, watch)._tracks_warmup(device)

    cpu = torch.device("cpu")
    try:
        assert tracks(cpu)
        assert not tracks(torch.device("cuda"))  # the allocator's peak of the timed steps
        assert not tracks(None)  # a ZeRO-3 engine: its first step prefetches nothing
        assert not tracks(cpu, warmup=0)  # the first step is timed
        assert not tracks(cpu, measure_peak=False)  # a re-run
        assert not tracks(cpu, peak_step="extra")
    finally:
        watch.stop()


@pytest.mark.slow
def test_two_rank_zero2_trial_on_cpu(model: str, tmp_path: Path) -> None:
    system_tmp = tmp_path / "system-tmp"  # the launches' temporary directory (TMPDIR)
    system_tmp.mkdir()
    cache = tmp_path / "cache"  # where the machine keeps its engines' costs, empty at first
    env = {"OMP_NUM_THREADS": "1", "TMPDIR": str(system_tmp), "AUTOTUNE_CACHE_DIR": str(cache)}
    runner = SubprocessRunner(entry_points=ENTRY_POINTS, env=env, workdir=tmp_path / "trials")
    plan = Plan(zero_stage=2, micro_batch=2, grad_accum=2, nproc_per_node=2)
    # the link's sweep also measures two engines' own costs (not this plan's: any engine runs
    # on the stack the group builds for it)
    settings = _settings(model, timeout_s=300, engine_costs=["deepspeed-3-bf16", "fsdp2-3-fp32"])
    report = runner.run(plan, settings)
    result = report.result
    outcome = classify_outcome(report.returncode, report.timed_out, result, report.stderr_tail)
    assert outcome == "ok", report.stderr_tail[-2000:]
    assert result is not None and result.engine == "deepspeed"
    assert len(result.peak_memory_bytes) == 2 and all(p > 0 for p in result.peak_memory_bytes)
    # The tracker follows engine.backward/engine.step; its peak includes ZeRO's two gradient
    # buckets, sized to the model (two fp32 buckets of its size), not DeepSpeed's 2 x 2 GB.
    assert all(p < 1_000_000 for p in result.peak_memory_bytes)
    assert result.peak_source == "cpu_live_tensors"
    assert result.live_tensor_bytes == result.peak_memory_bytes
    assert len(result.rss_delta_bytes) == 2 and all(r > 0 for r in result.rss_delta_bytes)
    assert result.samples_per_s is not None and 0 < result.samples_per_s < 1e6
    assert result.completed_steps == 3 and len(result.step_times) == 2
    assert result.loss_first is not None and result.loss_last is not None
    assert math.isfinite(result.loss_first) and math.isfinite(result.loss_last)
    assert os.environ.get("RANK") is None  # the rank env went to the children only
    # the link between the ranks, swept after the steps: every collective at every size, each
    # point's median inside its own repeats' range, and a fit with a positive bandwidth
    link = result.link
    assert link is not None and link.world_size == 2 and link.backend == "gloo"
    assert {p.collective for p in link.points} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert all(p.low <= p.seconds <= p.high for p in link.points)
    # past 4 MiB the sweep grows while a call takes under 50 ms: the open loopback moves 4 MiB
    # in a few ms (4-8 on a 2-core CPU), so it grew, every collective at every size
    sizes = {p.nbytes for p in link.points}
    assert max(sizes) > 4 * 2**20 and len(link.points) == 3 * len(sizes)
    # a collective whose points do not grow with size on this fast, noisy loopback (a
    # reduce-scatter once ranged 3.5-35 ms at 4 MiB) gets no fit of its own: the fit of all
    # the points times it
    assert link.bandwidth_bytes_per_s > 0 and link.collectives
    assert set(link.collectives) <= {"all_reduce", "all_gather", "reduce_scatter"}
    # each engine asked for, on its stacks: DeepSpeed's two of one-matrix 8x8 blocks and one
    # of two wide matrices, FSDP2's a fourth of 4 blocks of 8 matrices besides; the wide ones
    # 1024 wide, as two such hold this small model's parameters (2048 past 2.1M)
    assert PARAMETERS < 2 * 1024**2
    assert [c.engine for c in link.engine_costs] == ["deepspeed-3-bf16", "fsdp2-3-fp32"]
    assert [(c.blocks, c.per_block, c.width) for c in link.engine_costs] == [
        ([4, 16, 2], [1, 1, 1], [8, 8, 1024]), ([4, 16, 2, 4], [1, 1, 1, 8], [8, 8, 1024, 8])]  # fmt: skip
    assert all(c.steps == 4 and math.isfinite(c.micro_fixed_s + c.step_fixed_s)
               for c in link.engine_costs)  # fmt: skip
    # measured, not read: the machine kept them, in the one file under the cache folder
    assert link.engine_costs_kept == [] and link.engine_costs_file is not None
    (kept,) = (cache / "engine-costs").iterdir()
    assert str(kept) == link.engine_costs_file
    assert json.loads(kept.read_text())["engine_costs"] == [
        c.model_dump(mode="json") for c in link.engine_costs]  # fmt: skip
    # a run of a study that has its link and the plan's peak (a comparison's re-run): neither
    # is measured again, the steps are
    again = runner.run(plan, settings.model_copy(update={"measure_peak": False,
                                                         "sweep_link": False})).result  # fmt: skip
    assert again is not None and again.completed_steps == 3 and again.samples_per_s
    assert again.link is None and again.peak_memory_bytes == [] and again.peak_source is None
    # a link known already (a bench's, kept with its measurements): the ranks sweep nothing new,
    # and the link they report is that one, with the engines' costs this machine kept for such a
    # link (of the same order of bandwidth), read from the file, none measured again; an FSDP2
    # trial this time, whose model's size picks the same width, so the same file
    known = link.model_copy(update={"engine_costs": [], "engine_costs_file": None,
                                    "latency_s": 0.25})  # fmt: skip
    fsdp2 = plan.with_changes(engine="fsdp2")
    told = runner.run(fsdp2, settings.model_copy(update={"measure_peak": False,
                                                         "engine_costs": ["fsdp2-3-fp32"],
                                                         "known_link": known})).result  # fmt: skip
    assert told is not None and told.engine == "fsdp2" and told.link is not None
    assert told.link.model_copy(update={"engine_costs": [], "engine_costs_kept": [],
                                        "engine_costs_file": None}) == known  # fmt: skip
    assert told.link.engine_costs == [link.engine_costs[1]]
    assert told.link.engine_costs_kept == ["fsdp2-3-fp32"]
    assert told.link.engine_costs_file == str(kept)
    # torchrun's log folders went with the trials' own: none left in the temporary directory
    assert not list(system_tmp.glob("torchelastic_*")), list(system_tmp.iterdir())


FLAKY_WORKER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    spec = json.loads(Path(sys.argv[1]).read_text())
    counter = Path(os.environ["LAUNCH_COUNTER"])
    launches = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(launches))
    if launches == 1:
        sys.stderr.write("torch.distributed.DistNetworkError: The server socket has failed to listen "
                         "on any local network address. port: 29500 (errno: 98 - Address already in use)\\n")
        sys.exit(1)
    result = {"completed_steps": 2, "samples_per_s": 1.0, "peak_memory_bytes": [1], "engine": "none"}
    Path(spec["result_path"]).write_text(json.dumps(result))
    """
)


def test_launch_failing_before_its_first_step_is_retried(tmp_path: Path) -> None:
    worker = tmp_path / "flaky_worker.py"
    worker.write_text(FLAKY_WORKER)
    counter = tmp_path / "launches"
    runner = SubprocessRunner(
        entry_points=replace(ENTRY_POINTS, worker=str(worker)), env={"LAUNCH_COUNTER": str(counter)}
    )
    report = runner.run(Plan(), _settings(str(worker)))
    assert report.launches == 2 and counter.read_text() == "2"
    assert (
        classify_outcome(report.returncode, report.timed_out, report.result, report.stderr_tail)
        == "ok"
    )
    # A plan that fails for its own reasons is not relaunched.
    worker.write_text("import sys; sys.stderr.write('ValueError: bad model\\n'); sys.exit(1)\n")
    report = runner.run(Plan(), _settings(str(worker)))
    assert report.launches == 1
    assert (
        classify_outcome(report.returncode, report.timed_out, report.result, report.stderr_tail)
        == "crash"
    )


def test_memory_guard_stops_a_worker_and_reads_as_oom(model: str, tmp_path: Path) -> None:
    runner = SubprocessRunner(
        entry_points=ENTRY_POINTS, env={"OMP_NUM_THREADS": "1"}, workdir=tmp_path / "trials"
    )
    report = runner.run(Plan(micro_batch=2), _settings(model, memory_guard=1))
    assert "autotune memory guard" in report.stderr_tail
    assert (
        classify_outcome(report.returncode, report.timed_out, report.result, report.stderr_tail)
        == "oom"
    )
