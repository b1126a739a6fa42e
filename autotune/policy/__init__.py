"""The policy stage: rules as data (``default.toml``), named facts, conditions and actions, and the
advisor that applies them in order to a profile (``suggest``). No torch.

Where to change a rule: ``autotune/policy/default.toml``; a new fact: ``_facts.py`` and
``_profile_facts.py``; a new action: ``_actions.py``.
"""

from __future__ import annotations

from autotune.policy._actions import ACTIONS, Action, Changes, Params, action_params
from autotune.policy._advisor import policy_plan, suggest
from autotune.policy._conditions import TESTS, Clause, ClauseError, parse_clause
from autotune.policy._fact_builder import FactBuilder, baseline_plan, static_facts
from autotune.policy._facts import FACT_KINDS, FactKind, Facts
from autotune.policy._loader import Policy, Rule, default_policy_path, load_policy
from autotune.policy._records import Evidence, Predicted, Suggestion, SuggestRecord

__all__ = [
    "ACTIONS",
    "Action",
    "Changes",
    "Clause",
    "ClauseError",
    "Evidence",
    "FACT_KINDS",
    "FactBuilder",
    "FactKind",
    "Facts",
    "Params",
    "Policy",
    "Predicted",
    "Rule",
    "SuggestRecord",
    "Suggestion",
    "TESTS",
    "action_params",
    "baseline_plan",
    "default_policy_path",
    "load_policy",
    "parse_clause",
    "policy_plan",
    "static_facts",
    "suggest",
]
