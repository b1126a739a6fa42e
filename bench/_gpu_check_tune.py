"""The GPU check's tune step: ``autotune tune`` over a micro-batch ladder of one plan.

The plan is bf16 autocast with no checkpointing; the ladder starts at the global batch
in one micro-batch, which does not fit on the GPU, and halves. The rungs are put in the
study's queue with autotune's own ``enqueue`` before ``autotune tune`` opens the study, so
the trials are exactly the ladder, in order. The budget given to tune is twice the GPU's
memory, so the estimate prunes nothing and the GPU itself decides what fits: the first
trial meets a real CUDA out-of-memory, which must be classified ``oom`` and must not
stop the search. The trials are read back from the study, so a run stopped at the
time limit still reports the ones that finished.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from _gpu_check_report import TuneFigures, TuneRow

from autotune.records import Plan
from autotune.search import open_study, records
from autotune.search._space import make_space
from autotune.search._study import enqueue

STUDY = "gpu-check"
POLICY = """# The default policy without torch.compile: compiling a 1.1B model costs about a minute
# per trial; pytest -m gpu checks compile on the GPU instead.
extends = "default"
disable = ["compile"]
"""


def _ladder(run: Any) -> list[Plan]:
    rungs = run.config.tune_ladder
    return [Plan(precision="amp_bf16", micro_batch=mb, grad_accum=rungs[0] // mb) for mb in rungs]


def _enqueue(storage: Path, run: Any) -> None:
    """Put the ladder first in a fresh study (the first rung is the user's baseline)."""
    plans = _ladder(run)
    storage.unlink(missing_ok=True)
    study = open_study(str(storage), STUDY, seed=0)
    space = make_space(plans[0].global_batch, 1, run.layers(), plans[0], plans[0])
    for index, plan in enumerate(plans):
        enqueue(study, space, plan, "baseline" if index == 0 else "search")


def _command(run: Any, cli: list[str], storage: Path, budget: int) -> list[str]:
    cfg = run.config
    ladder = _ladder(run)
    policy = run.work / "tune-policy.toml"
    policy.write_text(POLICY)
    out_dir = run.work / "tune"
    out_dir.mkdir(exist_ok=True)
    # Trials start until the budget is spent; the final re-runs (2 launches) come after it.
    minutes = max(0.1, (run.left() - 3 * cfg.trial_s) / 60)
    trial_s = min(5 * cfg.trial_s, max(30.0, run.left() - 20))
    cmd = [*cli, "tune", str(run.model), "--global-batch", str(ladder[0].global_batch),
           "--trials", str(len(ladder)), "--repeats", "1", "--steps", str(cfg.trial_steps),
           "--warmup", str(cfg.trial_warmup), "--device", cfg.device,
           "--device-memory", f"{math.ceil(budget / 2**30)}GiB", "--policy", str(policy),
           "--baseline", f"mb={ladder[0].micro_batch},precision=amp_bf16",
           "--storage", str(storage), "--study", STUDY, "--out-dir", str(out_dir),
           "--trial-timeout", f"{trial_s:.0f}", "--budget-minutes", f"{minutes:.2f}", "--json"]  # fmt: skip
    profile = run.work / f"profile-mb{cfg.micro_batches[0]}-ckpt0.json"
    if profile.is_file():  # else tune takes its own short profile
        cmd += ["--profile", str(profile)]
    return cmd


def _rows(storage: Path) -> list[TuneRow]:
    study = open_study(str(storage), STUDY)
    return [
        TuneRow(number=r.number, role=r.role, plan=r.plan.describe(), micro_batch=r.plan.micro_batch,
                state=r.state, outcome=r.outcome, peak=r.peak_memory_bytes,
                peak_source=r.peak_source, predicted=r.predicted_peak_bytes,
                tokens_per_s=r.tokens_per_s, reason=r.reason)
        for r in records(study)
    ]  # fmt: skip


def run_tune(run: Any, cli: list[str]) -> TuneFigures:
    """Run the ladder through ``autotune tune`` and read what each trial became."""
    from _gpu_check_report import device_memory

    storage = run.work / "tune.db"
    budget = 2 * device_memory(run.config.device)
    _enqueue(storage, run)
    cmd = _command(run, cli, storage, budget)
    done = run.command("tune", cmd, cap=run.left())
    figures = TuneFigures(command="autotune " + " ".join(cmd[len(cli) :]), budget=budget,
                          seconds=done.seconds, rows=_rows(storage))  # fmt: skip
    if done.returncode == 0:
        record = json.loads(done.stdout)
        rec = record.get("recommendation") or {}
        figures.recommendation = Plan.model_validate(rec["plan"]).describe() if rec else None
        figures.notes = list(record.get("notes", []))
    else:
        why = "stopped at the time limit" if done.returncode is None else f"exit {done.returncode}"
        figures.error = f"autotune tune: {why}"
        figures.log_tail = "\n".join(done.log.read_text(errors="replace").splitlines()[-15:])
    return figures
