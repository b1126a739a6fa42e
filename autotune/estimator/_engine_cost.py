"""What an engine's own code adds to a step: DeepSpeed's hooks and bookkeeping, FSDP2's
per-module hooks and its optimizer step over DTensors. Neither a profile (plain torch) nor the
collectives' count sees it, and on a small model it is most of the difference between them and a
measured step: on tiny Llama, ZeRO-3's step took twice what its compute and collectives predict.

It is measured on the ranks themselves (``autotune.runtime.trial.engine_cost``): each engine runs
stacks of bias-free square matrices, and what its micro-batches and its optimizer step take
beyond the stack's own compute and optimizer step and the collectives :mod:`._comm` times is
fitted as ``fixed + per_tensor * tensors + per_element * elements (+ per_module * sharded
modules)``, each slope at 0 or above. DeepSpeed's hooks are per parameter tensor: two stacks of
one-matrix blocks of :data:`STACK_WIDTH`, 4 and 16 deep. Its copies, bucketing and
accumulation of the gradients are per element, and past the CPU's caches they cost several
times what they do inside them: a third stack, of two matrices as wide as the model's
parameters need (:func:`wide_width`), times them where the model's own bytes sit. FSDP2's hooks
are per sharded module (each block, and the root) and per tensor (its copies and its DTensor
optimizer step): a stack of 4 blocks of 8 matrices tells the two apart. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.estimator import _costmodel as cm
from autotune.estimator._comm import collective_seconds, measured_link, step_calls
from autotune.records import EngineCost, LinkMeasure, Plan

STACK_WIDTH = 8
"""The narrow stacks' matrices: ``STACK_WIDTH`` x ``STACK_WIDTH``, bias-free, so compute and
bytes are negligible and the engine's work per tensor is what is left."""
WIDE_WIDTHS = (1024, 2048)
"""The wide stack's widths, narrowest first. Two matrices of 2048 x 2048 (8.4M elements, 34 MB
in fp32 each of the weights, the gradients and the engine's buffers) are more than the 32 MiB
last-level cache of the CPUs this was built on, so the engine's work per element is timed
streaming from memory, as a large model's is (ZeRO-3 at fp32 on one such matrix, 17 MB, came
1.9-2.5 ns an element a micro-batch against 6.3-7.8 on two; three calibrations each, stop 62).
Two of 1024 x 1024 (2.1M, 8.4 MB) time a model of that many parameters or fewer, whose bytes a
cache holds as it holds theirs, in half the time: the twelve engines of a 2-rank CPU search in
13 s against 26 s (bench/engine_width.py)."""

EngineStack = tuple[int, int, int]
"""(blocks, matrices per block, matrix width) of a calibration stack."""

NARROW_STACKS: tuple[EngineStack, ...] = ((4, 1, STACK_WIDTH), (16, 1, STACK_WIDTH))
"""The stacks an engine's cost per tensor shows between (ZeRO-3: ~0.4 ms a tensor a micro-batch
on a 2-core CPU); the wide stack after them times its cost per element."""
FSDP2_MODULES_STACK: EngineStack = (4, 8, STACK_WIDTH)
"""FSDP2's fourth stack: the first's modules and the second's tensors twice over."""


def engine_key(plan: Plan) -> str | None:
    """The engine a trial of ``plan`` runs, as its measured cost is kept: ``deepspeed-<stage>-
    <fp32|bf16>`` or ``fsdp2-<2|3>-<fp32|bf16>`` (16-bit weights: bf16's path, fp16's too;
    autocast keeps fp32 weights); ``None`` for a plain torch step (one rank, no DeepSpeed
    feature) or an offloaded plan (the engine's host path is timed by its own figures)."""
    if plan.offload_optimizer != "none" or plan.offload_param != "none":
        return None
    width = "bf16" if plan.precision in ("bf16", "fp16") else "fp32"
    if plan.engine == "fsdp2":
        return f"fsdp2-{3 if plan.reshard_after_forward else 2}-{width}"
    if plan.uses_deepspeed or plan.world_size > 1:
        return f"deepspeed-{plan.zero_stage}-{width}"
    return None


