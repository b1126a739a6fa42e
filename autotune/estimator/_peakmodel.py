"""The peak of a training step: what is live at each moment it can peak, rescaled from a measured one.

Pure: no torch. A step peaks at one of three moments: the start of backward
(every saved activation, no gradients yet under torch), the recompute of a
checkpointed block (the gradients of the blocks after it, the inputs of the
blocks before it, one block's full activations) or the optimizer step (all
model states). A profile says which moment peaked and what was live then;
that moment is rebuilt for a new plan by scaling each category by the cost
model's ratio new/profiled, the others come from the cost model alone.
The moments' ``temporaries`` are the ones the plan fixes in advance (DeepSpeed's
gradient buckets); the measured ones scale on top of them.
"""

from __future__ import annotations

from autotune.estimator import _costmodel as cm
from autotune.estimator import _fsdp as fsdp
from autotune.estimator import _zero as zero
from autotune.estimator._modelfacts import (
    Baseline,
    ModelFacts,
    Source,
    TracedMoment,
    activation_spec,
)
from autotune.records import AtPeak, Plan

Moments = dict[str, dict[str, float]]
CATEGORIES = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_states",
    "activations",
    "autocast_weight_copies",
    "temporaries",
)


def moments(facts: ModelFacts, plan: Plan) -> tuple[Moments, zero.StateBytes, Source]:
    """Bytes of every category at each moment the plan's step can peak.

    The temporaries counted here are the ones the plan fixes in advance: DeepSpeed's
    gradient buckets and, for ZeRO engines, what :func:`zero.engine_moments` lists
    (the reduction's flattened copy, the optimizer's temporaries at its step).
    """
    states = fsdp.plan_states(facts, plan)
    buckets = zero.bucket_bytes(facts, plan)
    backward_grads = states.gradients - states.step_gradients
    spec, _ = activation_spec(facts, plan.precision)
    layers, k, b = facts.num_layers, min(plan.checkpoint_blocks, facts.num_layers), plan.micro_batch
    fig = spec.figures(layers)
    amp = plan.precision.startswith("amp")
    common = {
        "parameters": states.parameters,
        "buffers": float(facts.buffers),
        "optimizer_states": states.optimizer_states,
        "temporaries": buckets,
    }
    copies = spec.weight_copies(layers, k) - (spec.block_autocast_weight_copies if k else 0.0)
    result: Moments = {
        "backward": {
            **common,
            # DeepSpeed allocates its gradient buffers up front; torch creates them in the
            # first backward, so under accumulation the earlier micro-batches' are live
            "gradients": backward_grads if _gradients_before_backward(plan) else 0.0,
            "activations": cm.saved_activations(fig, b, k),
            "autocast_weight_copies": copies if amp else 0.0,
        },
        "optimizer": {
            **common,
            "gradients": states.gradients,
            "activations": 0.0,
            "autocast_weight_copies": 0.0,
            "temporaries": (buckets if plan.zero_stage >= 3 else 0.0) + _traced_residue(facts),
        },
    }
    if k and fig.blocks:
        grads, inputs = _recompute_live(facts, plan, backward_grads, fig.block_input(b), k)
        result["recompute"] = {
            **common,
            "gradients": grads,
            "activations": inputs + fig.block(b),
            "autocast_weight_copies": spec.block_autocast_weight_copies if amp else 0.0,
        }
    engine = zero.engine_moments(facts, plan) or fsdp.fsdp2_moments(facts, plan)
    if engine is not None:
        # A ZeRO (or FSDP2) engine's own buffers replace the plain-torch states at every moment, and
        # the end of backward (its reduction) is a moment of its own; a recompute holds what the
        # start of backward does unless the engine says otherwise (FSDP2's prefetch).
        result["reduce"] = {**result["optimizer"], "temporaries": 0.0}
        for name, held in (("backward", "backward"), ("recompute", "backward"),
                           ("reduce", "reduce"), ("optimizer", "optimizer")):  # fmt: skip
            if name in result:
                result[name].update(engine.get(name) or engine[held])
        if "block_reduce" in engine and fig.blocks:
            # the last block's own saved activations are gone (its input only, checkpointed)
            last = fig.block_input(b) if k >= layers else fig.block(b)
            result["block_reduce"] = {
                **result["backward"],
                **engine["block_reduce"],
                "activations": max(result["backward"]["activations"] - last, 0.0),
            }
    result["optimizer"]["temporaries"] += adam_step_temporaries(facts, plan)
    return result, states, spec.source


ADAM_LIKE = 8.0
"""Optimizer bytes per parameter from which the optimizer is taken for Adam's kind (two moments:
Adam, AdamW), whose step makes the transients of :func:`adam_step_temporaries`."""


