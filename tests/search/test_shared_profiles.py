"""Workers of one study predict with one set of profiles: the first worker's, kept in the study.

Checked against Optuna's own storage: each worker opens the study afresh, as a process would.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.records import ProfileRecord, TimedSteps
from autotune.search import open_study, shared_profiles
from autotune.search._profiles import ATTR
from tests._profiles import synthetic_profile


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _measures(profile: ProfileRecord, calls: list[str], name: str):  # type: ignore[no-untyped-def]
    def measure() -> ProfileRecord:
        calls.append(name)
        return profile

    return measure


def _second(profile: ProfileRecord) -> TimedSteps:
    config = profile.config.model_copy(update={"batch_size": 4 * profile.config.batch_size})
    return TimedSteps(config=config, time=profile.time)


def _with_second(profile: ProfileRecord) -> ProfileRecord:
    return profile.model_copy(update={"second": _second(profile)})


def test_the_first_worker_profiles_and_every_later_one_reads_its_profiles(tmp_path: Path) -> None:
    storage = str(tmp_path / "s.db")
    first, other = synthetic_profile(step=1.0), synthetic_profile(step=1.07)  # two runs' noise
    assert first != other
    calls: list[str] = []
    mine, note = shared_profiles(open_study(storage, "s"),
                                 _measures(_with_second(first), calls, "a"))  # fmt: skip
    assert mine.profile == _with_second(first) and "taken here" in note
    # A second worker (and a resume) measures nothing and predicts with the first one's, its
    # timed second micro-batch included.
    theirs, note = shared_profiles(open_study(storage, "s"), _measures(other, calls, "b"))
    assert calls == ["a"]
    assert theirs.profile == _with_second(first) and theirs.profile.second == _second(first)
    assert f"measured by {mine.by}" in note
    # Another study profiles for itself.
    own, _ = shared_profiles(open_study(storage, "t"), _measures(other, calls, "c"))
    assert calls == ["a", "c"] and own.profile == other and own.profile.second is None


def test_a_study_of_an_earlier_version_keeps_the_second_beside_the_profile(
    tmp_path: Path,
) -> None:
    """Stop 63's tune stored ``{profile, second, by}``: a resume of such a study predicts with
    the profile carrying that second, and profiles nothing."""
    first = synthetic_profile(step=1.0)
    study = open_study(str(tmp_path / "s.db"), "s")
    study.set_user_attr(ATTR, {"profile": first.model_dump(mode="json"),
                               "second": _second(first).model_dump(mode="json"), "by": "h:1"})  # fmt: skip
    calls: list[str] = []
    read, note = shared_profiles(study, _measures(first, calls, "a"))
    assert calls == [] and read.profile == _with_second(first) and "measured by h:1" in note


def test_of_two_workers_profiling_at_once_the_one_that_claims_first_is_used(tmp_path: Path) -> None:
    storage = str(tmp_path / "s.db")
    first, late = synthetic_profile(step=1.0), synthetic_profile(step=1.07)
    study = open_study(storage, "s")

    def racing() -> ProfileRecord:
        # While this worker profiles, another one finishes first and keeps its profiles.
        shared_profiles(open_study(storage, "s"), lambda: first)
        return late

    used, note = shared_profiles(study, racing)
    assert used.profile == first and "claimed them first" in note


def test_a_claim_never_stored_leaves_the_worker_its_own_profiles_after_a_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = str(tmp_path / "s.db")
    study = open_study(storage, "s")
    optuna.create_study(storage=study._storage, study_name="s:profiles")  # claimed, then died
    own = synthetic_profile(step=1.0)
    used, note = shared_profiles(study, lambda: own, wait_s=4.0)
    assert used.profile == own and "not stored within 4 s" in note
    # The wait said what it waited for while it waited.
    assert capsys.readouterr().err == (
        "autotune: waiting up to 4 s for the study's profiles from the worker that claimed them\n"
    )
