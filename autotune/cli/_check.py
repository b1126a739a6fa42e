"""`estimate --check`: a row of a table ("stage=2,nproc_per_node=4,memory=17.2GB,tokens_per_s=1240,
tflops=112.5,device=A100") read into the estimator's :class:`Claim`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.records import AutotuneError, parse_bytes

if TYPE_CHECKING:
    from autotune.estimator import Claim
    from autotune.records import Plan

_RATES = ("tokens_per_s", "tflops", "mfu")


@dataclass(frozen=True)
class CheckSpec:
    """One ``--check`` read before any model is traced: its plan knobs and stated figures."""

    text: str
    knobs: str
    memory_bytes: int | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    device: str | None = None
    peak_dtype: str = "bf16"

    def claim(self, base: Plan, layers: int, peak_flops: float | None) -> Claim:
        """The row as a claim over ``base`` (``ckpt=all`` is every one of ``layers`` blocks)."""
        from autotune.estimator import Claim
        from autotune.records import parse_plan

        plan = parse_plan(self.knobs, base, flag="--check", blocks=layers)
        return Claim(
            plan=plan, text=self.text, memory_bytes=self.memory_bytes,
            tokens_per_s=self.tokens_per_s, tflops=self.tflops, mfu=self.mfu,
            device=self.device, peak_flops=peak_flops, peak_dtype=self.peak_dtype,
        )  # fmt: skip


def _rate(text: str, key: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise AutotuneError(f"--check {text!r}: {key}={value} must be a positive number")
    return number


def read_check(text: str) -> CheckSpec:
    """Read one ``--check`` row; every bad key or value is named before any work.

    Keys: ``memory`` (per device), ``tokens_per_s`` and ``tflops`` (per device),
    ``mfu``, ``device`` (a GPU of the peak table), and any plan knob (``nproc_per_node``, ``nnodes``,
    ``ckpt=all`` too), each once. The device's peak is read at the row's ``precision=`` (default bf16).
    """
    from autotune.estimator import PEAK_DTYPE, device_peak_flops
    from autotune.records import parse_plan

    knobs: list[str] = []
    stated: dict[str, object] = {}
    seen: set[str] = set()  # the row's own keys; parse_plan refuses a plan knob given twice
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = (part.strip() for part in item.partition("="))
        if key in seen:
            raise AutotuneError(f"--check {text!r}: {key} given twice")
        if key in ("memory", *_RATES, "device"):
            seen.add(key)
        if key == "memory":
            stated["memory_bytes"] = parse_bytes(value, "--check memory")
        elif key in _RATES:
            stated[key] = _rate(text, key, value)
        elif key == "device":
            stated["device"] = value
        else:
            knobs.append(item)
    if not any(key in stated for key in ("memory_bytes", *_RATES)):
        raise AutotuneError(
            f"--check {text!r}: needs memory=SIZE (the claimed per-device memory), "
            "or tokens_per_s=, tflops= or mfu="
        )
    plan = parse_plan(",".join(knobs), flag="--check", blocks="later")
    named = any(knob.split("=")[0].strip() == "precision" for knob in knobs)
    dtype = PEAK_DTYPE[plan.precision] if named else "bf16"
    if isinstance(stated.get("device"), str):
        device_peak_flops(str(stated["device"]), dtype, "--check device")
    return CheckSpec(
        text=text, knobs=",".join(knobs), peak_dtype=dtype,
        **stated,  # type: ignore[arg-type]
    )  # fmt: skip