def adam_step_temporaries(facts: ModelFacts, plan: Plan) -> float:
    """Transients of torch's Adam step over per-parameter tensors, on the fp32 master weights.

    ``torch.optim.adam``, by the path the profile saw the optimizer take (else torch's default
    for the device): the single-tensor path (the default on a CPU) makes
    ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` one tensor at a time, two temporaries of a
    parameter's size at once, so twice the largest parameter; the foreach path (the default
    when every parameter is on CUDA) makes ``_foreach_sqrt`` of every moment of the group at
    once, one copy of all of them; the fused kernel none. A ZeRO engine steps its flat
    partition and counts that itself (:func:`zero.zero_engine_bytes`): 0 here. FSDP2 steps
    each parameter's shard. An optimizer that steps on the host (ZeRO-Offload's CPU Adam,
    FSDP2's CPU offload, on a GPU) makes none on the device. DeepSpeed without ZeRO on 16-bit weights steps its fp32 copies
    (``FP16_UnfusedOptimizer``) with the same optimizer.
    """
    if zero.engine_moments(facts, plan) is not None or facts.optimizer_bytes_per_param < ADAM_LIKE:
        return 0.0
    if _steps_on_host(facts, plan):
        return 0.0
    shards = plan.world_size if plan.engine == "fsdp2" else 1
    path = facts.optimizer_step or ("foreach" if facts.device_type == "cuda" else "single_tensor")
    if path == "fused":
        return 0.0
    if path == "foreach":
        return 4.0 * facts.trainable_parameters / shards
    return 2 * 4.0 * facts.largest_parameter / shards


def _steps_on_host(facts: ModelFacts, plan: Plan) -> bool:
    """Whether the optimizer steps on the host, not the device: DeepSpeed's ZeRO-Offload (its
    CPU Adam) and FSDP2's ``CPUOffloadPolicy``, on a GPU (on a CPU the host is the device)."""
    if facts.device_type == "cpu":
        return False
    if plan.engine == "fsdp2":
        return plan.offload_param != "none"
    return plan.offload_optimizer != "none"


def _traced_residue(facts: ModelFacts) -> float:
    """The traced optimizer step's transients beyond Adam's own for the traced plan."""
    traced = facts.traced_moment
    if traced is None or not traced.optimizer_temporaries:
        return 0.0
    return max(traced.optimizer_temporaries - adam_step_temporaries(facts, traced.plan), 0.0)


def _gradients_before_backward(plan: Plan) -> bool:
    """Whether every gradient already exists when the last micro-batch's backward starts.

    ZeRO 1-3 engines allocate their gradient buffers up front. A DeepSpeed plan without ZeRO
    (16-bit weights, stage 0) runs ``FP16_Optimizer`` (deepspeed 0.19 ``engine.py``:2321, 2360;
    for bf16 too, its grad-accumulation dtype being the weights'), whose 16-bit ``.grad`` are
    torch's, made during backward and set to ``None`` after each step
    (``fp16/fused_optimizer.py``:137-145): as under plain torch, only accumulation keeps them.
    """
    return (plan.uses_deepspeed and plan.zero_stage >= 1) or plan.grad_accum > 1


def _recompute_live(
    facts: ModelFacts, plan: Plan, gradients: float, block_input: float, k: int
) -> tuple[float, float]:
    """Gradients and kept inputs live while block j is recomputed, at the worse of j = 0 and k-1.

    Under torch the blocks after j have their gradients by then and the inputs
    of blocks 0..j are still kept; DeepSpeed's gradient buffers are all there.
    """
    if _gradients_before_backward(plan):
        return gradients, k * block_input
    trainable = max(facts.trainable_parameters, 1)
    share = (facts.block_parameters or trainable / (facts.num_layers + 1)) / trainable
    per_block = gradients * share
    candidates = [(gradients - (j + 1) * per_block, (j + 1) * block_input) for j in (0, k - 1)]
    return max(candidates, key=lambda pair: pair[0] + pair[1])


def _which(
    facts: ModelFacts, base: Baseline | TracedMoment, live: dict[str, float], saved: float
) -> str:
    """The moment a measured peak was taken at, from what was live.

    ``saved`` is the profiled plan's activations at the start of backward: the
    optimizer moment has all gradients and (almost) none of them, whereas a loop
    that keeps its gradients between steps has both at the start of backward.
    """
    full = fsdp.plan_states(facts, base.plan).gradients
    if full and live["gradients"] >= 0.9 * full and live["activations"] <= 0.1 * saved:
        return "optimizer"  # all gradients exist and the activations are gone: backward is over
    if base.plan.checkpoint_blocks and live["gradients"] > 0:
        return "recompute"  # some gradients, under checkpointing: a block is being recomputed
    return "backward"


