"""Script trials: each trial runs the user's own launch command, unchanged but for the ranks, the
port and mapped flags, with a start-up hook on ``PYTHONPATH`` that injects the plan and writes
the same :class:`TrialResult` a model-file trial does.

The hook lives in a layer above the search; the composer passes its folder in (``hook_dir``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autotune.records import (
    PROBE_ENV,
    PROFILE_ENV,
    SCRIPT_SPEC_ENV,
    AutotuneError,
    Plan,
    ProfileRecord,
    ScriptProbe,
    TrialSettings,
)
from autotune.search._outcome import classify_outcome, outcome_reason
from autotune.search._records import RunReport
from autotune.search._runner import SubprocessRunner, torchrun_logs

ARG_KEYS: dict[str, Callable[[Plan], int]] = {
    "train_micro_batch_size_per_gpu": lambda plan: plan.micro_batch,
    "gradient_accumulation_steps": lambda plan: plan.grad_accum,
    "train_batch_size": lambda plan: plan.global_batch,
}
"""DeepSpeed config keys ``--arg-map`` can pass to a script flag (as DeepSpeed's ``arg_mappings``)."""

# launcher -> (its flags for processes per node, its flags for the rendezvous port)
_FLAGS = {
    "torchrun": (("--nproc-per-node", "--nproc_per_node"), ("--master-port", "--master_port")),
    "accelerate": (("--num_processes", "--num-processes"),
                   ("--main_process_port", "--main-process-port")),
    "deepspeed": (("--num_gpus", "--num-gpus"), ("--master_port", "--master-port")),
}  # fmt: skip


def parse_arg_map(items: Sequence[str]) -> dict[str, str]:
    """``KEY=--flag`` items as a dict.

    Raises:
        AutotuneError: an item that is not ``KEY=--flag``, or an unknown key.
    """
    mapping = {}
    for item in items:
        key, _, flag = item.partition("=")
        if key not in ARG_KEYS or not flag.startswith("-"):
            known = ", ".join(ARG_KEYS)
            raise AutotuneError(f"--arg-map {item}: use KEY=--flag with KEY one of {known}")
        mapping[key] = flag
    return mapping


def launcher(command: Sequence[str]) -> tuple[str, int]:
    """The launcher kind (``python``, ``torchrun``, ``accelerate``, ``deepspeed``) and where its
    own flags begin.

    Raises:
        AutotuneError: an empty command, or one no known launcher starts.
    """
    if not command:
        raise AutotuneError("--: give the launch command after --, e.g. -- python train.py")
    first = os.path.basename(command[0])
    if first == "torchrun":
        return "torchrun", 1
    if first.startswith("python"):
        if list(command[1:3]) in (
            ["-m", "torch.distributed.run"],
            ["-m", "torch.distributed.launch"],
        ):
            return "torchrun", 3
        return "python", 1
    if first == "accelerate" and len(command) > 1 and command[1] == "launch":
        return "accelerate", 2
    if first == "deepspeed":
        return "deepspeed", 1
    raise AutotuneError(
        f"--: {command[0]}: not a launch command autotune knows "
        "(python, torchrun, python -m torch.distributed.run, accelerate launch, deepspeed)"
    )


def _flag(tokens: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the first of ``names`` in ``tokens`` (``--x V`` or ``--x=V``)."""
    for index, token in enumerate(tokens):
        name, eq, value = token.partition("=")
        if name in names:
            if eq:
                return value
            return tokens[index + 1] if index + 1 < len(tokens) else ""
    return None


def _launcher_flags(command: Sequence[str]) -> list[str]:
    """The launcher's own flags: the tokens before the script."""
    kind, at = launcher(command)
    rest = list(command[at:])
    script = next((i for i, t in enumerate(rest) if t.endswith(".py")), len(rest))
    return rest[:script]


def check_command(command: Sequence[str], nproc: int) -> None:
    """Every check of the launch command that needs no launch.

    Raises:
        AutotuneError: one line naming the command's part at fault.
    """
    kind, at = launcher(command)
    script = next((t for t in command[at:] if t.endswith(".py")), None)
    if script is not None and not Path(script).is_file():
        raise AutotuneError(f"--: {script}: no such script")
    if kind in _FLAGS:
        names = _FLAGS[kind][0]
        given = _flag(_launcher_flags(command), names)
        if given is not None and given != str(nproc):
            raise AutotuneError(
                f"--nproc-per-node {nproc}: the command launches {given} per node ({names[0]} {given})"
            )


def command_ranks(command: Sequence[str]) -> int | None:
    """The processes per node the command's launcher names (``None``: it names none)."""
    kind, _ = launcher(command)
    if kind not in _FLAGS:
        return None
    given = _flag(_launcher_flags(command), _FLAGS[kind][0])
    return int(given) if given and given.isdigit() else None


def map_args(tokens: list[str], plan: Plan, arg_map: Mapping[str, str]) -> list[str]:
    """``tokens`` with each mapped flag set to the plan's value (replaced, or appended)."""
    out = list(tokens)
    for key, flag in arg_map.items():
        value = str(ARG_KEYS[key](plan))
        for index, token in enumerate(out):
            if token == flag and index + 1 < len(out):
                out[index + 1] = value
                break
            if token.startswith(flag + "="):
                out[index] = f"{flag}={value}"
                break
        else:
            out += [flag, value]
    return out


def script_command(
    command: Sequence[str], plan: Plan, port: int, arg_map: Mapping[str, str],
    log_dir: Path | None = None,
) -> list[str]:  # fmt: skip
    """The user's command for ``plan``: ranks and port added where it names none (a plain
    ``python`` command gets torchrun for several ranks), mapped flags set to the plan's values;
    torchrun's ``--log-dir`` set to ``log_dir`` where given and the command names none."""
    kind, at = launcher(command)
    world, tokens = plan.world_size, list(command)
    logs = [f"--log-dir={log_dir}"] if log_dir is not None else []
    if kind == "python" and world > 1:
        tokens = [tokens[0], "-m", "torch.distributed.run", "--nnodes=1",
                  f"--nproc-per-node={world}", "--master-addr=127.0.0.1",
                  f"--master-port={port}", *logs, *tokens[1:]]  # fmt: skip
    elif kind in _FLAGS:
        nproc_names, port_names = _FLAGS[kind]
        own, added = _launcher_flags(command), []
        if _flag(own, nproc_names) is None:
            added += [nproc_names[0], str(world)]
        if _flag(own, port_names) is None and "--standalone" not in own:
            added += [port_names[0], str(port)]
        if kind == "torchrun" and _flag(own, ("--log-dir", "--log_dir")) is None:
            added += logs
        tokens = tokens[:at] + added + tokens[at:]
    return map_args(tokens, plan, arg_map)


class ScriptRunner(SubprocessRunner):
    """Runs each trial as the user's launch command with the start-up hook on ``PYTHONPATH``.

    Args:
        command: the user's launch command (``python train.py ...``, ``torchrun ...``,
            ``accelerate launch ...``, ``deepspeed ...``).
        hook_dir: the folder of the start-up hook (the composer passes it in).
        arg_map: DeepSpeed config key -> the script's flag (:data:`ARG_KEYS`).
        **options: :class:`SubprocessRunner`'s (``entry_points`` for the lifeline).
    """

    def __init__(
        self, command: Sequence[str], *, hook_dir: str, arg_map: Mapping[str, str] | None = None,
        **options: Any,
    ) -> None:  # fmt: skip
        super().__init__(**options)
        launcher(command)
        self.user_command = list(command)
        self.hook_dir = hook_dir
        self.arg_map = dict(arg_map or {})
        self._spec_path: Path | None = None
        self._probe_path: Path | None = None
        self._profile_path: Path | None = None

    def command(self, plan: Plan, spec_path: Path, port: int) -> list[str]:
        """The user's command for ``plan`` (:func:`script_command`)."""
        self._spec_path = spec_path  # the launch asks for its environment next
        return script_command(
            self.user_command, plan, port, self.arg_map, log_dir=torchrun_logs(spec_path)
        )

    def child_env(self, plan: Plan, settings: TrialSettings, port: int) -> dict[str, str]:
        """The worker's environment plus the hook on ``PYTHONPATH`` and the spec's path."""
        env = super().child_env(plan, settings, port)
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = self.hook_dir + (os.pathsep + path if path else "")
        env[SCRIPT_SPEC_ENV] = str(self._spec_path)
        if self._probe_path is not None:
            env[PROBE_ENV] = str(self._probe_path)
        if self._profile_path is not None:
            env[PROFILE_ENV] = str(self._profile_path)
        return env

    def warm_up(self, plans: list[Plan], settings: TrialSettings) -> float:
        """Nothing: the composer's :meth:`probe` launch paid the start-up."""
        return 0.0

    def probe(self, plan: Plan, settings: TrialSettings, *, profile: bool = False) -> ScriptProbe:
        """One launch that stops at the script's first forward: learns the model's block stack
        and size, pays start-up (DeepSpeed's comm-op compile), checks the micro-batch reaches
        the script's loader; with ``profile``, rank 0 also profiles the script's model on its
        first batch (the profile's batch size is ``plan``'s micro-batch).

        Raises:
            AutotuneError: the launch failed; the line says why (the script's own line).
        """
        with tempfile.TemporaryDirectory(prefix="autotune-probe-") as folder:
            self._probe_path = Path(folder) / "probe.json"
            self._profile_path = Path(folder) / "profile.json" if profile else None
            try:
                report = self._launch(plan, settings, warmup_only=True)
                text = _read(self._probe_path)
                profiled = _read(self._profile_path) if self._profile_path else None
            finally:
                self._probe_path = self._profile_path = None
        if text is not None and report.returncode == 0:
            try:
                found = ScriptProbe.model_validate_json(text)
                if profiled is None:
                    return found
                return found.model_copy(
                    update={"profile": ProfileRecord.model_validate_json(profiled)}
                )
            except ValidationError:
                pass
        reason = _failure(report)
        raise AutotuneError(f"--: the script's first launch ({plan.describe()}) failed: {reason}")


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


def _failure(report: RunReport) -> str:
    outcome = classify_outcome(
        report.returncode, report.timed_out, report.result, report.stderr_tail
    )
    if outcome == "ok":
        return "it wrote no probe (it exited before its first forward)"
    return outcome_reason(outcome, report.result, report.stderr_tail) or outcome


__all__ = ["ARG_KEYS", "ScriptRunner",
           "check_command", "command_ranks", "launcher", "map_args", "parse_arg_map", "script_command"]  # fmt: skip
