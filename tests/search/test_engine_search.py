"""The engine knob in the search: FSDP2 plans join a model file's space by default (a script's only
when asked, where it is refused), and the study tries them."""

from __future__ import annotations

from pathlib import Path

import pytest
from _search import run_tune

from autotune.records import AutotuneError, Plan
from autotune.search import TrialResult, TrialSettings
from autotune.search._runner import FakeRunner
from autotune.search._space import make_space

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "scripts" / "deepspeed_train.py"


def test_the_space_holds_fsdp2_plans_only_when_asked() -> None:
    plain = make_space(8, 2, 1, None, None)
    assert {p.engine for p in plain.all_plans()} == {"deepspeed"}
    both = make_space(8, 2, 1, None, None, engines=("deepspeed", "fsdp2"))
    fsdp2 = [p for p in both.all_plans() if p.engine == "fsdp2"]
    assert {p.zero_stage for p in fsdp2} == {2, 3}  # what FSDP2 can express
    assert both.size() == len(both.all_plans()) == plain.size() + len(fsdp2)
    for plan in both.all_plans():  # every plan is reached by its own study parameters
        assert both.plan(both.params(plan)) == plan
    one_rank = make_space(8, 1, 1, None, None, engines=("deepspeed", "fsdp2"))
    assert {p.engine for p in one_rank.all_plans()} == {"deepspeed"}


def test_fsdp2_alone_shards_every_stage_it_can_express() -> None:
    """``--engines fsdp2``: every sharded plan is FSDP2's (until stop 60 the space ignored a
    lone engine and searched DeepSpeed's plans); ZeRO-0, which FSDP2 cannot express, stays."""
    alone = make_space(8, 2, 1, None, None, engines=("fsdp2",))
    found = {(p.engine, p.zero_stage) for p in alone.all_plans()}
    assert found == {("deepspeed", 0), ("fsdp2", 2), ("fsdp2", 3)}
    for plan in alone.all_plans():
        assert alone.plan(alone.params(plan)) == plan


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(AutotuneError, match="--engines: megatron"):
        make_space(8, 2, 1, None, None, engines=("deepspeed", "megatron"))


@pytest.mark.parametrize("asked", [("deepspeed", "fsdp2"), None], ids=["asked", "default"])
def test_the_study_measures_fsdp2_plans_by_default_and_when_asked(
    tmp_path: Path, asked: tuple[str, ...] | None
) -> None:
    def behaviour(plan: Plan, settings: TrialSettings) -> TrialResult:
        speed = 10.0 + plan.micro_batch + (3.0 if plan.engine == "fsdp2" else 0.0)
        return TrialResult(completed_steps=4, samples_per_s=speed, peak_memory_bytes=[100, 100],
                           peak_source="fake", device_memory=settings.device_memory)  # fmt: skip

    runner = FakeRunner(behaviour)
    settings = TrialSettings(model_file=str(tmp_path / "m.py"), device_memory=1000, timeout_s=5)
    record = run_tune(
        "m.py", global_batch=8, settings=settings, runner=runner, nproc=2, trials=12,
        storage=str(tmp_path / "s.db"), repeats=1, seed=0, engines=asked,
    )  # fmt: skip
    engines = {plan.engine for plan in runner.plans}
    assert engines == {"deepspeed", "fsdp2"}
    assert record.recommendation is not None
    assert record.recommendation.plan.engine == "fsdp2"  # the faster engine in this fake


def test_a_model_file_searches_both_engines_and_a_script_deepspeed_unless_told() -> None:
    from autotune.api import check_script
    from autotune.records import Machine, TuneOptions

    assert TuneOptions(global_batch=8).searched_engines() == ("deepspeed", "fsdp2")
    assert TuneOptions(global_batch=8).searched_engines(script=True) == ("deepspeed",)
    told = TuneOptions(global_batch=8, engines=("deepspeed",))
    assert told.searched_engines() == told.searched_engines(script=True) == ("deepspeed",)
    machine, script = Machine(nproc_per_node=2), ["python", str(SCRIPT)]
    check_script(script, TuneOptions(global_batch=8), machine)  # no refusal
    asked = TuneOptions(global_batch=8, engines=("deepspeed", "fsdp2"))
    with pytest.raises(AutotuneError, match="--engines fsdp2: a script's trials inject DeepSpeed"):
        check_script(script, asked, machine)


def test_tune_cli_refuses_an_unknown_engine_before_any_work(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    model = tmp_path / "m.py"
    model.write_text("def build_model(): ...\n")
    result = CliRunner().invoke(app, ["tune", str(model), "--global-batch", "8", "--nproc-per-node", "2",
                                      "--engines", "deepspeed,jax", "--out-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 2 and "engines (--engines): jax" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.py"]