def predict_peak(
    facts: ModelFacts, plan: Plan
) -> tuple[float, float, str, zero.StateBytes, Source]:
    """Predicted peak, the temporaries in it, the moment and how, the states and activation source.

    On the profiled plan itself the answer is the measured peak. The device's library
    workspace (``facts.device_workspace``: cuBLAS's, held from the first matmul on) is in every
    plan's peak and temporaries whatever the moment; a measured baseline holds it already, a
    trace never does, so the tensors' peak is predicted without it and it is added once.
    """
    held = facts.device_workspace
    if not held:
        return _tensor_peak(facts, plan)
    peak, temps, how, states, source = _tensor_peak(_without_workspace(facts), plan)
    note = (
        f"{how}, with {held / 2**20:.1f} MiB of cuBLAS workspace ({facts.device_workspace_source})"
    )
    return peak + held, temps + held, note, states, source


def _without_workspace(facts: ModelFacts) -> ModelFacts:
    """``facts`` with the workspace taken out of the measured baseline's peak and temporaries
    (the allocator's bytes beyond any tensor, which a GPU profile puts in its temporaries)."""
    held, base = facts.device_workspace, facts.baseline
    update: dict[str, object] = {"device_workspace": 0}
    if base is not None:

        def less(at: AtPeak) -> AtPeak:
            return at.model_copy(update={"temporaries": max(at.temporaries - held, 0)})

        back = base.backward_at_peak
        update["baseline"] = base.model_copy(update={
            "peak": max(base.peak - held, 0), "at_peak": less(base.at_peak),
            "backward_at_peak": None if back is None else less(back),
        })  # fmt: skip
    return facts.model_copy(update=update)


def _tensor_peak(
    facts: ModelFacts, plan: Plan
) -> tuple[float, float, str, zero.StateBytes, Source]:
    """:func:`predict_peak` of the tensors alone."""
    new, states, source = moments(facts, plan)
    base = facts.baseline or facts.traced_moment
    if base is None:
        totals = {name: sum(sizes.values()) for name, sizes in new.items()}
        name = max(totals, key=lambda key: totals[key])
        how = _buckets_note(f"{name} (sum of live categories)", zero.bucket_bytes(facts, plan))
        return totals[name], new[name]["temporaries"], how, states, source
    live = {c: float(v) for c, v in base.at_peak.model_dump().items()}
    old, _, _ = moments(facts, base.plan)
    moment = _which(facts, base, live, old["backward"]["activations"])
    if moment != "optimizer":
        # backward's temporaries (the loss's gradient buffers) are in the loss's dtype: bf16 under
        # 16-bit weights unless the model upcasts its logits (the trace says by how much)
        live["temporaries"] *= _dtype_ratio(facts, base.plan, plan)
    sharded = plan.uses_deepspeed or plan.engine == "fsdp2"
    if sharded and not (base.plan.uses_deepspeed or base.plan.engine == "fsdp2") and moment in old:
        # DeepSpeed (and FSDP2) frees each .grad once reduced into its own buffers: gradients the
        # profiled loop kept between its steps do not carry over
        live["gradients"] = old[moment]["gradients"]
    # temporaries per activation byte at the measured moment (backward's own buffers),
    # less what the profiled plan fixed in advance (its buckets)
    moment_act = old[moment]["activations"] if moment in old else 0.0
    measured = max(live["temporaries"] - old[moment]["temporaries"], 0.0) if moment in old else 0.0
    per_act = measured / moment_act if moment != "optimizer" and moment_act else 0.0
    if moment == "optimizer":
        per_act = _backward_share(facts, base, old, plan)
    totals, temps = {}, {}
    for name, sizes in new.items():
        late = _late(facts, plan, name)
        if name == moment and name in old:
            scale = plan.micro_batch / base.plan.micro_batch
            adam = (adam_step_temporaries(facts, base.plan), adam_step_temporaries(facts, plan))
            totals[name], temps[name] = _rescaled(
                live, old[name], sizes, moment, scale, late, adam=adam
            )
        else:
            scaled = per_act * sizes["activations"] if name != "optimizer" else 0.0
            temps[name] = _after_loss(scaled, late, name) + sizes["temporaries"] - late
            totals[name] = sum(sizes.values()) - sizes["temporaries"] + temps[name]
    kind = "measured" if base is facts.baseline else "traced step"
    if plan == base.plan:
        return float(base.peak), live["temporaries"], f"{moment} ({kind})", states, source
    name = max(totals, key=lambda key: totals[key])
    how = (
        f"{kind} moment rescaled" if name == moment else f"cost model, temporaries from the {kind}"
    )
    return (
        totals[name],
        temps[name],
        _buckets_note(f"{name} ({how})", zero.bucket_bytes(facts, plan)),
        states,
        source,
    )


