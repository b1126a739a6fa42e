"""``autotune profile`` of a script: the model the script built and its first batch, profiled
inside the script's process by the model-file profiler, through a model file made for it.

The model file imports this module back (the same process, so the same objects): its
``build_model`` hands over the script's model, its ``build_batch(n)`` the first batch's rows.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

_CAPTURED: dict[str, Any] = {}
_SOURCE = (
    '"""The model a script built and its first batch (autotune profile -- COMMAND)."""\n'
    "from autotune.runtime.trial.script._profile import build_batch, build_model\n"
)


def build_model() -> Any:
    """The script's own model (already built: its weights as the script initialised them)."""
    return _CAPTURED["model"]


def build_batch(batch_size: int) -> Any:
    """``batch_size`` samples made of the script's first batch's rows (repeated if needed)."""
    import torch

    batch = _CAPTURED["batch"]
    count = next(v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor))
    rows = torch.arange(batch_size) % count
    return {key: value[rows].clone() if isinstance(value, torch.Tensor) and value.dim() and
            value.shape[0] == count else value for key, value in batch.items()}  # fmt: skip


def profile_script(model: Any, batch: dict[str, Any], *, batch_size: int, device: str,
                   label: str, steps: int = 3, warmup: int = 1) -> Any:  # fmt: skip
    """The profiler's :class:`ProfileRecord` of ``model`` fed ``batch``'s rows."""
    from autotune.runtime.profiler import profile

    _CAPTURED.update(model=model, batch=batch)
    with tempfile.TemporaryDirectory(prefix="autotune-script-profile-") as folder:
        path = Path(folder) / "script_model.py"
        path.write_text(_SOURCE, encoding="utf-8")
        return profile(path, batch_size=batch_size, steps=steps, warmup=warmup, device=device,
                       label=label, command=label)  # fmt: skip