def engine_keys(plans: Sequence[Plan]) -> list[str]:
    """The engines ``plans`` run, each once, in order."""
    return list(dict.fromkeys(key for key in map(engine_key, plans) if key is not None))


def wide_width(parameters: int | None) -> int:
    """The wide stack's width for a model of ``parameters``: the narrowest of
    :data:`WIDE_WIDTHS` whose two matrices hold as many elements, else (or unknown) the widest."""
    fits = [w for w in WIDE_WIDTHS if parameters is not None and 2 * w * w >= parameters]
    return fits[0] if fits else WIDE_WIDTHS[-1]


def engine_stacks(key: str, width: int = WIDE_WIDTHS[-1]) -> tuple[EngineStack, ...]:
    """The (blocks, matrices per block, width) stacks the calibration runs the engine ``key`` on,
    its wide stack of two ``width``-wide matrices (:func:`wide_width`)."""
    stacks = (*NARROW_STACKS, (2, 1, width))
    return (*stacks, FSDP2_MODULES_STACK) if key.startswith("fsdp2") else stacks


def sharded_modules(key: str, blocks: int) -> int:
    """The modules whose hooks an engine runs per micro-batch beside its per-tensor ones: FSDP2's
    sharded modules (each block, and the root); none under DeepSpeed."""
    return blocks + 1 if key.startswith("fsdp2") else 0


def stack_plan(key: str, world_size: int, grad_accum: int) -> Plan:
    """The plan the calibration runs the engine ``key`` as, at micro-batch 1."""
    engine, stage, width = key.split("-")
    return Plan(precision=width, micro_batch=1, grad_accum=grad_accum, zero_stage=int(stage),
                engine=engine, nproc_per_node=world_size)  # type: ignore[arg-type]  # fmt: skip


def stack_optimizer_scale(key: str, world_size: int) -> float:
    """The share of the model's optimizer step a rank of the engine ``key`` takes, as the time
    model counts it: its shard (``1 / world_size``) under ZeRO-1 to 3 and FSDP2, the whole under
    ZeRO-0."""
    return 1.0 if key.startswith("deepspeed-0") else 1.0 / world_size


def stack_communication(
    key: str, blocks: int, per_block: int, width: int, link: LinkMeasure
) -> tuple[float, float]:
    """Seconds of collectives the time model counts for a calibration stack of ``blocks`` blocks
    of ``per_block`` matrices ``width`` wide under ``key`` on ``link``: per micro-batch, and once
    per optimizer step."""
    size = width * width
    tensors = blocks * per_block

    def seconds(grad_accum: int) -> float:
        plan = stack_plan(key, link.world_size, grad_accum)
        calls = step_calls(plan, tensors * size, [size] * tensors, blocks=blocks,
                           block_parameters=per_block * size)  # fmt: skip
        width = cm.communicated_bytes_per_element(plan.precision)
        return collective_seconds(calls, link.world_size, width, measured_link(link))

    one, two = seconds(1), seconds(2)
    return two - one, 2 * one - two


def fit_engine_cost(
    key: str,
    stacks: Sequence[EngineStack],
    micro: Sequence[float],
    step: Sequence[float],
    steps: int,
) -> EngineCost:
    """Each figure (``micro``: a micro-batch's seconds, ``step``: the boundary's extra) over the
    ``(blocks, matrices per block, width)`` stacks, fitted as ``fixed + per_tensor * tensors +
    per_module * sharded modules + per_element * elements`` by least squares, no slope below 0
    (noise): a negative one is dropped and the rest fitted again.

    Raises:
        ValueError: fewer distinct stacks than the fit has terms.
    """
    rows = [(float(blocks * per_block), float(sharded_modules(key, blocks)),
             float(blocks * per_block * width * width))
            for blocks, per_block, width in stacks]  # fmt: skip
    used = [0, 1, 2] if key.startswith("fsdp2") else [0, 2]
    if len(set(rows)) < len(used) + 1:
        raise ValueError(f"an engine's cost needs {len(used) + 1} or more distinct stacks")
    micro_fit = _nonnegative_fit(rows, micro, used)
    step_fit = _nonnegative_fit(rows, step, used)
    return EngineCost(engine=key, steps=steps, blocks=[s[0] for s in stacks],
                      per_block=[s[1] for s in stacks], width=[s[2] for s in stacks],
                      micro_fixed_s=micro_fit[0], micro_per_tensor_s=micro_fit[1],
                      micro_per_module_s=micro_fit[2], micro_per_element_s=micro_fit[3],
                      step_fixed_s=step_fit[0], step_per_tensor_s=step_fit[1],
                      step_per_module_s=step_fit[2], step_per_element_s=step_fit[3])  # fmt: skip


