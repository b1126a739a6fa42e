"""The composition's prediction, as ``autotune tune`` prunes with it; the Python API takes what
the docs show (plan strings, size strings) and refuses the rest in one line."""

from __future__ import annotations

import pytest
from _profiles import hand_profile

import autotune
from autotune.api._common import tune_records
from autotune.compose import compose
from autotune.records import AutotuneError, Machine, Plan, format_bytes


def make_predict(profile, machine):  # noqa: ANN001, ANN201 - the tune road's prediction
    return compose(profile, machine=machine).prediction


def test_the_margin_decides_what_tune_prunes() -> None:
    profile, plan = hand_profile(), Plan(micro_batch=4)
    peak = make_predict(profile, Machine())(plan).peak_bytes
    budget = int(peak / 0.95)  # the predicted peak is 95 % of the budget
    assert make_predict(profile, Machine(device_memory=budget, margin=0.0))(plan).fits
    assert make_predict(profile, Machine(device_memory=budget, margin=0.04))(plan).fits
    assert not make_predict(profile, Machine(device_memory=budget, margin=0.06))(plan).fits
    default = make_predict(profile, Machine(device_memory=budget))(
        plan
    )  # 10 %, as `autotune tune` without --margin
    usable = format_bytes(budget * 0.9)
    assert not default.fits and f"> {usable} usable (" in (default.reason or "")
    assert "less the 10% margin" in (default.reason or "")
    # The margin moves the line, never the peak.
    assert make_predict(profile, Machine(device_memory=budget, margin=0.0))(plan).peak_bytes == peak


def test_tunes_keywords_take_a_size_string() -> None:
    _, machine = tune_records(
        None, None, {"global_batch": 8, "device_memory": "2GiB", "nproc_per_node": 2}
    )
    assert (machine.device_memory, machine.nproc_per_node) == (2 * 2**30, 2)


def test_the_deliverables_take_a_plan_string() -> None:
    config = autotune.deepspeed_config("stage=2,mb=4,ga=2", world_size=2)
    assert config["zero_optimization"]["stage"] == 2
    assert (config["train_micro_batch_size_per_gpu"], config["train_batch_size"]) == (4, 4 * 2 * 2)
    out = autotune.fsdp2_config("engine=fsdp2,stage=3,ckpt=all,nproc_per_node=2", num_blocks=6)
    assert out["plan"] == "precision=fp32,ckpt=6,mb=1,stage=3,nproc_per_node=2,engine=fsdp2"


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (
            3,
            "plan: takes a Plan, a Recommendation or a plan string such as 'stage=2,mb=4' (got int)",
        ),
        ("stage", "plan: stage: give a value, e.g. stage=2"),
        ("ckpt=all", "plan: ckpt=all: the model's block count L is not known here; give ckpt=N"),
    ],
)
def test_a_deliverable_of_anything_else_is_one_line(given: object, line: str) -> None:
    with pytest.raises(AutotuneError) as caught:
        autotune.deepspeed_config(given)  # type: ignore[arg-type]
    assert str(caught.value) == line


def test_recommend_refuses_a_model_too_large_to_profile_here_before_any_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Llama-2-7B (6,738,415,616 parameters, its model card) takes 16 bytes a parameter in a
    real fp32 Adam step: 100.4 GiB, more than half of any machine this suite runs on."""
    import psutil

    from autotune.runtime import profiler

    if psutil.virtual_memory().available > 200 * 2**30:
        pytest.skip("this machine could profile Llama-2-7B")

    def no_profile(*args: object, **kwargs: object) -> None:
        raise AssertionError("profiled before refusing")

    monkeypatch.setattr(profiler, "profile", no_profile)
    with pytest.raises(AutotuneError) as refused:
        autotune.recommend(hf_config="examples/configs/llama2_7b.json", seq_len=128,
                           global_batch=8, device="cpu")  # fmt: skip
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("recommend: hf_config=examples/configs/llama2_7b.json: ")
    assert (
        f"{6_738_415_616 / 1e9:.2f}B parameters take {16 * 6_738_415_616 / 2**30:.1f} GiB" in line
    )
    assert "autotune estimate --hf-config" in line


def test_a_plan_whose_offloaded_states_overflow_the_host_says_so() -> None:
    from _profiles import synthetic_profile

    plan = Plan(micro_batch=2, zero_stage=2, offload_optimizer="cpu")
    machine = Machine(device_memory="80GiB", host_memory="1GiB")
    predicted = make_predict(synthetic_profile(), machine)(plan)
    # 100M parameters' fp32 master weights and Adam moments alone are 1.2 GB > 1 GiB
    assert not predicted.fits
    assert "of host RAM per node > 1.00 GiB" in (predicted.reason or "")
