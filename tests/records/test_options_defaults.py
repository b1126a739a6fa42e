"""One default per knob: every option of ``autotune profile``, ``confirm`` and ``tune`` that is a
field of its options record takes the record's default; the rest are the machine's (checked
against :class:`Machine`), the model's source, or where the output goes. The records refuse a
bad value with one line naming its field and flag."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperGroup, TyperOption

from autotune.cli import app
from autotune.records import (
    AutotuneError,
    ConfirmOptions,
    Machine,
    ProfileOptions,
    TuneOptions,
)

CLI = Path(__file__).resolve().parents[2] / "autotune" / "cli"


def _same(value: Any) -> Any:
    return value


# command -> (record, {CLI parameter: (record field, record default -> CLI default)}).
RECORDS: dict[str, tuple[type, dict[str, tuple[str, Callable[[Any], Any]]]]] = {
    "profile": (ProfileOptions, {
        "batch_size": ("batch_size", _same), "steps": ("steps", _same),
        "warmup": ("warmup", _same),
        # None in the CLI: the shared --device/--autocast, where None means the record's.
        "device": ("device", lambda _: None), "autocast": ("autocast", lambda _: None),
        "checkpointing": ("checkpointing", lambda on: "on" if on else "off"),
    }),
    "confirm": (ConfirmOptions, {
        "batch_size": ("batch_size", _same), "steps": ("steps", _same),
        "repeats": ("repeats", _same), "warmup": ("warmup", _same),
        "loss_tolerance": ("loss_tolerance", _same), "max_changes": ("max_changes", _same),
        "global_batch": ("global_batch", _same), "profile": ("profile_path", _same),
        "policy": ("policy_path", _same),
    }),
    "tune": (TuneOptions, {
        "global_batch": ("global_batch", _same), "trials": ("trials", _same),
        "budget_minutes": ("budget_s", lambda s: None if s is None else s / 60),
        "trial_timeout": ("trial_timeout_s", _same), "steps": ("steps", _same),
        "interval": ("interval_width", lambda width: width or 0.0),  # 0: exactly --steps
        "max_steps": ("max_steps", _same), "warmup": ("warmup", _same),
        "repeats": ("repeats", _same), "storage": ("storage", _same),
        "study": ("study_name", _same), "heartbeat": ("heartbeat_s", _same),
        "profile": ("profile_path", _same), "policy": ("policy_path", _same),
        "baseline": ("baseline", _same),
        "engines": ("engines", lambda names: None if names is None else ",".join(names)),
        "finish": ("finish", _same), "rdzv_endpoint": ("rdzv_endpoint", _same),
        "join_timeout": ("join_timeout_s", _same),
    }),
}  # fmt: skip
NO_FLAG = {"tune": {"front", "seed"}}
"""Record fields that only the Python API sets."""

MACHINE = {"device": "device", "device_memory": "device_memory", "margin": "margin",
           "nproc_per_node": "nproc_per_node", "nnodes": "nnodes", "inter_gbps": "inter_gbps"}  # fmt: skip
SOURCE = {"hf_config", "hf_model", "seq_len", "task"}
OUTPUT = {"out", "output", "out_dir", "as_json", "json_output"}
OTHER = {"arg_map", "precision"}
"""``--arg-map`` of a script command; ``--precision``, hidden, refused as renamed."""

COUNTS = {"profile": (6, 0, 4, 2, 2), "confirm": (9, 3, 4, 2, 0), "tune": (19, 6, 4, 2, 1)}
"""Options of each command: in its record, the machine's, the model's source, the output's,
and others."""


def _options(name: str) -> dict[str, TyperOption]:
    """The command's options by parameter name, as typer hands them to click."""
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    command = group.commands[name]
    return {p.name: p for p in command.params if isinstance(p, TyperOption) and p.name}


def _default(option: TyperOption) -> Any:
    value = option.default
    return value.value if hasattr(value, "value") else value  # an enum's word


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_record_option_takes_the_record_default(name: str) -> None:
    record, mapping = RECORDS[name]
    fields = {f.name: f for f in dataclasses.fields(record)}
    options = _options(name)
    for param, (field, to_cli) in mapping.items():
        known = fields[field]
        if known.default is dataclasses.MISSING and known.default_factory is dataclasses.MISSING:
            assert options[param].required, f"{name} {param}: required in {record.__name__}"
            continue
        default = (known.default if known.default is not dataclasses.MISSING
                   else known.default_factory())  # type: ignore[misc]  # fmt: skip
        assert _default(options[param]) == to_cli(default), f"{name} {param} vs {field}"
    # Every field with a flag has its option, every option is accounted for.
    assert set(fields) == {field for field, _ in mapping.values()} | NO_FLAG.get(name, set())


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_machine_options_take_the_machine_defaults(name: str) -> None:
    fields = {f.name: f.default for f in dataclasses.fields(Machine)}
    for param, option in _options(name).items():
        if param in MACHINE and param not in RECORDS[name][1]:
            expected = None if param == "device" else fields[MACHINE[param]]  # None: see below
            assert _default(option) == expected, f"{name} {param}"
    # --device: None means the record's (profile) or the profile's device (confirm, tune).


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_each_option_is_declared_in_one_place(name: str) -> None:
    mapping = RECORDS[name][1]
    groups = [set(mapping), set(MACHINE) - set(mapping), SOURCE, OUTPUT, OTHER]
    options = set(_options(name))
    counts = tuple(len(options & group) for group in groups)
    assert counts == COUNTS[name]
    assert sum(counts) == len(options), sorted(options - set().union(*groups))


