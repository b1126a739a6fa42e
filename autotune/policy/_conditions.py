"""Condition clauses: a named test of one named fact against a threshold, checked at load time."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.policy._facts import FACT_KINDS, Facts

_ORDERED: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}
_EQUALITY: dict[str, Callable[[Any, Any], bool]] = {"==": operator.eq, "!=": operator.ne}
_PRESENCE = ("known", "unknown")
TESTS = (*_ORDERED, *_EQUALITY, *_PRESENCE)
"""The test names a clause may use."""

_NUMERIC = ("share", "ratio", "count", "bytes", "gbps", "fraction")


class ClauseError(ValueError):
    """A clause that cannot be checked; the message names the bad part."""


@dataclass(frozen=True)
class Clause:
    """``fact test threshold``, e.g. ``input_share >= 0.2``; false when the fact is unknown."""

    fact: str
    test: str
    threshold: object = None

    def holds(self, facts: Facts) -> bool:
        """Whether the clause is true of these facts (never true of an unknown fact)."""
        value = facts.value(self.fact)
        if self.test in _PRESENCE:
            return (value is None) == (self.test == "unknown")
        if value is None:
            return False
        test = _ORDERED.get(self.test) or _EQUALITY[self.test]
        return bool(test(value, self.threshold))

    def describe(self) -> str:
        """The clause as written, for messages and reasons."""
        if self.test in _PRESENCE:
            return f"{self.fact} {self.test}"
        return f"{self.fact} {self.test} {self.threshold!r}"


def parse_clause(raw: object) -> Clause:
    """Read ``[fact, test, threshold]`` (or ``[fact, "known"|"unknown"]``) and check it.

    Raises:
        ClauseError: unknown fact or test, or a threshold of the wrong kind or range.
    """
    if not isinstance(raw, list) or len(raw) not in (2, 3) or not isinstance(raw[0], str):
        raise ClauseError(f"{raw!r} is not [fact, test, threshold]")
    fact, test = raw[0], raw[1]
    kind = FACT_KINDS.get(fact)
    if kind is None:
        raise ClauseError(f"unknown fact {fact!r} (known: {', '.join(sorted(FACT_KINDS))})")
    if test not in TESTS:
        raise ClauseError(f"unknown test {test!r} (known: {', '.join(TESTS)})")
    if test in _PRESENCE:
        if len(raw) != 2:
            raise ClauseError(f"{test!r} takes no threshold")
        return Clause(fact, test)
    if len(raw) != 3:
        raise ClauseError(f"{fact} {test} needs a threshold")
    _check_threshold(fact, kind, test, raw[2])
    return Clause(fact, test, raw[2])


def _check_threshold(fact: str, kind: str, test: str, threshold: object) -> None:
    if kind in ("bool", "str"):
        wanted = bool if kind == "bool" else str
        if test not in _EQUALITY:
            raise ClauseError(f"{fact} is a {kind}: use == or !=, not {test!r}")
        if not isinstance(threshold, wanted):
            raise ClauseError(f"threshold for {fact} must be a {kind}, not {threshold!r}")
        return
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ClauseError(f"threshold for {fact} must be a number, not {threshold!r}")
    if kind == "share" and not 0.0 <= threshold <= 1.0:
        raise ClauseError(f"threshold for {fact} is a share: {threshold!r} is not within 0..1")
    if kind in ("count", "bytes", "gbps", "ratio") and threshold < 0:
        raise ClauseError(f"threshold for {fact} must not be negative: {threshold!r}")
