"""Whether stated tokens/s, TFLOPS and MFU agree through the FLOPs per token and stay under
the device's peak (METHOD.md section 4). Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from autotune.estimator import _costmodel as cm
from autotune.estimator._modelfacts import ModelFacts, block_share
from autotune.records import AutotuneError, Plan
from autotune.records import Record as _Record

TOLERANCE = 0.15
"""Stated figures agree with the formula within 15 %: the per-token counts in use differ by
about that much (6 psi with the input embedding, or without the attention term)."""


class ThroughputCheck(_Record):
    """Stated throughput figures against the FLOPs per token and the peak, with the arithmetic."""

    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    device: str | None = None
    peak_dtype: str | None = None
    peak_tflops: float | None = None
    model_flops_per_token: float
    hardware_flops_per_token: float
    recomputed_blocks: int
    implied_model_tflops: float | None = None
    implied_hardware_tflops: float | None = None
    implied_mfu: float | None = None
    consistent: bool | None = None
    under_peak: bool | None = None
    findings: list[str]
    source: Literal["formula"] = "formula"


def plan_flops_per_token(facts: ModelFacts, checkpoint_blocks: int) -> tuple[float, float]:
    """Model and hardware training FLOPs per token at the facts' sequence length.

    Model FLOPs: 6 psi without the input embedding plus attention 12 L h s
    (:func:`flops_per_token`). Hardware FLOPs add one more forward of each
    recomputed block (:func:`recompute_flops_per_token`).
    """
    seq, hidden, layers = facts.seq_len or 0, facts.hidden_size or 0, facts.num_layers
    psi = facts.trainable_parameters - facts.embedding_parameters
    model = cm.flops_per_token(psi, layers, hidden, seq)
    k = min(max(checkpoint_blocks, 0), layers)
    if not k:
        return model, model
    if facts.block_parameters:
        return model, model + cm.recompute_flops_per_token(facts.block_parameters, hidden, seq, k)
    return model, model * (1.0 + block_share(facts) * k / layers / 3.0)


def _per_token_text(facts: ModelFacts, model: float) -> str:
    psi = facts.trainable_parameters - facts.embedding_parameters
    return (
        f"6 x {psi / 1e9:.4g}B parameters without the input embedding + 12 x "
        f"{facts.num_layers} layers x {facts.hidden_size} hidden x {facts.seq_len} tokens "
        f"= {model:.4g} model FLOPs per token"
    )


def _agree(stated: float, low: float, high: float) -> tuple[bool, float]:
    """Whether ``stated`` lies in [low, high] within the tolerance, and its ratio to the nearer end."""
    if stated > high:
        return stated <= high * (1 + TOLERANCE), stated / high
    if stated < low:
        return stated >= low * (1 - TOLERANCE), stated / low
    return True, 1.0


@dataclass
class _Findings:
    """What the check found so far: sentences with their arithmetic, and the verdicts."""

    lines: list[str]
    agreements: list[bool] = field(default_factory=list)
    peaks: list[bool] = field(default_factory=list)

    def add(self, line: str, agree: bool | None = None, under: bool | None = None) -> None:
        self.lines.append(line)
        if agree is not None:
            self.agreements.append(agree)
        if under is not None:
            self.peaks.append(under)


def check_throughput(
    facts: ModelFacts,
    plan: Plan,
    *,
    tokens_per_s: float | None = None,
    tflops: float | None = None,
    mfu: float | None = None,
    peak_flops: float | None = None,
    device: str | None = None,
    peak_dtype: str | None = None,
) -> ThroughputCheck:
    """Check the stated per-device figures of one plan against each other and the peak.

    tokens/s x model FLOPs per token is the model FLOP rate; with recomputed blocks
    the device does up to the hardware FLOPs per token, so a stated TFLOPS agrees
    when it lies between the two (within :data:`TOLERANCE`). MFU is model FLOPs
    over the peak. Neither a stated nor an implied rate may exceed the peak.

    Raises:
        AutotuneError: the facts lack the sequence length or hidden size to count FLOPs.
    """
    if not facts.seq_len or not facts.hidden_size:
        raise AutotuneError(
            "--check: tokens_per_s/tflops/mfu need the sequence length and hidden size "
            "(give --hf-config with --seq-len, or a model whose batches have input_ids)"
        )
    model, hardware = plan_flops_per_token(facts, plan.checkpoint_blocks)
    k = min(plan.checkpoint_blocks, facts.num_layers)
    found = _Findings([_per_token_text(facts, model)])
    if k:
        found.add(
            f"{k} of {facts.num_layers} blocks recomputed: {hardware:.4g} hardware FLOPs per "
            f"token (x{hardware / model:.3f})"
        )
    implied = (
        (tokens_per_s * model / 1e12, tokens_per_s * hardware / 1e12) if tokens_per_s else None
    )
    _rates(found, tokens_per_s, tflops, implied, model, hardware)
    rate = implied[0] if implied else tflops
    implied_mfu = rate * 1e12 / peak_flops if rate is not None and peak_flops else None
    if peak_flops:
        where = f"{device} " if device else ""
        peak_text = f"the {where}{peak_dtype or ''} dense peak {peak_flops / 1e12:g} TFLOPS"
        _peaks(found, tflops, implied, implied_mfu, peak_flops, peak_text)
    else:
        peak_text = ""
    if mfu is not None:
        _mfu(found, mfu, implied_mfu, peak_text, tokens_per_s is not None)
    return ThroughputCheck(
        tokens_per_s=tokens_per_s, tflops=tflops, mfu=mfu, device=device, peak_dtype=peak_dtype,
        peak_tflops=peak_flops / 1e12 if peak_flops else None, model_flops_per_token=model,
        hardware_flops_per_token=hardware, recomputed_blocks=k,
        implied_model_tflops=implied[0] if implied else None,
        implied_hardware_tflops=implied[1] if implied else None, implied_mfu=implied_mfu,
        consistent=all(found.agreements) if found.agreements else None,
        under_peak=all(found.peaks) if found.peaks else None, findings=found.lines,
    )  # fmt: skip


def _rates(
    found: _Findings,
    tokens: float | None,
    tflops: float | None,
    implied: tuple[float, float] | None,
    model: float,
    hardware: float,
) -> None:
    """tokens/s into TFLOPS (model, and hardware with recomputation); a stated TFLOPS against it."""
    if tokens is None or implied is None:
        if tflops is not None:
            low, high = tflops * 1e12 / hardware, tflops * 1e12 / model
            span = f"{high:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"
            found.add(f"{tflops:g} TFLOPS allows {span} tokens/s per device")
        return
    text = f"{tokens:,.0f} tokens/s x {model:.4g} = {implied[0]:.1f} TFLOPS of model FLOPs"
    if hardware != model:
        text += f" ({implied[1]:.1f} TFLOPS of hardware work with the recomputation)"
    found.add(text)
    if tflops is None:
        return
    ok, ratio = _agree(tflops, *implied)
    span = f"{implied[0]:.1f}" if hardware == model else f"{implied[0]:.1f}-{implied[1]:.1f}"
    if ratio == 1.0:
        found.add(
            f"consistent: stated {tflops:g} TFLOPS lies within the {span} TFLOPS the tokens/s allow",
            ok,
        )
        return
    found.add(
        f"{'consistent' if ok else 'inconsistent'}: stated {tflops:g} TFLOPS is {ratio:.2f}x the "
        f"{span} TFLOPS the tokens/s allow (agreement within {TOLERANCE:.0%})",
        ok,
    )


def _peaks(
    found: _Findings,
    tflops: float | None,
    implied: tuple[float, float] | None,
    implied_mfu: float | None,
    peak: float,
    peak_text: str,
) -> None:
    """The stated TFLOPS and the work the tokens/s imply, each against the peak."""
    if tflops is not None:
        under = tflops * 1e12 <= peak
        found.add(
            f"stated {tflops:g} TFLOPS is {100 * tflops * 1e12 / peak:.0f} % of {peak_text}: "
            f"{'under' if under else 'over'} the peak",
            under=under,
        )
    if implied is not None:
        under = implied[1] * 1e12 <= peak
        found.add(
            f"the tokens/s need {implied[1]:.1f} TFLOPS of work, {100 * implied[1] * 1e12 / peak:.0f} % "
            f"of {peak_text} (MFU {implied_mfu:.3f}): {'under' if under else 'over'} the peak",
            under=under,
        )


def _mfu(
    found: _Findings, mfu: float, implied: float | None, peak_text: str, from_tokens: bool
) -> None:
    """A stated MFU: at most 1, and equal to the model FLOP rate over the peak."""
    if mfu > 1:
        found.add(
            f"impossible: stated MFU {mfu:g} is above 1 (no device exceeds its peak)", under=False
        )
    if implied is None:
        found.add(f"stated MFU {mfu:g} not checked: needs a peak (device= or --peak-tflops)")
        return
    ok = abs(mfu - implied) <= TOLERANCE * implied
    source = "the tokens/s" if from_tokens else "the stated TFLOPS"
    found.add(
        f"{'consistent' if ok else 'inconsistent'}: stated MFU {mfu:g}, {implied:.3f} from "
        f"{source} and {peak_text}",
        ok,
    )
