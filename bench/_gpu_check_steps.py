"""The GPU check's steps: each runs autotune as a user would (CLI, trial worker) and keeps the figures.

Every step runs its work in child processes with a timeout that ends before the check's
deadline, so the check stops cleanly with what it has. A child is stopped with SIGINT first
(``autotune tune`` then fails its running trial and kills that trial's process group), then
SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from _gpu_check_report import Measured, PlanKey, PytestResult, Results

from autotune.records import Plan, ProfileRecord
from autotune.runtime.trial.entry_points import ENTRY_POINTS

LOG_TAIL = 15


@dataclass
class Done:
    """How one child process ended; ``returncode`` ``None`` means stopped at its timeout."""

    returncode: int | None
    stdout: str
    seconds: float
    log: Path


@dataclass
class Run:
    """One run of the check: its sizes, folders, deadline and the autotune command."""

    config: Any
    work: Path
    repo: Path
    smoke: bool
    deadline: float
    stopped: bool = False
    start: float = field(default_factory=time.monotonic)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Every child carries it in ``GPU_CHECK_RUN``: :meth:`sweep` finds what outlived its parent."""

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def model(self) -> Path:
        return self.repo / "bench" / "gpu_check_model.py"

    def layers(self) -> int:
        import gpu_check_model

        return int(gpu_check_model.SHAPES[self.config.model]["num_hidden_layers"])

    def child_env(self) -> dict[str, str]:
        """What every child inherits: the model size, the accelerator, this autotune."""
        path = [str(self.repo), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
        env = {"GPU_CHECK_MODEL": self.config.model, "PYTHONUNBUFFERED": "1", "GPU_CHECK_RUN": self.run_id,
               "DS_ACCELERATOR": self.config.device, "PYTHONPATH": ":".join(path)}  # fmt: skip
        if self.smoke:
            env["OMP_NUM_THREADS"] = "1"  # a shared CPU: one thread per child
        else:
            env["GPU_CHECK_INIT_DEVICE"] = self.config.device
        return env

    def plans(self) -> list[PlanKey]:
        """The profiled plans: each micro-batch with none and every block checkpointed."""
        return [PlanKey(precision, mb, ckpt) for precision in ("amp_bf16", "bf16")
                for mb in self.config.micro_batches for ckpt in (0, self.layers())]  # fmt: skip

    def command(
        self, name: str, cmd: list[str], cap: float, env: dict[str, str] | None = None
    ) -> Done:
        """Run ``cmd`` (its stderr to ``work/NAME.log``) until done, ``cap`` or the deadline."""
        timeout = max(1.0, min(cap, self.left() - 5))
        log = self.work / f"{name}.log"
        start = time.monotonic()
        with log.open("w") as err:
            # SIGINT at its default in the child even when this check runs in the background,
            # where the shell starts it with SIGINT ignored and _stop's SIGINT would do nothing
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=self.repo,
                                    env=env, start_new_session=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
            try:
                out, _ = proc.communicate(timeout=timeout)
                code: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                _stop(proc)
                self.sweep()
                out, _ = proc.communicate()
                code = None
                self.stopped = self.stopped or self.left() < 10
            except BaseException:  # SIGINT or SIGTERM to the check: the child cleans up first
                _stop(proc)
                raise
        return Done(code, out or "", time.monotonic() - start, log)

    def sweep(self) -> list[int]:
        """SIGKILL every process of this run still alive (trial workers run in their own sessions,
        so a stopped parent can leave one holding GPU memory); returns their ids."""
        import psutil

        killed = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.pid != os.getpid() and proc.environ().get("GPU_CHECK_RUN") == self.run_id:
                    proc.kill()
                    killed.append(proc.pid)
        return killed


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGINT the child's group (autotune cleans up its trial), then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def autotune_cli() -> list[str]:
    """The ``autotune`` console script beside this Python, else the same entry through ``-c``."""
    script = Path(sys.executable).with_name("autotune")
    if script.is_file():
        return [str(script)]
    shim = "import sys; from autotune.cli import main; sys.argv[0] = 'autotune'; sys.exit(main())"
    return [sys.executable, "-c", shim]


def _failed(run: Run, results: Results, step: str, done: Done, what: str) -> None:
    """Record a child that failed, with the end of its log; one stopped at the deadline is a note."""
    if done.returncode is None and run.stopped:
        results.skipped.append(f"{step}: stopped at the time limit")
        return
    why = (
        f"timed out after {done.seconds:.0f} s"
        if done.returncode is None
        else f"exit {done.returncode}"
    )
    lines = done.log.read_text(errors="replace").splitlines()[-LOG_TAIL:]
    results.errors.append((step, f"{what}: {why}", "\n".join(lines)))


def run_pytest(run: Run, results: Results) -> None:
    """``pytest -m gpu``: its summary line is printed and kept."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
           *run.config.pytest_target]  # fmt: skip
    done = run.command("pytest", cmd, cap=300)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else "no output"
    print(f"pytest -m gpu: {summary}", flush=True)
    results.pytest = PytestResult(
        " ".join(["python", *cmd[1:]]), done.returncode, summary, done.seconds
    )
    if done.returncode not in (0, None):
        failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
        results.errors.append(("pytest -m gpu", summary, "\n".join(failed[-LOG_TAIL:])))
    elif done.returncode is None:
        _failed(run, results, "pytest -m gpu", done, "pytest")


def _plan_args(keys: list[PlanKey]) -> list[str]:
    return [arg for key in keys for arg in ("--plan", key.knobs())]


def _estimates(
    run: Run, results: Results, name: str, args: list[str], env: dict[str, str] | None
) -> dict[PlanKey, dict[str, Any]]:
    """Each plan's estimate as ``autotune estimate --json`` printed it ({} where it failed)."""
    keys = run.plans()
    cmd = [*autotune_cli(), "estimate", *args, *_plan_args(keys), "--json"]
    done = run.command(name, cmd, cap=180, env=env)
    if done.returncode != 0:
        _failed(run, results, name, done, " ".join(cmd[len(autotune_cli()) :]))
        return {}
    record = json.loads(done.stdout)
    results.commands[name] = "autotune " + " ".join(cmd[len(autotune_cli()) :])
    return {PlanKey.of(plan["plan"]): plan for plan in record["plans"]}


def _peaks(estimates: dict[PlanKey, dict[str, Any]]) -> dict[PlanKey, int]:
    return {key: int(plan["memory"]["peak"]) for key, plan in estimates.items()}


def _trace_env() -> dict[str, str]:
    """The estimate builds the model on meta and fake tensors: not on the GPU."""
    return {key: value for key, value in os.environ.items() if key != "GPU_CHECK_INIT_DEVICE"}


def run_traced_estimate(run: Run, results: Results) -> None:
    """Each plan's peak predicted from the model file alone (traced on fake tensors)."""
    args = [str(run.model), "-b", str(run.config.micro_batches[0])]
    results.traced = _peaks(_estimates(run, results, "estimate (model file)", args, _trace_env()))


def _profile_path(run: Run, key: PlanKey) -> Path:
    return run.work / f"profile-mb{key.micro_batch}-ckpt{key.checkpoint_blocks}.json"


def run_profiles(run: Run, results: Results) -> None:
    """``autotune profile`` of each bf16-autocast plan: peak, reserved, time, MFU, NVML."""
    cfg = run.config
    for key in (k for k in run.plans() if k.precision == "amp_bf16"):
        if run.left() < cfg.min_seconds["profiles"]:
            results.skipped.append(f"profile {key.label()}: not run, time limit")
            run.stopped = True
            continue
        path = _profile_path(run, key)
        cmd = [*autotune_cli(), "profile", str(run.model), "-b", str(key.micro_batch),
               "--autocast", "bf16", "--checkpointing", "on" if key.checkpoint_blocks else "off",
               "--device", cfg.device, "--steps", str(cfg.profile_steps),
               "--warmup", str(cfg.profile_warmup), "--out", str(path), "--json"]  # fmt: skip
        done = run.command(f"profile-{key.slug()}", cmd, cap=180)
        if done.returncode != 0:
            _failed(run, results, f"profile {key.label()}", done, "autotune profile")
            continue
        results.commands.setdefault("profile", "autotune " + " ".join(cmd[len(autotune_cli()) :]))
        results.measured[key] = Measured.from_profile(
            ProfileRecord.model_validate_json(done.stdout)
        )


def run_profile_estimate(run: Run, results: Results) -> None:
    """Each plan's peak and seconds per step predicted from the profile of the first plan (no
    checkpointing)."""
    first = PlanKey("amp_bf16", run.config.micro_batches[0], 0)
    if not _profile_path(run, first).is_file():
        results.skipped.append("estimate (profile): not run, the first profile is missing")
        return
    args = ["--profile", str(_profile_path(run, first))]
    estimates = _estimates(run, results, "estimate (profile)", args, _trace_env())
    results.profiled = _peaks(estimates)
    results.step_seconds = {key: plan["predicted_step_seconds"] for key, plan in estimates.items()
                            if plan.get("predicted_step_seconds")}  # fmt: skip


def _flops(results: Results) -> tuple[float | None, float | None]:
    """Model FLOPs per token and the peak FLOP/s, from any profile (they do not depend on the plan)."""
    for measured in results.measured.values():
        if measured.flops_per_token is not None:
            return measured.flops_per_token, measured.peak_flops
    return None, None


def run_deepspeed_plans(run: Run, results: Results) -> None:
    """Each plan with DeepSpeed bf16 weights, through autotune's trial worker (plus reserved, NVML)."""
    from autotune.search import SubprocessRunner, TrialSettings
    from autotune.search._outcome import classify_outcome, outcome_reason

    cfg = run.config
    for key in (k for k in run.plans() if k.precision == "bf16"):
        if run.left() < cfg.min_seconds["deepspeed"]:
            results.skipped.append(f"trial {key.label()}: not run, time limit")
            run.stopped = True
            continue
        extra = run.work / f"trial-{key.slug()}.json"
        runner = SubprocessRunner(entry_points=replace(ENTRY_POINTS, worker=str(run.repo / "bench" / "_gpu_check_worker.py")),
                                  env={"GPU_CHECK_EXTRA": str(extra)}, workdir=run.work / "trials")  # fmt: skip
        settings = TrialSettings(model_file=str(run.model), steps=cfg.trial_steps,
                                 warmup=cfg.trial_warmup, device=cfg.device,
                                 timeout_s=max(1.0, min(240.0, run.left() - 10)))  # fmt: skip
        plan = Plan.model_validate(key.plan_fields())
        report = runner.run(plan, settings)
        outcome = classify_outcome(
            report.returncode, report.timed_out, report.result, report.stderr_tail
        )
        if outcome != "ok" or report.result is None:
            reason = outcome_reason(outcome, report.result, report.stderr_tail)
            tail = "\n".join(report.stderr_tail.splitlines()[-LOG_TAIL:])
            results.errors.append((f"trial {key.label()}", f"{outcome}: {reason}", tail))
            continue
        figures = json.loads(extra.read_text()) if extra.is_file() else {}
        results.measured[key] = Measured.from_trial(report.result, figures, *_flops(results))
    results.commands["trial"] = "autotune's trial worker (bench/_gpu_check_worker.py), " + (
        f"{cfg.trial_warmup} warm-up + {cfg.trial_steps} measured steps, device {cfg.device}"
    )


def run_tune(run: Run, results: Results) -> None:
    """``autotune tune`` over a micro-batch ladder of one plan; a real OOM should be its first trial."""
    import _gpu_check_tune as tune

    results.tune = tune.run_tune(run, autotune_cli())
    if results.tune.error is not None and run.stopped:
        results.skipped.append(
            "autotune tune: stopped at the time limit (its finished trials are above)"
        )
    elif results.tune.error is not None:
        results.errors.append(("autotune tune", results.tune.error, results.tune.log_tail))


def run_zoo(run: Run, results: Results) -> None:
    """``bench/zoo.py`` on the check's device: transformers' architectures from configs, the
    profile's peak against the device's own counter and the estimate (one model when smoke)."""
    names = ["bert"] if run.smoke else []
    cmd = [sys.executable, "bench/zoo.py", "--device", run.config.device, *names]
    results.zoo = _bench_table(run, results, "zoo", cmd)


def run_sharded(run: Run, results: Results) -> None:
    """``bench/zero_peaks.py`` on the check's device: ZeRO-1/2/3 and FSDP2 stage 2/3 plans of a
    tiny Llama, each rank's ``torch.cuda.max_memory_allocated`` against the estimate (on the CPU,
    c10's allocator reading in each rank); one rank per GPU, or ``sharded_nproc`` on the CPU."""
    import torch

    nproc = run.config.sharded_nproc or max(1, torch.cuda.device_count())
    cmd = [sys.executable, "bench/zero_peaks.py", "examples/tiny_llama.py", "--device",
           run.config.device, "--nproc-per-node", str(nproc), "--no-trial", "--plans-per-job", "10",
           "--timeout", str(max(30, int(run.left() - 10))), "--grid", run.config.sharded_grid]  # fmt: skip
    results.sharded = _bench_table(run, results, "sharded", cmd)


def _bench_table(run: Run, results: Results, step: str, cmd: list[str]) -> str | None:
    """Run a bench script (``cmd[1]``) as the step ``step``: its printed table, or ``None``
    with the failure recorded."""
    results.commands[step] = " ".join(["python", *cmd[1:]])
    done = run.command(step, cmd, cap=600)
    if done.returncode == 0:
        return done.stdout.strip()
    _failed(run, results, step, done, cmd[1])
    return None


Step = Callable[[Run, Results], None]
STEPS: list[tuple[str, str, Step]] = [
    # (--only key, name, the step)
    ("pytest", "pytest -m gpu", run_pytest),
    ("trace", "estimate (model file)", run_traced_estimate),
    ("profiles", "profiles", run_profiles),
    ("estimate", "estimate (profile)", run_profile_estimate),
    ("tune", "autotune tune", run_tune),
    ("deepspeed", "DeepSpeed bf16 plans", run_deepspeed_plans),
    ("zoo", "zoo (bench/zoo.py)", run_zoo),
    ("sharded", "sharded per-rank peaks (bench/zero_peaks.py)", run_sharded),
]
