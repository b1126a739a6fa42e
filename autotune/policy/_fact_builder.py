"""Facts for a plan: measured numbers from a profile, predictions from the estimate for other plans."""

from __future__ import annotations

import re

from autotune.estimator import (
    FACT_OF_FIGURE,
    ModelFacts,
    PlanEstimate,
    bf16_ratio,
    estimate_plan,
    flagged_figures,
)
from autotune.policy._actions import per_rank_batch
from autotune.policy._facts import Facts, Source
from autotune.records import AUTOCAST_PLAN_PRECISION, Machine, Plan, ProfileRecord

_TRANSFORMER_BLOCK = re.compile(r"Decoder|Encoder|Transformer|Attention|GPT|Bert|Llama", re.I)


# transformers' attn_implementation values that are plan knobs; others stay "default"
_ATTENTION = {name: name for name in ("eager", "sdpa", "flash_attention_2")}


def baseline_plan(profile: ProfileRecord, machine: Machine) -> Plan:
    """The plan the profile measured, spread over the machine's devices."""
    stack = profile.model.block_stack
    return Plan(
        precision=AUTOCAST_PLAN_PRECISION[profile.config.precision],
        micro_batch=profile.config.batch_size,
        checkpoint_blocks=stack.count if stack and profile.config.checkpointing else 0,
        attention=_ATTENTION.get(profile.model.attention or "", "default"),  # type: ignore[arg-type]
        nproc_per_node=machine.nproc_per_node,
        nnodes=machine.nnodes,
    )


def static_facts(
    profile: ProfileRecord, machine: Machine, global_batch: int | None = None
) -> dict[str, object]:
    """Facts that do not depend on the plan: the device, the model, the machine. A figure
    outside its physical bounds is unknown here (:func:`refused_facts`)."""
    caps = profile.environment.capabilities
    model = profile.model
    ratio = bf16_ratio(profile)
    capability = float(caps.compute_capability) if caps.compute_capability else None
    is_cuda = profile.config.device == "cuda"
    # Unmeasured speed: Ampere (8.0) and later have bf16 tensor cores.
    fast_bf16 = (
        ratio > 1.0
        if ratio is not None
        else bool(caps.bf16_supported and is_cuda and capability is not None and capability >= 8.0)
    )
    block_class = model.block_stack.block_class if model.block_stack else ""
    return {
        "device_type": profile.config.device,
        "device_memory": machine.device_memory,
        "world_size": machine.world_size,
        "nnodes": machine.nnodes,
        "nproc_per_node": machine.nproc_per_node,
        "inter_gbps": machine.inter_gbps,
        "bf16_supported": caps.bf16_supported,
        "fp16_supported": caps.fp16_supported,
        "bf16_speed_ratio": ratio,
        "fast_bf16": fast_bf16,
        "compute_capability": capability,
        "sdpa_available": caps.sdpa_available,
        "flash_attn_available": caps.flash_attn_available,
        "has_block_stack": model.block_stack is not None,
        "block_count": model.block_stack.count if model.block_stack else None,
        "is_transformer": model.num_attention_heads is not None
        or bool(_TRANSFORMER_BLOCK.search(block_class)),
        "target_global_batch": global_batch,
    }


def refused_facts(profile: ProfileRecord) -> dict[str, str]:
    """Facts whose measured figure is flagged as impossible (fact -> why): they are unknown,
    never evidence, whether the profile flagged them or is an older record checked now."""
    flags = flagged_figures(profile)
    return {fact: flags[figure] for figure, fact in FACT_OF_FIGURE.items() if figure in flags}


_STATIC_SOURCES: dict[str, Source] = {
    "device_type": "measured",
    "bf16_supported": "measured",
    "fp16_supported": "measured",
    "bf16_speed_ratio": "measured",
    "fast_bf16": "measured",
    "compute_capability": "measured",
    "sdpa_available": "measured",
    "flash_attn_available": "measured",
    "has_block_stack": "measured",
    "block_count": "measured",
    "is_transformer": "measured",
}