def _dtype_ratio(facts: ModelFacts, measured: Plan, plan: Plan) -> float:
    """The plan's temporaries over the measured plan's, per byte, from their precisions.

    Only an fp32 measurement and a 16-bit-weight plan whose temporaries were traced at both
    precisions (``ActivationSpec.temporaries_vs_fp32``) differ; anything else keeps 1.
    """
    if measured.precision != "fp32" or plan.precision == "fp32":
        return 1.0
    spec, _ = activation_spec(facts, plan.precision)
    return spec.temporaries_vs_fp32 or 1.0


def _backward_share(
    facts: ModelFacts, base: Baseline | TracedMoment, old: dict[str, dict[str, float]], plan: Plan
) -> float:
    """Backward's own temporaries per activation byte, from the backward's peak the profile
    recorded beside a whole-step peak at the optimizer step (which holds none of them): the
    loss's gradient buffers that a plan peaking at its backward holds beside the activations
    (GPT-2 small at micro-batch 1: 196 MiB that a ZeRO-1 plan with accumulation missed)."""
    back = getattr(base, "backward_at_peak", None)
    if back is None or not old["backward"]["activations"]:
        return 0.0
    temporaries = back.temporaries * _dtype_ratio(facts, base.plan, plan)
    extra = max(temporaries - old["backward"]["temporaries"], 0.0)
    return extra / old["backward"]["activations"]


def _buckets_note(how: str, buckets: float) -> str:
    return f"{how}, with ZeRO gradient buckets of {buckets:,.0f} bytes" if buckets else how


def _rescaled(
    live: dict[str, float],
    old: dict[str, float],
    new: dict[str, float],
    moment: str,
    scale: float,
    late: float = 0.0,
    adam: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float]:
    """The measured moment with each category scaled by new/old.

    Temporaries follow what makes them: the recomputed block's activations, the
    micro-batch (``scale``, new/old) at the start of backward, nothing at the
    optimizer step but Adam's own (``adam``, :func:`adam_step_temporaries` of the old
    and the new plan), of which the measured step shows how much it made (none where
    its optimizer is fused); the plans' own (DeepSpeed's buckets) are swapped, old for
    new. ``late`` of the new ones appear only once the loss's own buffers are gone.
    """
    total = 0.0
    for c in CATEGORIES:
        if c == "temporaries":
            continue
        if old[c]:
            total += live[c] * new[c] / old[c]
        else:
            total += live[c] + new[c]  # nothing to scale: keep what was measured, add the new
    if moment == "optimizer":  # independent of the batch; Adam's own scaled to the new plan's
        seen = max(live["temporaries"] - (old["temporaries"] - adam[0]), 0.0)
        made = min(seen, adam[0])
        adams = made * adam[1] / adam[0] if adam[0] else 0.0
        temps = seen - made + adams + new["temporaries"] - adam[1]
        return total + temps, temps
    if moment == "recompute":  # the recomputed block's own buffers
        ratio = new["activations"] / old["activations"] if old["activations"] else 1.0
    else:  # the loss's gradients: one per sample
        ratio = scale
    measured = max(live["temporaries"] - old["temporaries"], 0.0) * ratio
    temps = _after_loss(measured, late, moment) + new["temporaries"] - late
    return total + temps, temps


def _late(facts: ModelFacts, plan: Plan, moment: str) -> float:
    """Of the plan's own temporaries at ``moment``, those made at the backward's first gradient:
    ZeRO-1/2's (:func:`zero.late_temporaries`), or FSDP2's first gradient at the start of
    backward (by a recompute it is reduced and gone) and all of its ``block_reduce`` moment's."""
    if plan.engine == "fsdp2":
        engine = fsdp.fsdp2_moments(facts, plan)
        if engine is None or moment not in ("backward", "block_reduce") or moment not in engine:
            return 0.0
        return engine[moment]["temporaries"]
    return zero.late_temporaries(facts, plan) if moment in ("backward", "recompute") else 0.0


def _after_loss(loss: float, late: float, moment: str) -> float:
    """Backward's temporaries: the loss's gradient buffers, or what a ZeRO-1/2 engine makes at
    the first gradient (``late``: its buckets, that gradient), which comes after the loss's
    backward has freed its buffers and, at the start of backward (and at FSDP2's
    ``block_reduce``), the saved activations only the loss used (one logits-sized tensor, half
    the loss's two buffers: GPT-2 small's ZeRO-1/2 trials at micro-batch 4 were 6-8 % over their
    estimate without it)."""
    return max(loss, late - loss / 2 if moment in ("backward", "block_reduce") else late)
