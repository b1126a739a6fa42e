"""The policy loader: the default policy, extension, and one-line errors naming file, rule, field."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.confirm import decide, median_interval
from autotune.policy import Facts, load_policy, parse_clause
from autotune.records import AutotuneError, Plan

GOOD_RULE = """
[[rule]]
id = "{id}"
order = {order}
all = [{clauses}]
action = "{action}"
reason = "because"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "my.toml"
    path.write_text(text)
    return path


def rule(
    id: str = "r1",
    order: int = 10,
    clauses: str = '["input_share", ">=", 0.2]',
    action: str = "compile",
) -> str:
    return GOOD_RULE.format(id=id, order=order, clauses=clauses, action=action)


def test_default_policy_loads_in_documented_order() -> None:
    ids = [rule.id for rule in load_policy().rules]
    assert ids[0] == "input_bound"
    for earlier, later in [
        ("mixed_precision", "activation_checkpointing"),
        ("activation_checkpointing", "keep_global_batch"),
        ("keep_global_batch", "zero_1"),
        ("zero_1", "zero_2"),
        ("zero_2", "zero_3"),
        ("zero_2", "offload_optimizer"),
    ]:
        assert ids.index(earlier) < ids.index(later)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (
            rule(clauses='["input_shar", ">=", 0.2]'),
            ["rule 'r1'", "field all", "unknown fact 'input_shar'"],
        ),
        (rule(action="make_faster"), ["rule 'r1'", "field action", "unknown action 'make_faster'"]),
        (rule(clauses='["input_share", ">=", 1.5]'), ["rule 'r1'", "field all", "not within 0..1"]),
        (
            rule(clauses='["input_share", ">=", "high"]'),
            ["rule 'r1'", "field all", "must be a number"],
        ),
        (rule(clauses='["fits", ">=", true]'), ["rule 'r1'", "field all", "use == or !="]),
        (rule(clauses='["world_size", "~", 2]'), ["rule 'r1'", "field all", "unknown test '~'"]),
        (
            rule() + rule(id="r2", action="compile"),
            ["rule 'r2'", "field action", "sets compile at order 10"],
        ),
        (rule() + rule(), ["rule 'r1'", "field id", "defined twice"]),
        (rule().replace('reason = "because"\n', ""), ["rule 'r1'", "field reason", "missing"]),
        (rule().replace("order = 10", "order = -1"), ["rule 'r1'", "field order", "non-negative"]),
        (rule() + 'color = "red"\n', ["rule 'r1'", "field color", "unknown field"]),
        (
            rule(action="zero") + "params = { stage = 5 }\n",
            ["rule 'r1'", "field params", "stage must be one of"],
        ),
        (
            rule(action="zero") + "params = { level = 1 }\n",
            ["rule 'r1'", "field params", "unknown parameter 'level'"],
        ),
        ('extends = "default"\ndisable = ["nope"]\n', ["field disable", "no default rule 'nope'"]),
        ('extends = "other"\n', ["field extends"]),
        ("[[rule]\n", ["not valid TOML"]),
    ],
)
def test_bad_policy_is_one_line_naming_file_rule_and_field(
    tmp_path: Path, text: str, fragments: list[str]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(AutotuneError) as info:
        load_policy(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    for fragment in fragments:
        assert fragment in message


def test_same_knob_at_different_orders_is_allowed(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, rule() + rule(id="r2", order=11)))
    assert [r.id for r in policy.rules] == ["r1", "r2"]


def test_extends_replaces_by_id_adds_and_disables(tmp_path: Path) -> None:
    text = (
        'extends = "default"\ndisable = ["compile"]\n'
        + rule(id="input_bound", order=5)
        + rule(id="mine", order=200)
    )
    ids = [r.id for r in load_policy(write(tmp_path, text)).rules]
    assert ids[0] == "input_bound" and ids[-1] == "mine"
    assert "compile" not in ids and "zero_2" in ids
    replaced = next(r for r in load_policy(write(tmp_path, text)).rules if r.id == "input_bound")
    assert replaced.action == "compile"


def test_without_extends_the_file_replaces_the_default(tmp_path: Path) -> None:
    assert [r.id for r in load_policy(write(tmp_path, rule())).rules] == ["r1"]


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(AutotuneError, match="no such policy file"):
        load_policy(tmp_path / "absent.toml")


@pytest.mark.parametrize(
    ("clause", "value", "expected"),
    [
        (["input_share", ">=", 0.2], 0.3, True),
        (["input_share", ">=", 0.2], 0.1, False),
        (["input_share", ">=", 0.2], None, False),  # unknown is never evidence
        (["input_share", "unknown"], None, True),
        (["input_share", "known"], None, False),
    ],
)
def test_clause_over_unknown_fact_is_false(
    clause: list[object], value: float | None, expected: bool
) -> None:
    facts = Facts(plan=Plan(), device_type="cpu", input_share=value)
    assert parse_clause(clause).holds(facts) is expected


def test_plan_knobs_are_facts() -> None:
    facts = Facts(plan=Plan(zero_stage=2, nproc_per_node=2), device_type="cuda")
    assert parse_clause(["zero_stage", "==", 2]).holds(facts)
    assert not parse_clause(["precision", "!=", "fp32"]).holds(facts)


def test_median_interval_is_min_max_for_five_and_narrows_with_more() -> None:
    assert median_interval([5, 1, 3, 2, 4]) == (1, 5)
    low, high = median_interval(list(range(20)))
    assert 0 < low < 10 < high < 19


@pytest.mark.parametrize(
    ("ratios", "loss_after", "needed", "kept", "why"),
    [
        ([0.3, 0.35, 0.32, 0.4, 0.31], 1.0, False, True, "faster"),
        ([5.0, 6.0, 5.5, 6.2, 4.9], 1.0, False, False, "slower"),
        ([0.9, 1.1, 0.95, 1.05, 1.0], 1.0, False, False, "not clearly faster"),
        ([1.3, 1.2, 1.25, 1.3, 1.28], 1.0, True, True, "needed to fit"),
        ([0.3, 0.35, 0.32, 0.4, 0.31], 1.5, False, False, "loss moved"),
    ],
)
def test_decide(ratios: list[float], loss_after: float, needed: bool, kept: bool, why: str) -> None:
    verdict = decide(ratios, 1.0, loss_after, loss_tolerance=0.05, needed_to_fit=needed)
    assert verdict.kept is kept
    assert verdict.why.startswith(why)
