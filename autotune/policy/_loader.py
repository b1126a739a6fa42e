"""Reading a policy TOML file into checked rules; every mistake is one line naming file, rule, field."""

from __future__ import annotations

import importlib.resources
import tomllib
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

from autotune.policy._actions import ACTIONS, action_params
from autotune.policy._conditions import Clause, ClauseError, parse_clause
from autotune.policy._facts import Facts
from autotune.records import AutotuneError

_RULE_KEYS = {"id", "order", "all", "any", "action", "params", "reason"}
_TOP_KEYS = {"rule", "extends", "disable", "description"}


@dataclass(frozen=True)
class Rule:
    """One rule: when all of ``all`` and at least one of ``any`` hold, ``action`` proposes changes."""

    id: str
    order: int
    action: str
    reason: str
    all: tuple[Clause, ...] = ()
    any: tuple[Clause, ...] = ()
    params: tuple[tuple[str, object], ...] = ()

    def applies(self, facts: Facts) -> bool:
        """Whether the rule's condition holds for these facts."""
        if not all(clause.holds(facts) for clause in self.all):
            return False
        return not self.any or any(clause.holds(facts) for clause in self.any)

    def changes(self, facts: Facts) -> dict[str, object]:
        """The knob changes the rule's action proposes for these facts."""
        return ACTIONS[self.action].fn(facts, dict(self.params))

    def clauses(self) -> tuple[Clause, ...]:
        """Every clause of the condition, ``all`` first."""
        return self.all + self.any


@dataclass(frozen=True)
class Policy:
    """Rules in the order they are tried; rules sharing an ``order`` are one step."""

    path: str
    rules: tuple[Rule, ...]


def default_policy_path() -> Traversable:
    """The shipped default policy, ``autotune/policy/default.toml``, read as package data.

    ``importlib.resources`` finds it in any install (editable, wheel or zip).
    """
    return importlib.resources.files("autotune.policy").joinpath("default.toml")


def load_policy(path: str | Path | None = None) -> Policy:
    """Read and check a policy file; ``None`` reads the default policy.

    A file with ``extends = "default"`` starts from the default rules: a rule with
    an existing id replaces it, a new id is added, ``disable = [ids]`` drops rules.
    Without ``extends`` the file's rules replace the default ones.

    Raises:
        AutotuneError: naming the file, the rule id and the field at fault.
    """
    source: Path | Traversable = Path(path) if path is not None else default_policy_path()
    data = _read_toml(source)
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise AutotuneError(f"{source}: unknown top-level key {sorted(unknown)[0]!r}")
    rules = {rule.id: rule for rule in _parse_rules(source, data.get("rule", []))}
    extends = data.get("extends")
    if extends is not None:
        if extends != "default" or path is None:
            raise AutotuneError(f'{source}: field extends: only "default" can be extended')
        base = {rule.id: rule for rule in load_policy(None).rules}
        for rule_id in _disabled(source, data.get("disable", []), base):
            del base[rule_id]
        rules = {**base, **rules}
    elif "disable" in data:
        raise AutotuneError(f'{source}: field disable: only valid with extends = "default"')
    ordered = tuple(sorted(rules.values(), key=lambda rule: rule.order))
    _check_conflicts(source, ordered)
    return Policy(str(source), ordered)


def _read_toml(source: Path | Traversable) -> dict[str, object]:
    try:
        with source.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise AutotuneError(f"{source}: no such policy file") from None
    except OSError as exc:
        raise AutotuneError(f"{source}: cannot read policy: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise AutotuneError(f"{source}: not valid TOML: {exc}") from None


def _disabled(source: Path | Traversable, raw: object, base: dict[str, Rule]) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise AutotuneError(f"{source}: field disable: must be a list of rule ids")
    for rule_id in raw:
        if rule_id not in base:
            raise AutotuneError(f"{source}: field disable: no default rule {rule_id!r}")
    return list(raw)


def _parse_rules(source: Path | Traversable, raw: object) -> list[Rule]:
    if not isinstance(raw, list):
        raise AutotuneError(f"{source}: field rule: write rules as [[rule]] tables")
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, table in enumerate(raw):
        rule = _parse_rule(source, index, table)
        if rule.id in seen:
            raise AutotuneError(f"{source}: rule {rule.id!r}: field id: defined twice")
        seen.add(rule.id)
        rules.append(rule)
    return rules


class _RuleError(Exception):
    """One bad field of one rule; the caller adds the file and the rule."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field}: {message}")


def _parse_rule(source: Path | Traversable, index: int, table: dict[str, object]) -> Rule:
    rule_id = table.get("id")
    where = f"rule {rule_id!r}" if isinstance(rule_id, str) else f"rule #{index + 1}"
    try:
        return _rule_from_table(table)
    except _RuleError as exc:
        raise AutotuneError(f"{source}: {where}: {exc}") from None


def _rule_from_table(table: dict[str, object]) -> Rule:
    missing = sorted(_RULE_KEYS - {"any", "all", "params"} - set(table))
    if missing:
        raise _RuleError(missing[0], "missing")
    unknown = sorted(set(table) - _RULE_KEYS)
    if unknown:
        raise _RuleError(unknown[0], f"unknown field (known: {', '.join(sorted(_RULE_KEYS))})")
    rule_id, order, action, reason = table["id"], table["order"], table["action"], table["reason"]
    if not isinstance(rule_id, str) or not rule_id:
        raise _RuleError("id", "must be a non-empty string")
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise _RuleError("order", f"must be a non-negative integer, not {order!r}")
    if not isinstance(action, str) or action not in ACTIONS:
        known = ", ".join(sorted(ACTIONS))
        raise _RuleError("action", f"unknown action {action!r} (known: {known})")
    if not isinstance(reason, str) or not reason.strip():
        raise _RuleError("reason", "must be a non-empty string")
    every, some = _parse_clauses(table, "all"), _parse_clauses(table, "any")
    if not every and not some:
        raise _RuleError("all", "a rule needs at least one clause")
    params = _parse_params(action, table.get("params", {}))
    return Rule(rule_id, order, action, reason.strip(), every, some, tuple(params.items()))


def _parse_params(action: str, raw: object) -> dict[str, object]:
    if not isinstance(raw, dict):
        raise _RuleError("params", "must be a table")
    try:
        return action_params(action, raw)
    except ValueError as exc:
        raise _RuleError("params", str(exc)) from None


def _parse_clauses(table: dict[str, object], key: str) -> tuple[Clause, ...]:
    raw = table.get(key, [])
    if not isinstance(raw, list):
        raise _RuleError(key, "must be a list of [fact, test, threshold]")
    try:
        return tuple(parse_clause(item) for item in raw)
    except ClauseError as exc:
        raise _RuleError(key, str(exc)) from None


def _check_conflicts(source: Path | Traversable, rules: tuple[Rule, ...]) -> None:
    """Rules tried at the same step must not set the same knob."""
    for position, rule in enumerate(rules):
        for other in rules[position + 1 :]:
            if other.order != rule.order:
                break
            shared = ACTIONS[rule.action].knobs & ACTIONS[other.action].knobs
            if shared:
                raise AutotuneError(
                    f"{source}: rule {other.id!r}: field action: sets {' and '.join(sorted(shared))} "
                    f"at order {rule.order}, as rule {rule.id!r} does"
                )
