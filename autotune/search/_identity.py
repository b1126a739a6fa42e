"""What a study measured: the model's content hash, the software versions and the machine,
recorded in the study when it is created; a resume with any of them changed is refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.records import AutotuneError

IDENTITY_KEY = "autotune:measured"
"""The study's user attribute holding what its trials measured (:func:`check_identity`)."""
_NAMES = {
    "model_sha256": "the model file's content",
    "autotune": "autotune's version",
    "torch": "torch's version",
    "deepspeed": "DeepSpeed's version",
    "transformers": "transformers' version",
    "device_name": "the device",
    "device_count": "the device count",
}


def check_identity(study: Any, identity: Mapping[str, str], study_name: str) -> None:
    """Record ``identity`` in a new study; refuse to resume one that measured something else.

    A study made before identities were recorded gets this one (nothing to compare with).

    Raises:
        AutotuneError: one line naming each field that changed, its old and new value, and
            how to start a new study instead.
    """
    stored = study.user_attrs.get(IDENTITY_KEY)
    if not isinstance(stored, dict):
        study.set_user_attr(IDENTITY_KEY, dict(identity))
        return
    changed = [key for key in identity if key in stored and stored[key] != identity[key]]
    if not changed:
        return
    what = "; ".join(
        f"{_NAMES.get(key, key)} {_short(stored[key])} -> {_short(identity[key])}"
        for key in changed
    )
    raise AutotuneError(
        f"--study {study_name}: its trials measured something else ({what}); resuming would "
        "mix their measurements: give a new --study name (or another --storage)"
    )


def _short(value: object) -> str:
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text
