"""One set of profiles per study: the first worker's, kept in the study for every other.

Each worker of a shared study used to profile the model itself. Two profiles of one model
differ by the machine's noise, so two workers predicted the same plan a few percent apart,
steered and stopped differently, and could end on different recommendations. The first
worker to profile claims the study's profiles (the creation of a marker study, unique in
every Optuna RDB storage, as the final comparison is claimed) and stores them; every later
worker, and a resume, reads them and profiles nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from autotune.records import ProfileRecord, TimedSteps
from autotune.search import _study
from autotune.search._waits import Notice, say

ATTR = "autotune:profiles"
"""The study user attribute holding ``{profile, by}`` (the profile carrying its timed second
micro-batch; a study of an earlier version keeps that beside it, as ``second``)."""
WAIT_S = 30.0
"""How long a worker that lost the claim waits for the winner's profiles to appear (the winner
writes them right after claiming; past this it is taken for dead and the worker's own stand)."""


@dataclass(frozen=True)
class Profiles:
    """A study's profile (its timed second micro-batch in it) and where it came from."""

    profile: ProfileRecord
    by: str
    """``host:pid`` of the worker that measured them."""


def read(study: Any) -> Profiles | None:
    """The profiles stored in the study (``None``: none yet, or unreadable by this version)."""
    saved = study.user_attrs.get(ATTR)
    if not isinstance(saved, dict):
        return None
    try:
        profile = ProfileRecord.model_validate(saved["profile"])
        second = saved.get("second")  # kept beside the profile by an earlier version
        if second is not None and profile.second is None:
            profile = profile.model_copy(update={"second": TimedSteps.model_validate(second)})
        return Profiles(profile, str(saved.get("by", "?")))
    except (KeyError, ValidationError):
        return None


def shared_profiles(
    study: Any, measure: Callable[[], ProfileRecord], wait_s: float = WAIT_S
) -> tuple[Profiles, str]:
    """The study's profiles: read where stored, else measured here (``measure``) and stored.

    Returns:
        The profiles every worker of the study predicts with, and a note saying whose they are.
    """
    stored = read(study)
    if stored is not None:
        return stored, f"profiles read from the study (measured by {stored.by}): none taken here"
    mine = Profiles(measure(), _study.worker_name())
    if not _study.claim(study, f"{study.study_name}:profiles"):  # another worker profiled first
        began, notice = time.monotonic(), Notice()
        while time.monotonic() < began + wait_s:
            stored = read(study)
            if stored is not None:
                return stored, (f"profiles read from the study (measured by {stored.by}, who "
                                "claimed them first): this worker's own are not used")  # fmt: skip
            if notice.due():
                say(f"waiting up to {wait_s:.0f} s for the study's profiles from the worker "
                    "that claimed them")  # fmt: skip
            time.sleep(0.2)
        return mine, (f"the study's profiles were claimed but not stored within {wait_s:.0f} s: "
                      "this worker predicts with its own")  # fmt: skip
    study.set_user_attr(ATTR, {"profile": mine.profile.model_dump(mode="json"), "by": mine.by})
    return mine, "profiles taken here and kept in the study for its other workers"
