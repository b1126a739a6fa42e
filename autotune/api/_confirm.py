"""``confirm`` from Python: each change the policy proposes measured against what was kept, in
interleaved real steps, on the composition of the baseline's profile."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from autotune import compose
from autotune.api._common import tune_records
from autotune.confirm import ConfirmRecord, confirm_changes
from autotune.policy import SuggestRecord
from autotune.records import AutotuneError, ConfirmOptions, Machine, Plan, ProfileRecord

CONFIRM_PROFILE_STEPS = 3
"""Fewest timed steps of the baseline's profile, whatever ``steps`` per arm is asked."""


def confirm(
    model_path: str | Path | None = None,
    *,
    batch_size: int,
    profile: ProfileRecord | None = None,
    device: str | None = None,
    steps: int = ConfirmOptions.steps,
    repeats: int = ConfirmOptions.repeats,
    warmup: int = ConfirmOptions.warmup,
    loss_tolerance: float = ConfirmOptions.loss_tolerance,
    max_changes: int = ConfirmOptions.max_changes,
    progress: Callable[[str], None] | None = None,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int | None = None,
    task: str | None = None,
    machine: Machine | None = None,
    global_batch: int | None = None,
    policy_path: str | Path | None = None,
    **fields: Any,
) -> ConfirmRecord:
    """Profile a baseline, then measure each proposed change against what was kept so far.

    Args:
        model_path: the user's model file (or ``hf_config``/``hf_model`` with ``seq_len``).
        batch_size: micro-batch of the baseline.
        profile: a saved baseline profile (default: profile the model now).
        device: where the steps run (``cpu``, ``cuda``, ``cuda:1``); default: the device the
            profile ran on, or ``auto`` without a profile.
        steps: timed steps per arm in each repeat.
        repeats: interleaved A/B repeats (the interval comes from their spread).
        warmup: untimed steps per arm before the first repeat.
        loss_tolerance: largest relative difference of the mean loss accepted.
        max_changes: most changes proposed in one session.
        progress: called with one line per event (the CLI prints them to stderr).
        hf_config: a transformers config instead of a model file (random init, token batches).
        hf_model: weights to load with ``from_pretrained`` instead of a model file.
        seq_len: tokens per sample, with ``hf_config`` or ``hf_model``.
        task: the head to build with ``hf_config``/``hf_model`` (default: from the config).
        machine: the target machine the policy plans for; or its fields as keywords
            (``device_memory`` in bytes or as ``"80GiB"``, ``margin``, ...).
        global_batch: the target global batch the policy keeps.
        policy_path: a policy TOML file (default: the default policy).
        **fields: fields of :class:`Machine`, when ``machine`` is not given.
    """
    from autotune.runtime.hf import model_source

    if steps < 1 or repeats < 1:
        raise AutotuneError("--steps and --repeats must be at least 1")
    if profile is not None and profile.config.batch_size != batch_size:
        raise AutotuneError(
            f"--batch-size {batch_size} differs from the profile's batch size "
            f"{profile.config.batch_size}"
        )
    where = device or (profile.config.device if profile is not None else "auto")
    if machine is None:
        _, machine = tune_records(None, None, {"global_batch": 1, "device": where, **fields})
    elif fields:
        raise AutotuneError(f"confirm: {', '.join(fields)} given beside machine=")
    with model_source(model_path, hf_config=hf_config, hf_model=hf_model, seq_len=seq_len,
                      task=task) as src:  # fmt: skip
        return _confirm_file(
            src.path, src.label, batch_size=batch_size, profile=profile, device=where,
            steps=steps, repeats=repeats, warmup=warmup, loss_tolerance=loss_tolerance,
            max_changes=max_changes, say=progress or (lambda line: None), machine=machine,
            global_batch=global_batch, policy_path=policy_path,
        )  # fmt: skip


def _confirm_file(
    path: Path, label: str, *, batch_size: int, profile: ProfileRecord | None, device: str,
    steps: int, repeats: int, warmup: int, loss_tolerance: float, max_changes: int,
    say: Callable[[str], None], machine: Machine, global_batch: int | None,
    policy_path: str | Path | None,
) -> ConfirmRecord:  # fmt: skip
    from autotune.runtime.ab import measure
    from autotune.runtime.modelfile import load_model_file

    model_file = load_model_file(path)
    if profile is None:
        say(f"profiling the baseline at batch size {batch_size} on {device}")
        profile = compose.profile_model(
            path, batch_size=batch_size, steps=max(steps, CONFIRM_PROFILE_STEPS), warmup=warmup,
            device=device, precision="fp32", checkpointing=False, label=label,
        )  # fmt: skip
    else:
        profile = compose.completed(profile, path)
    composition = compose.compose(profile, machine=machine, global_batch=global_batch,
                                  policy_path=policy_path)  # fmt: skip

    def measure_pair(before: Plan, after: Plan) -> dict[str, Any]:
        return measure(model_file, before, after, device=device, steps=steps, repeats=repeats,
                       warmup=warmup)  # fmt: skip

    def advise(start: Plan | None, skip: Collection[str]) -> SuggestRecord:
        return composition.advice(start=start, skip_rules=skip)

    return confirm_changes(
        profile, measure_pair, model_file=label, device=device, repeats=repeats,
        steps=steps, loss_tolerance=loss_tolerance, max_changes=max_changes, progress=say,
        advise=advise,
    )  # fmt: skip
