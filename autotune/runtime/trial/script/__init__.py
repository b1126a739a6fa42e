"""Script trials: the start-up hook that runs inside the user's unchanged launch command, injects
the trial's plan into the training entry point it calls (HF ``Trainer``, ``deepspeed.initialize``,
``accelerate.Accelerator``) and measures the steps the script itself runs.

``HOOK_DIR`` holds only a ``sitecustomize.py``: put first on ``PYTHONPATH`` of the launched
processes (with ``AUTOTUNE_SCRIPT_SPEC`` naming a trial spec), every Python process the command
starts, launcher and ranks, imports it at start-up. Nothing heavy is imported until an entry
point is imported.
"""

from __future__ import annotations

from pathlib import Path

HOOK_DIR = str(Path(__file__).resolve().parent / "hook")
"""The folder to put first on ``PYTHONPATH`` of a script trial's processes."""
SPEC_ENV = "AUTOTUNE_SCRIPT_SPEC"
"""Names the trial spec (the search's ``SCRIPT_SPEC_ENV``; a test checks they agree)."""
PARAMETERS_ENV = "AUTOTUNE_SCRIPT_PARAMETERS"
"""The model's parameter count, from the probe: sizes ZeRO's buckets as model-file trials do."""


def trial_device(name: str) -> str:
    """``auto`` made concrete (``cuda`` where torch sees a GPU, else ``cpu``); others as given."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


__all__ = ["HOOK_DIR", "PARAMETERS_ENV", "SPEC_ENV", "trial_device"]