def _nonnegative_fit(
    rows: Sequence[tuple[float, float, float]], ys: Sequence[float], used: list[int]
) -> tuple[float, float, float, float]:
    """``(fixed, per_tensor, per_module, per_element)`` of ``ys`` on the ``used`` columns of
    ``rows``, by least squares; while a slope is negative, its column is dropped and the rest
    refitted."""
    while True:
        coefficients = _least_squares([[1.0, *(row[i] for i in used)] for row in rows], ys)
        negative = [i for i, c in zip(used, coefficients[1:], strict=True) if c < 0]
        if not negative:
            slopes = dict(zip(used, coefficients[1:], strict=True))
            return coefficients[0], slopes.get(0, 0.0), slopes.get(1, 0.0), slopes.get(2, 0.0)
        used = [i for i in used if i != negative[0]]


def _least_squares(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """The coefficients minimising the squared residuals of ``ys`` on the columns of ``xs``
    (the normal equations, solved by Gauss-Jordan elimination: at most four columns here)."""
    n = len(xs[0])
    a = [[sum(r[i] * r[j] for r in xs) for j in range(n)]
         + [sum(r[i] * y for r, y in zip(xs, ys, strict=True))] for i in range(n)]  # fmt: skip
    for col in range(n):
        pivot = max(range(col, n), key=lambda row: abs(a[row][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for row in range(n):
            if row != col:
                factor = a[row][col] / a[col][col]
                a[row] = [v - factor * p for v, p in zip(a[row], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def engine_seconds(
    plan: Plan, link: LinkMeasure | None, sizes: Sequence[int] | None, blocks: int
) -> tuple[float, str | None]:
    """What the plan's engine adds to its step for a model of parameter tensors of ``sizes``
    elements and ``blocks`` blocks, and the note that says so: ``grad_accum`` micro-batches and
    one optimizer step of the measured cost; 0 with why, where the plan runs no engine, or
    nothing measured it."""
    key = engine_key(plan)
    if key is None:
        return 0.0, None
    cost = link.engine_cost(key) if link is not None else None
    if cost is None:
        return 0.0, f"the {key} engine's own per-step cost not included: not measured here"
    if sizes is None:
        return 0.0, (f"the {key} engine's own per-step cost not included: the model's parameter "
                     "tensors are not known")  # fmt: skip
    tensors, elements = len(sizes), sum(sizes)
    modules = sharded_modules(key, blocks)
    micro = max(cost.micro_fixed_s + cost.micro_per_tensor_s * tensors
                + cost.micro_per_module_s * modules + cost.micro_per_element_s * elements,
                0.0)  # fmt: skip
    boundary = max(cost.step_fixed_s + cost.step_per_tensor_s * tensors
                   + cost.step_per_module_s * modules + cost.step_per_element_s * elements,
                   0.0)  # fmt: skip
    total = plan.grad_accum * micro + boundary
    what = (f"{tensors} parameter tensors of {elements:,} elements"
            + (f", {modules} sharded modules" if modules else ""))  # fmt: skip
    return total, (
        f"the {key} engine's own work: {total * 1e3:.1f} ms per step ({plan.grad_accum} x "
        f"{micro * 1e3:.2f} ms per micro-batch + {boundary * 1e3:.2f} ms per optimizer step at "
        f"{what}), as measured on these ranks beyond the compute and the collectives counted "
        "here"
    )