class FactBuilder:
    """Builds :class:`Facts` for any plan of one profiled model on one machine."""

    def __init__(self, profile: ProfileRecord, model: ModelFacts, machine: Machine,
                 global_batch: int | None = None) -> None:  # fmt: skip
        self.profile = profile
        self.model = model
        self.machine = machine
        self.global_batch = global_batch
        self.baseline = baseline_plan(profile, machine)
        # The profile's figures that cannot be true (dotted key -> why): none is evidence.
        self.flags = flagged_figures(profile)
        self._static = static_facts(profile, machine, global_batch)
        self._refused = refused_facts(profile)
        self._cache: dict[Plan, PlanEstimate] = {}
        self._facts: dict[Plan, Facts] = {}

    def estimate(self, plan: Plan) -> PlanEstimate:
        """The estimate of one plan (cached: the searches below ask for many)."""
        if plan not in self._cache:
            self._cache[plan] = estimate_plan(self.model, plan, machine=self.machine)
        return self._cache[plan]

    def facts(self, plan: Plan) -> Facts:
        """Facts for ``plan``: measured where it is the profiled plan, else predicted (cached:
        every rule group asks again until a change is made)."""
        if plan not in self._facts:
            self._facts[plan] = self._build_facts(plan)
        return self._facts[plan]

    def _build_facts(self, plan: Plan) -> Facts:
        measured = self._same_memory_as_baseline(plan)
        memory = self._measured_memory() if measured else self._predicted_memory(plan)
        input_share, input_source = self.input_share(plan)
        sources: dict[str, Source] = dict(_STATIC_SOURCES)
        kind: Source = "measured" if measured else "formula"
        for name in ("peak_bytes", "fits", "headroom", "activation_share", "model_state_share"):
            sources[name] = kind
        for name in (
            "checkpoint_blocks_to_fit",
            "micro_batch_to_fit",
            "micro_batch_for_global_batch",
            "step_time_ratio",
            "amp_peak_ratio",
            "checkpoint_micro_batch",
            "checkpoint_micro_batch_blocks",
            "checkpoint_micro_batch_ratio",
        ):
            sources[name] = "formula"
        sources["input_share"] = input_source
        for name in self._refused:
            sources[name] = "refused"
        if self.machine.budget_source == "available_ram":
            sources["device_memory"] = "measured"
        gain = self.checkpoint_gain(plan)
        return Facts(
            plan=plan,
            **self._static,  # type: ignore[arg-type]
            **memory,  # type: ignore[arg-type]
            input_share=input_share,
            step_time_ratio=self.estimate(plan).predicted_step_time_ratio,
            checkpoint_blocks_to_fit=self._smallest_checkpoint_that_fits(plan),
            micro_batch_to_fit=self._largest_micro_batch_that_fits(plan),
            micro_batch_for_global_batch=self._micro_batch_for_global_batch(plan),
            amp_peak_ratio=self._amp_peak_ratio(plan),
            checkpoint_micro_batch=gain[0].micro_batch if gain else None,
            checkpoint_micro_batch_blocks=gain[0].checkpoint_blocks if gain else None,
            checkpoint_micro_batch_ratio=gain[1] if gain else None,
            sources=sources,
        )

    def checkpoint_gain(self, plan: Plan) -> tuple[Plan, float] | None:
        """A larger micro-batch that fits only with checkpointing and is predicted faster
        than every plan without checkpointing that fits; with its step-time ratio to the
        fastest of those (``None``: checkpointing buys no speed here).

        Candidates keep the samples per device per step (the target global batch, else
        the plan's micro-batch x accumulation), with the fewest blocks that fit.
        """
        blocks = self._static["block_count"]
        if self.machine.device_memory is None or not isinstance(blocks, int) or not blocks:
            return None
        if self._per_device_samples(plan) % plan.micro_batch:
            return None
        # Every candidate, this plan included, at the same samples per step.
        plain = self._with_micro_batch(plan.with_changes(checkpoint_blocks=0), plan.micro_batch)
        options = [self._with_micro_batch(plain, m) for m in self._larger_micro_batches(plan)]
        fitting = [p for p in [plain, *options] if self._fits(p)]
        buying = []
        for option in options:
            if option in fitting:
                continue
            k = self._smallest_checkpoint_that_fits(option)
            if k is not None:
                buying.append(option.with_changes(checkpoint_blocks=k))
        best_plain = min((t for t in map(self._seconds, fitting) if t), default=None)
        timed = [(p, t) for p, t in ((p, self._seconds(p)) for p in buying) if t]
        if best_plain is None or not timed:
            return None
        best, seconds = min(timed, key=lambda pair: pair[1])
        return (best, seconds / best_plain) if seconds < best_plain else None

    def _seconds(self, plan: Plan) -> float | None:
        return self.estimate(plan).predicted_step_time_ratio

    def _per_device_samples(self, plan: Plan) -> int:
        return per_rank_batch(self.global_batch, plan)

    def _larger_micro_batches(self, plan: Plan) -> list[int]:
        samples = self._per_device_samples(plan)
        return [m for m in range(plan.micro_batch + 1, samples + 1) if samples % m == 0]

    def _with_micro_batch(self, plan: Plan, micro: int) -> Plan:
        return plan.with_changes(micro_batch=micro,
                                 grad_accum=self._per_device_samples(plan) // micro)  # fmt: skip

    def input_share(self, plan: Plan) -> tuple[float | None, Source]:
        """Share of the step spent waiting for data: measured, or predicted with workers.

        With ``w`` workers loading runs beside compute, so a step takes
        ``max(compute, load / w)`` and only the excess is waiting.
        """
        time = self.profile.time
        if time.step <= 0:
            return None, "measured"
        if plan.dataloader_workers <= self.baseline.dataloader_workers:
            return time.dataloader / time.step, "measured"
        compute = max(time.step - time.dataloader, 0.0)
        load = time.dataloader / plan.dataloader_workers
        step = max(compute, load)
        return (step - compute) / step if step > 0 else 0.0, "formula"

    def _same_memory_as_baseline(self, plan: Plan) -> bool:
        """Whether the profile's measured memory holds for ``plan`` (only loader knobs differ)."""
        loader = {"dataloader_workers", "pin_memory"}
        return plan.with_changes(**{k: getattr(self.baseline, k) for k in loader}) == self.baseline

    def _amp_peak_ratio(self, plan: Plan) -> float | None:
        """Predicted peak under bf16 autocast over the plan's own (both by formula)."""
        if plan.precision != "fp32":
            return None
        now = self.estimate(plan).memory.peak
        return (
            self.estimate(plan.with_changes(precision="amp_bf16")).memory.peak / now
            if now
            else None
        )

    def _measured_memory(self) -> dict[str, object]:
        memory = self.profile.memory
        states = memory.parameters + memory.gradients + memory.optimizer_states
        activations = memory.activations + memory.autocast_weight_copies
        return self._memory_facts(
            memory.peak, states, activations, states + activations + memory.buffers
        )

    def _predicted_memory(self, plan: Plan) -> dict[str, object]:
        est = self.estimate(plan).memory
        states = est.parameters + est.gradients + est.optimizer_states
        activations = est.activations + est.autocast_weight_copies
        total = states + activations + est.buffers + est.temporaries
        return self._memory_facts(est.peak, states, activations, total)

    def _memory_facts(
        self, peak: int, states: int, activations: int, total: int
    ) -> dict[str, object]:
        budget = self.machine.device_memory
        return {
            "peak_bytes": peak,
            "fits": self.machine.fits(peak),
            "headroom": None if not budget else (budget - peak) / budget,
            "activation_share": activations / total if total else None,
            "model_state_share": states / total if total else None,
        }

    def _fits(self, plan: Plan) -> bool:
        if self._same_memory_as_baseline(plan):
            return bool(self._measured_memory()["fits"])
        return bool(self.estimate(plan).fits)

    def _smallest_checkpoint_that_fits(self, plan: Plan) -> int | None:
        blocks = self._static["block_count"]
        if self.machine.device_memory is None or not isinstance(blocks, int):
            return None
        # Memory falls as more blocks are checkpointed, so the first k that fits is found by bisection.
        low, high = 0, blocks
        if not self._fits(plan.with_changes(checkpoint_blocks=high)):
            return None
        while low < high:
            middle = (low + high) // 2
            if self._fits(plan.with_changes(checkpoint_blocks=middle)):
                high = middle
            else:
                low = middle + 1
        return low

    def _micro_batch_for_global_batch(self, plan: Plan) -> int | None:
        """The largest micro-batch <= the plan's that divides the per-rank samples and fits
        with the accumulation that makes them up (``None``: no budget, a target that does
        not split over the ranks, or none fits)."""
        target = self.global_batch
        if self.machine.device_memory is None or (target and target % plan.world_size):
            return None
        samples = self._per_device_samples(plan)
        for micro in range(min(plan.micro_batch, samples), 0, -1):
            if samples % micro == 0 and self._fits(self._with_micro_batch(plan, micro)):
                return micro
        return None

    def _largest_micro_batch_that_fits(self, plan: Plan) -> int | None:
        if self.machine.device_memory is None:
            return None
        low, high = 1, plan.micro_batch
        if not self._fits(plan.with_changes(micro_batch=low)):
            return None
        while low < high:
            middle = (low + high + 1) // 2
            if self._fits(plan.with_changes(micro_batch=middle)):
                low = middle
            else:
                high = middle - 1
        return low
