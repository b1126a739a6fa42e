"""What a tune measures on: the model file's content hash, the versions of autotune, torch,
DeepSpeed and transformers, and the device (name, count), for the study to record."""

from __future__ import annotations

import hashlib
import os
from importlib import metadata
from pathlib import Path

__all__ = ["machine_identity", "measured_on"]

_PACKAGES = {"autotune": "autotune-advisor", "torch": "torch", "deepspeed": "deepspeed",
             "transformers": "transformers"}  # fmt: skip


def measured_on(model_file: str | Path, device: str) -> dict[str, str]:
    """The identity of a tune: ``model_sha256`` (the file's bytes; a Hugging Face config's
    generated file holds the config), each package's version (``absent`` if not installed),
    ``device_name`` and ``device_count``."""
    return {"model_sha256": hashlib.sha256(Path(model_file).read_bytes()).hexdigest(),
            **machine_identity(device)}  # fmt: skip


def machine_identity(device: str) -> dict[str, str]:
    """What measures on ``device`` (``cpu`` or a GPU's type): each package's version
    (``absent`` if not installed), ``device_name`` and ``device_count``."""
    identity = {}
    for key, package in _PACKAGES.items():
        try:
            identity[key] = metadata.version(package)
        except metadata.PackageNotFoundError:
            identity[key] = "absent"
    name, count = _device(device)
    identity.update(device_name=name, device_count=str(count))
    return identity


def _device(device: str) -> tuple[str, int]:
    if device != "cpu":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0), torch.cuda.device_count()
    # The machine's CPUs, not this worker's share: workers split over one machine with
    # taskset (docs/agent.md's way) measure the same machine.
    return _cpu_name(), os.cpu_count() or 1


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"
