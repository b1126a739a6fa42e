"""The search space of a tune run: micro-batch, checkpointed blocks, ZeRO stage, precision (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.records import AutotuneError, Plan


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Prediction:
    """What the estimate says about one plan before it runs."""

    fits: bool
    peak_bytes: int | None = None
    source: str | None = None
    reason: str | None = None
    step_time_ratio: float | None = None
    """Predicted step time over a reference plan's (``None``: not predicted)."""


Predict = Callable[[Plan], Prediction]


@dataclass(frozen=True)
class SearchSpace:
    """The knobs the study varies; every other knob comes from ``base`` (the policy's plan).

    The global batch is kept: ``grad_accum = global_batch / (nproc * micro_batch)``,
    so only divisors of the per-rank batch are micro-batch choices.
    """

    global_batch: int
    nproc: int
    blocks: int
    base: Plan
    precisions: tuple[str, ...]

    @property
    def micro_batches(self) -> list[int]:
        """Micro-batch choices: divisors of the per-rank batch."""
        return divisors(self.global_batch // self.nproc)

    @property
    def zero_stages(self) -> list[int]:
        """ZeRO stages 0-3 with several ranks; sharding one rank buys nothing."""
        return [0, 1, 2, 3] if self.nproc > 1 else [0]

    def size(self) -> int:
        """Number of distinct plans in the space."""
        return (
            len(self.micro_batches)
            * (self.blocks + 1)
            * len(self.zero_stages)
            * len(self.precisions)
        )

    def plan(self, params: dict[str, Any]) -> Plan:
        """The plan of one point of the space."""
        stage = int(params.get("zero_stage", 0))
        micro = int(params["micro_batch"])
        changes: dict[str, Any] = {
            "micro_batch": micro,
            "grad_accum": self.global_batch // self.nproc // micro,
            "checkpoint_blocks": int(params.get("checkpoint_blocks", 0)),
            "zero_stage": stage,
            "precision": params.get("precision", self.precisions[0]),
            "gpus_per_node": self.nproc,
            "nodes": 1,
        }
        # Offload only exists where its stage does; otherwise the policy's choice lapses.
        if stage == 0:
            changes["offload_optimizer"] = "none"
        if stage != 3:
            changes["offload_param"] = "none"
        return self.base.with_changes(**changes)

    def params(self, plan: Plan) -> dict[str, Any]:
        """The study parameters that select ``plan`` (for enqueueing)."""
        params: dict[str, Any] = {
            "micro_batch": plan.micro_batch,
            "checkpoint_blocks": plan.checkpoint_blocks,
            "precision": plan.precision,
        }
        if self.nproc > 1:
            params["zero_stage"] = plan.zero_stage
        return params

    def all_plans(self) -> list[Plan]:
        """Every plan of the space (the exhaustive grid)."""
        return [
            self.plan({"micro_batch": m, "checkpoint_blocks": c, "zero_stage": z, "precision": p})
            for p in self.precisions
            for z in self.zero_stages
            for m in self.micro_batches
            for c in range(self.blocks + 1)
        ]


def make_space(
    global_batch: int, nproc: int, blocks: int, policy: Plan | None, baseline: Plan | None
) -> SearchSpace:
    """Build the space, checking the global batch splits over the ranks.

    Raises:
        AutotuneError: naming ``--global-batch`` or ``--nproc``.
    """
    if global_batch < 1:
        raise AutotuneError(f"--global-batch: must be at least 1, got {global_batch}")
    if nproc < 1:
        raise AutotuneError(f"--nproc: must be at least 1, got {nproc}")
    if global_batch % nproc:
        raise AutotuneError(f"--global-batch {global_batch} does not split over --nproc {nproc}")
    base = policy or Plan()
    precisions = [base.precision]
    if baseline is not None and baseline.precision not in precisions:
        precisions.append(baseline.precision)
    return SearchSpace(global_batch, nproc, max(blocks, 0), base, tuple(precisions))


def same_but_micro_batch(a: Plan, b: Plan) -> bool:
    """Whether two plans differ at most in micro-batch and accumulation."""
    skip = {"micro_batch", "grad_accum"}
    return all(getattr(a, k) == getattr(b, k) for k in Plan.model_fields if k not in skip)


def oom_lesson(plan: Plan, ooms: list[Plan]) -> Plan | None:
    """A plan that ran out of memory with the same knobs and a micro-batch no larger."""
    for failed in ooms:
        if same_but_micro_batch(plan, failed) and failed.micro_batch <= plan.micro_batch:
            return failed
    return None