def _literal_defaults(path: Path) -> list[str]:
    """``typer.Option(<number or word>, ...)`` calls: a default written out in the CLI."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "Option" and node.args):  # fmt: skip
            continue
        first = node.args[0]
        flags = [a.value for a in node.args[1:] if isinstance(a, ast.Constant)]
        if isinstance(first, ast.Constant) and (
            isinstance(first.value, int | float | str) and not isinstance(first.value, bool)
        ):
            found.append(f"{path.name}:{node.lineno} {flags} = {first.value!r}")
    return found


def test_no_numeric_or_word_default_is_written_in_the_cli() -> None:
    files = ["profile.py", "confirm.py", "tune.py", "_options.py"]
    assert [hit for name in files for hit in _literal_defaults(CLI / name)] == []


def test_the_check_finds_a_written_default(tmp_path: Path) -> None:
    source = tmp_path / "cli.py"
    source.write_text('import typer\nX = typer.Option(20, "--steps")\n', encoding="utf-8")
    assert _literal_defaults(source) == ["cli.py:2 ['--steps'] = 20"]


BAD = [
    (ProfileOptions, {"batch_size": 0}, "batch_size (--batch-size)"),
    (ProfileOptions, {"batch_size": 1, "steps": 0}, "steps (--steps)"),
    (ProfileOptions, {"batch_size": 1, "warmup": -1}, "warmup (--warmup)"),
    (ProfileOptions, {"batch_size": 1, "device": "gpu"}, "device (--device)"),
    (ProfileOptions, {"batch_size": 1, "autocast": "fp8"}, "autocast (--autocast)"),
    (ConfirmOptions, {"batch_size": 0}, "batch_size (--batch-size)"),
    (ConfirmOptions, {"batch_size": 1, "steps": 0}, "steps (--steps)"),
    (ConfirmOptions, {"batch_size": 1, "repeats": 0}, "repeats (--repeats)"),
    (ConfirmOptions, {"batch_size": 1, "warmup": -1}, "warmup (--warmup)"),
    (ConfirmOptions, {"batch_size": 1, "loss_tolerance": 2.0}, "loss_tolerance (--loss-tolerance)"),
    (ConfirmOptions, {"batch_size": 1, "loss_tolerance": 0.0}, "loss_tolerance (--loss-tolerance)"),
    (ConfirmOptions, {"batch_size": 1, "max_changes": 0}, "max_changes (--max-changes)"),
    (ConfirmOptions, {"batch_size": 1, "global_batch": 0}, "global_batch (--global-batch)"),
    (TuneOptions, {"global_batch": 8, "trials": 0}, "trials (--trials)"),
    (TuneOptions, {"global_batch": 8, "budget_s": -60.0}, "budget_s (--budget-minutes)"),
    (TuneOptions, {"global_batch": 8, "join_timeout_s": 0.0}, "join_timeout_s (--join-timeout-s)"),
    (TuneOptions, {"global_batch": 8, "interval_width": 1.5}, "interval_width (--interval)"),
    (TuneOptions, {"global_batch": 8, "engines": ("megatron",)}, "engines (--engines)"),
    (Machine, {"device": "tpu"}, "device (--device)"),
    (Machine, {"nproc_per_node": 0}, "nproc_per_node (--nproc-per-node)"),
    (Machine, {"nnodes": 0}, "nnodes (--nnodes)"),
    (Machine, {"margin": 0.95}, "margin (--margin)"),
    (Machine, {"inter_gbps": 0.0}, "inter_gbps (--inter-gbps)"),
    (Machine, {"device_memory": -1}, "device_memory (--device-memory)"),
    (Machine, {"host_memory": "lots"}, "host_memory (--host-memory)"),
]


@pytest.mark.parametrize(("record", "fields", "named"), BAD)
def test_a_bad_value_is_one_line_naming_its_field_and_flag(
    record: type, fields: dict[str, Any], named: str
) -> None:
    """From Python or the CLI, the line names both: the keyword and the flag that set it."""
    with pytest.raises(AutotuneError) as raised:
        record(**fields)
    message = str(raised.value)
    assert message.startswith(f"{named}:") and "\n" not in message


@pytest.mark.parametrize("record", [ProfileOptions, ConfirmOptions, TuneOptions])
def test_the_records_are_frozen_and_keyword_only(record: type) -> None:
    params = dataclasses.fields(record)
    assert all(f.kw_only for f in params)
    required = {f.name: 1 for f in params if f.default is dataclasses.MISSING}
    built = record(**required)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.steps = 1
