"""The rule policy: named facts, condition clauses, named actions, and the TOML loader."""

from autotune.policy._actions import ACTIONS, Action
from autotune.policy._conditions import TESTS, Clause
from autotune.policy._facts import FACT_KINDS, Facts
from autotune.policy._loader import Policy, Rule, default_policy_path, load_policy

__all__ = [
    "ACTIONS",
    "FACT_KINDS",
    "TESTS",
    "Action",
    "Clause",
    "Facts",
    "Policy",
    "Rule",
    "default_policy_path",
    "load_policy",
]
