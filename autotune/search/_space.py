"""The search space of a tune run: micro-batch, checkpointed blocks, ZeRO stage, precision and,
where several are searched, the sharding engine (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.records import AutotuneError, Plan, fsdp2_equivalent


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
    peak_moment: str | None = None
    """The moment of the step the predicted peak falls at (``optimizer``, ``backward``, ...)."""


Predict = Callable[[Plan], Prediction]


@dataclass(frozen=True)
class SearchSpace:
    """The knobs the study varies; every other knob comes from ``base`` (the policy's plan).

    The global batch is kept: ``grad_accum = global_batch / (world * micro_batch)``,
    so only divisors of the per-rank batch are micro-batch choices.
    ``nproc`` ranks run on each of ``nodes`` nodes.
    """

    global_batch: int
    nproc: int
    blocks: int
    base: Plan
    precisions: tuple[str, ...]
    nnodes: int = 1
    engines: tuple[str, ...] = ("deepspeed",)
    """Who shards a ZeRO stage: ``deepspeed`` and/or ``fsdp2`` (PyTorch's fully_shard)."""

    @property
    def searches_engine(self) -> bool:
        """Whether the engine is a knob of the study (several engines and several ranks)."""
        return len(self.engines) > 1 and self.world > 1

    @property
    def engine(self) -> str:
        """The engine of every plan where the engine is no knob: the one given, else DeepSpeed
        (a stage FSDP2 cannot express, ZeRO-0, stays DeepSpeed's either way)."""
        return self.engines[0] if len(self.engines) == 1 else "deepspeed"

    @property
    def world(self) -> int:
        """Ranks of every plan: ranks per node times nodes."""
        return self.nproc * self.nnodes

    @property
    def micro_batches(self) -> list[int]:
        """Micro-batch choices: divisors of the per-rank batch."""
        return divisors(self.global_batch // self.world)

    @property
    def zero_stages(self) -> list[int]:
        """ZeRO stages 0-3 with several ranks; sharding one rank buys nothing."""
        return [0, 1, 2, 3] if self.world > 1 else [0]

    def size(self) -> int:
        """Number of distinct plans in the space."""
        if self.searches_engine:
            return len(self.all_plans())
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
            "grad_accum": self.global_batch // self.world // micro,
            "checkpoint_blocks": int(params.get("checkpoint_blocks", 0)),
            "zero_stage": stage,
            "precision": params.get("precision", self.precisions[0]),
            "nproc_per_node": self.nproc,
            "nnodes": self.nnodes,
        }
        # Offload only exists where its stage does; otherwise the policy's choice lapses.
        if stage == 0:
            changes["offload_optimizer"] = "none"
        if stage != 3:
            changes["offload_param"] = "none"
        plan = self.base.with_changes(engine="deepspeed", **changes)
        if params.get("engine", self.engine) == "fsdp2":
            # the nearest FSDP2 plan; a stage FSDP2 cannot express stays DeepSpeed's
            return fsdp2_equivalent(plan) or plan
        return plan

    def params(self, plan: Plan) -> dict[str, Any]:
        """The study parameters that select ``plan`` (for enqueueing)."""
        params: dict[str, Any] = {
            "micro_batch": plan.micro_batch,
            "checkpoint_blocks": plan.checkpoint_blocks,
            "precision": plan.precision,
        }
        if self.world > 1:
            params["zero_stage"] = plan.zero_stage
        if self.searches_engine:
            params["engine"] = plan.engine
        return params

    def neighbours(self, plan: Plan) -> list[Plan]:
        """``plan`` at the micro-batches either side of its own in :attr:`micro_batches` (the
        accumulation follows, the global batch kept), every other knob as it is."""
        choices = self.micro_batches
        if plan.micro_batch not in choices:
            return []
        at, params = choices.index(plan.micro_batch), self.params(plan)
        return [
            self.plan({**params, "micro_batch": choices[i]})
            for i in (at - 1, at + 1)
            if 0 <= i < len(choices)
        ]

    def all_plans(self) -> list[Plan]:
        """Every plan of the space (the exhaustive grid)."""
        engines = self.engines if self.searches_engine else (self.engine,)
        plans = [
            self.plan(
                {
                    "micro_batch": m,
                    "checkpoint_blocks": c,
                    "zero_stage": z,
                    "precision": p,
                    "engine": e,
                }
            )  # fmt: skip
            for e in engines
            for p in self.precisions
            for z in self.zero_stages
            for m in self.micro_batches
            for c in range(self.blocks + 1)
        ]
        return list(dict.fromkeys(plans))  # fsdp2 stages 1 and 2 are one plan


def make_space(
    global_batch: int,
    nproc: int,
    blocks: int,
    policy: Plan | None,
    baseline: Plan | None,
    nnodes: int = 1,
    engines: tuple[str, ...] = ("deepspeed",),
) -> SearchSpace:
    """Build the space, checking the global batch splits over the ranks.

    Raises:
        AutotuneError: naming ``--global-batch``, ``--nproc-per-node``, ``--nnodes`` or ``--engines``.
    """
    unknown = [name for name in engines if name not in ("deepspeed", "fsdp2")]
    if unknown or not engines:
        raise AutotuneError(f"--engines: {','.join(unknown) or '(none)'}: use deepspeed, fsdp2")
    if global_batch < 1:
        raise AutotuneError(f"--global-batch: must be at least 1, got {global_batch}")
    if nproc < 1:
        raise AutotuneError(f"--nproc-per-node: must be at least 1, got {nproc}")
    if nnodes < 1:
        raise AutotuneError(f"--nnodes: must be at least 1, got {nnodes}")
    if global_batch % (nproc * nnodes):
        ranks = f"--nproc-per-node {nproc}" + (f" x --nnodes {nnodes}" if nnodes > 1 else "")
        raise AutotuneError(f"--global-batch {global_batch} does not split over {ranks}")
    base = policy or Plan()
    # Without --baseline, tune() measures the user's plan as Plan() has it (fp32): the study
    # must be able to name that precision too, whatever the policy chose.
    users = (baseline or Plan()).precision
    precisions = [base.precision] + ([users] if users != base.precision else [])
    return SearchSpace(
        global_batch, nproc, max(blocks, 0), base, tuple(precisions), nnodes, tuple(engines)
    )


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
