"""Reliability of `autotune tune` under injected faults: what each leaves behind, what the study keeps.

Usage: OMP_NUM_THREADS=1 python bench/reliability.py [--only NAME ...] [--waits]

Each fault runs a real `autotune tune` (tiny model, 1-step trials, one saved profile) in a
fresh folder with its own $TMPDIR and sqlite study, and fires once:

- kill -9 of tune / SIGINT of tune: a trial worker hangs, the driver signals tune; then the
  same command is run again (resume).
- kill -9 of a rank: a two-rank trial; rank 1 hangs and the driver SIGKILLs it.
- hang / OOM / crash on import: inside one trial worker (timeout / torch.OutOfMemoryError /
  an exception at import); the run goes on.

Measured, per fault, by psutil and by the study read back with Optuna: processes that
tune started and that are still alive 2 s after the faulted run ended; trial folders
(`trial-*`, and a pooled worker group's `group-*`) left after it and after the next run; trials lost (a plan whose trial was stopped or left
RUNNING and never decided afterwards); trials duplicated (a plan measured twice); and
whether every plan started was decided (measured, or pruned with a reason) exactly once
and a recommendation written.
Prints a markdown table for bench/RESULTS.md.

``--waits`` runs the second table instead: waits that must end, each with its time to end and
what stderr said (a pipe, not a terminal): a stale torch build lock at start (in an extensions
folder of the run's own, never the shared one); another process holding this host's CPU lock;
a model that hangs in every trial rank; a resume after the model file changed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
MODEL = '''
import os, time
import torch
from torch import nn

FAULT, FLAG = os.environ.get("FAULT", ""), os.environ.get("FAULT_FLAG", "")


def _fire(rank="0"):
    """True in exactly one trial process (tune's own profile has no RANK): the flag goes."""
    if not FLAG or os.environ.get("RANK") != rank:
        return False
    try:
        os.remove(FLAG)
    except FileNotFoundError:
        return False
    with open(FLAG + ".pid", "w") as f:
        f.write(str(os.getpid()))
    return True


if FAULT == "crash" and _fire():
    raise ImportError("injected crash on import")


def build_model():
    if FAULT in ("hang", "kill-tune", "sigint") and _fire():
        time.sleep(600)
    if FAULT == "kill-rank" and _fire(rank="1"):
        time.sleep(600)
    if FAULT == "hang-ranks" and "RANK" in os.environ:  # every trial rank, not tune's profile
        time.sleep(600)
    if FAULT == "oom" and _fire():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


def build_batch(batch_size):
    return torch.randn(batch_size, 32), torch.randn(batch_size, 1)


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)
'''


@dataclass(frozen=True)
class Fault:
    name: str
    how: str
    nproc: int = 1
    trials: int = 3
    signal: int | None = None  # sent to tune once the fault fired
    kill_rank: bool = False
    timeout_s: int = 90  # two-rank DeepSpeed trials take ~10-30 s on a loaded 2-core machine


FAULTS = [
    Fault("kill-tune", "SIGKILL to `autotune tune` while a trial runs", signal=signal.SIGKILL),
    Fault("kill-rank", "SIGKILL to rank 1 of a 2-rank trial", nproc=2, trials=2, kill_rank=True),
    Fault("sigint", "SIGINT to `autotune tune` while a trial runs", signal=signal.SIGINT),
    Fault("hang", "a trial sleeps in build_model (--trial-timeout 20)", timeout_s=20),
    Fault("oom", "torch.OutOfMemoryError in build_model"),
    Fault("crash", "an exception when the model file is imported"),
]


class Watch:
    """Every process descended from ``root`` while it ran (ranks sit in sessions of their own)."""

    def __init__(self, root: int) -> None:
        self.root, self.seen = root, set[int]()

    def poll(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            self.seen.update(p.pid for p in psutil.Process(self.root).children(recursive=True))

    def alive(self) -> list[int]:
        """The survivors, counted, then killed (the bench leaves nothing behind either)."""
        left = []
        for pid in self.seen:
            try:
                process = psutil.Process(pid)
                if process.status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
                    process.kill()
            except psutil.NoSuchProcess:
                pass
        return left


def _command(folder: Path, profile: Path, fault: Fault) -> list[str]:
    return [AUTOTUNE, "tune", str(folder / "model.py"), "--global-batch", "4",
            "--nproc-per-node", str(fault.nproc), "--trials", str(fault.trials), "--repeats", "1",
            "--steps", "1", "--warmup", "0", "--device", "cpu", "--profile", str(profile),
            "--storage", str(folder / "study.db"), "--study", "bench", "--out-dir", str(folder),
            "--trial-timeout", str(fault.timeout_s), "--json"]  # fmt: skip


def _env(folder: Path, fault: Fault, armed: bool) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(folder / "tmp"), "OMP_NUM_THREADS": "1",
            "DS_ACCELERATOR": "cpu", "FAULT": fault.name if armed else "",
            "FAULT_FLAG": str(folder / "fault.flag")}  # fmt: skip


def _run(folder: Path, profile: Path, fault: Fault, armed: bool) -> tuple[int, list[int]]:
    """One tune run, the fault armed or not; its exit status and the processes it left."""
    if armed:
        (folder / "fault.flag").write_text("armed")
    # SIGINT at its default in tune even when this bench runs in the background, where the
    # shell starts it (and so its children) with SIGINT ignored.
    proc = subprocess.Popen(_command(folder, profile, fault), env=_env(folder, fault, armed),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    watch, fired = Watch(proc.pid), Path(f"{folder / 'fault.flag'}.pid")
    sent = False
    while proc.poll() is None:
        watch.poll()
        if armed and not sent and fired.exists() and fired.read_text():
            time.sleep(0.5)  # let the hang settle in
            watch.poll()
            target = int(fired.read_text()) if fault.kill_rank else proc.pid
            if fault.signal is not None or fault.kill_rank:
                os.kill(target, fault.signal or signal.SIGKILL)
            sent = True
        time.sleep(0.1)
    _, err = proc.communicate()
    if proc.returncode not in (0, 130, -9) and err:
        sys.stderr.write(err[-2000:])
    time.sleep(2.0)
    return proc.returncode, watch.alive()


def _study(folder: Path) -> dict[str, object]:
    """The study read back by Optuna: what was measured, decided, lost or measured twice."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{folder / 'study.db'}"
    trials = optuna.load_study(study_name="bench", storage=storage).get_trials()
    plan = lambda t: json.dumps(t.user_attrs.get("plan"), sort_keys=True)  # noqa: E731
    measured = [t for t in trials if t.user_attrs.get("outcome")]
    # Decided: measured, or pruned with a reason (predicted misfit, OOM lesson, same plan).
    decided = {plan(t) for t in measured} | {
        plan(t) for t in trials if t.state.name == "PRUNED" and t.user_attrs.get("reason")
    }
    stopped = [t for t in trials if t.state.name == "FAIL" and not t.user_attrs.get("outcome")]
    running = [t for t in trials if t.state.name == "RUNNING"]
    started = {plan(t) for t in trials if t.state.name != "WAITING" and "plan" in t.user_attrs}
    outcomes = sorted({t.user_attrs["outcome"] for t in measured} - {"ok"})
    return {"lost": len({plan(t) for t in stopped + running} - decided) + len(running),
            "undecided": len(started - decided),
            "duplicated": len(measured) - len({plan(t) for t in measured}),
            "recorded": outcomes + sorted({str(t.user_attrs.get("reason")) for t in stopped})}  # fmt: skip


def _folders(folder: Path) -> int:
    return sum(1 for p in (folder / "tmp").iterdir() if p.name.startswith(("trial-", "group-")))


def run_fault(fault: Fault, root: Path, profile: Path) -> dict[str, object]:
    folder = root / fault.name
    (folder / "tmp").mkdir(parents=True)
    (folder / "model.py").write_text(MODEL)
    code, left = _run(folder, profile, fault, armed=True)
    folders_after = _folders(folder)
    resumed, code_again = fault.signal is not None, code
    if resumed:  # the same command again, nothing armed
        code_again, left_again = _run(folder, profile, fault, armed=False)
        left += left_again
    study = _study(folder)
    final_ok = (code_again if resumed else code) == 0
    rec = (folder / "recommendation.json").exists()
    whole = final_ok and rec and study["undecided"] == 0 and study["duplicated"] == 0
    return {"fault": fault.name, "how": fault.how, "exit": code, "left": len(left),
            "folders": f"{folders_after} / {_folders(folder)}" if resumed else str(folders_after),
            "lost": study["lost"], "duplicated": study["duplicated"],
            "recorded": "; ".join(study["recorded"]) or "–", "ok": "yes" if whole else "no"}  # fmt: skip


WAITS = {
    "stale-lock": "a stale `deepspeed_shm_comm/lock` in TORCH_EXTENSIONS_DIR at start (2 ranks)",
    "host-lock": "another process holds this host's CPU lock until tune says it waits",
    "hang-ranks": "build_model hangs in every trial rank (--trial-timeout 20)",
    "changed-model": "the model file changed, then the same command (resume)",
}
HOLD = """
import sys, time
from pathlib import Path
from autotune.search._runner import device_units, host_lock
with host_lock(device_units("cpu")):
    while not Path(sys.argv[1]).exists():
        time.sleep(0.05)
"""


def _wait_run(folder: Path, profile: Path, name: str, env: dict[str, str],
              release: Path | None = None) -> dict[str, object]:  # fmt: skip
    """One tune run; its exit, seconds to end, survivors, stderr's lines; ``release`` made
    once it says it waits for a lock."""
    fault = Fault(name, "", nproc=2 if name == "stale-lock" else 1, trials=2,
                  timeout_s=20 if name == "hang-ranks" else 90)  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(_command(folder, profile, fault), env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    watch, lines = Watch(proc.pid), []
    assert proc.stderr is not None
    for line in iter(proc.stderr.readline, ""):
        watch.poll()
        lines.append(line.strip())
        if release is not None and "waiting for the lock" in line:
            release.touch()
    proc.wait()
    seconds = time.monotonic() - start
    time.sleep(2.0)
    return {"exit": proc.returncode, "s": seconds, "left": len(watch.alive()),
            "said": [x for x in lines if x.startswith("autotune:")]}  # fmt: skip


def run_wait(name: str, root: Path, profile: Path) -> dict[str, object]:
    folder = root / name
    (folder / "tmp").mkdir(parents=True)
    model = MODEL
    (folder / "model.py").write_text(model)
    extensions = folder / "extensions"
    (extensions / "deepspeed_shm_comm").mkdir(parents=True)
    if name == "stale-lock":  # what a build killed midway leaves
        (extensions / "deepspeed_shm_comm" / "lock").touch()
    env = {**_env(folder, Fault(name, ""), armed=False), "FAULT": name,
           "TORCH_EXTENSIONS_DIR": str(extensions)}  # fmt: skip
    holder = None
    if name == "host-lock":
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder / "release")], env=env)
        time.sleep(1.0)
    if name == "changed-model":
        first = _wait_run(folder, profile, name, env)
        (folder / "model.py").write_text(model.replace("nn.Linear(64, 1)", "nn.Linear(64, 2)"))
        assert first["exit"] == 0, first
    run = _wait_run(folder, profile, name, env,
                    release=folder / "release" if holder is not None else None)  # fmt: skip
    if holder is not None:
        (folder / "release").touch()  # also when tune never waited (then the row says so)
        holder.wait()
    said = [x for x in run["said"] if "lock" in x or "group" in x or "study" in x]  # type: ignore[attr-defined]
    lost = _study(folder)["lost"] if (folder / "study.db").exists() else 0
    return {"fault": name, "how": WAITS[name], "exit": run["exit"],
            "s": f"{run['s']:.0f}", "left": run["left"], "lost": lost,
            "said": " / ".join(dict.fromkeys(x.replace("|", "/") for x in said)) or "–"}  # fmt: skip


def main_waits(names: list[str] | None) -> None:
    """The waits table (``--waits``)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="autotune-reliability-") as tmp:
        root = Path(tmp)
        (root / "model.py").write_text(MODEL)
        profile = root / "profile.json"
        subprocess.run([AUTOTUNE, "profile", str(root / "model.py"), "-b", "2", "--steps", "1",
                        "--warmup", "1", "--device", "cpu", "--out", str(profile)],
                       check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
        rows = []
        for name in [n for n in WAITS if names is None or n in names]:
            sys.stderr.write(f"{name} ...\n")
            rows.append(run_wait(name, root, profile))
    print("| fault | injected | exit | seconds to end | processes left "
          "after 2 s | trials lost | what stderr said (a pipe) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} | {r['how']} | {r['exit']} | {r['s']} | {r['left']} "
              f"| {r['lost']} | {r['said']} |")  # fmt: skip
    print(f"\n{len(rows)} waits in {time.monotonic() - start:.0f} s.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", default=None, help="fault names to run")
    parser.add_argument("--waits", action="store_true", help="the waits table instead")
    args = parser.parse_args()
    if args.waits:
        main_waits(args.only)
        return
    faults = [f for f in FAULTS if args.only is None or f.name in args.only]
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="autotune-reliability-") as tmp:
        root = Path(tmp)
        (root / "model.py").write_text(MODEL)
        profile = root / "profile.json"
        subprocess.run([AUTOTUNE, "profile", str(root / "model.py"), "-b", "2", "--steps", "1",
                        "--warmup", "1", "--device", "cpu", "--out", str(profile)],
                       check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
        rows = []
        for fault in faults:
            sys.stderr.write(f"{fault.name} ...\n")
            rows.append(run_fault(fault, root, profile))
    print("| fault | injected | exit of the faulted run | processes left after 2 s | "
          "`trial-*`/`group-*` folders left (after it / after the next run) | trials lost | "
          "trials duplicated | faulty trial recorded as | every started plan decided once, "
          "recommendation written |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} | {r['how']} | {r['exit']} | {r['left']} | {r['folders']} | "
              f"{r['lost']} | {r['duplicated']} | {r['recorded']} | {r['ok']} |")  # fmt: skip
    print(f"\n{len(rows)} faults in {time.monotonic() - start:.0f} s.")


if __name__ == "__main__":
    main()
