"""One answer per plan: `estimate --profile`, the policy's figures (`suggest`), tune's pruning
figure and `recommend` give the same bytes for every plan, and the model-file road (a trace,
nothing run) lands within 2 % of the profiled road, on five models of different families."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.api import recommend, tune_model
from autotune.cli import app
from autotune.compose import profile_model
from autotune.policy import FactBuilder, suggest
from autotune.records import Machine, Plan, ProfileRecord, TuneOptions, parse_plan
from autotune.runtime import hf
from autotune.search import TrialResult, TrialSettings
from autotune.search._runner import FakeRunner

REPO = Path(__file__).resolve().parents[2]
ZOO = REPO / "examples" / "zoo"
MODELS = {
    "tiny_llama": None,  # examples/tiny_llama.py, a decoder with its own file
    "gpt2": 32,  # the GPT-2 shape (zoo config), tokens per sample
    "bert": 32,  # an encoder
    "mixtral": 32,  # a mixture of experts
    "resnet": 64,  # a CNN
}
RANKS, BATCH, BUDGET = 2, 2, "48GiB"
MODEL_FILE_BAR = 0.02
"""The model-file road (traced, nothing run) against the profiled road, on every row."""


def plans(blocks: int) -> list[str]:
    """Twelve or more plans over ZeRO 0-3, FSDP2 2/3, checkpointing none/half/all,
    fp32/bf16/autocast and accumulation (checkpointing only where the model has blocks)."""
    half, every = (max(blocks // 2, 1), blocks) if blocks else (0, 0)
    rows = [
        "mb=2", "stage=1,mb=1,ga=2", "stage=2,mb=2", "stage=3,mb=2",
        f"stage=3,mb=1,ga=4,ckpt={every}", "engine=fsdp2,stage=2,mb=2",
        f"engine=fsdp2,stage=3,mb=2,ckpt={half}", "precision=bf16,stage=2,mb=2",
        f"precision=bf16,stage=3,mb=1,ga=2,ckpt={every}", "precision=amp_bf16,mb=2",
        f"precision=amp_bf16,stage=1,mb=4,ckpt={half}",
        f"precision=bf16,engine=fsdp2,stage=3,mb=2,ckpt={every}",
        f"mb=1,ga=4,ckpt={half}", "precision=bf16,mb=4",
    ]  # fmt: skip
    return rows


def _model_file(name: str, seq_len: int | None, folder: Path) -> Path:
    if seq_len is None:
        return REPO / "examples" / f"{name}.py"
    text, _, stem = hf.hf_model_file(hf_config=str(ZOO / f"{name}.json"), seq_len=seq_len)
    path = folder / f"{stem}.py"
    path.write_text(text, encoding="utf-8")
    return path


def _estimate(*args: str) -> dict[str, dict]:
    result = CliRunner().invoke(app, ["estimate", *args, "--nproc-per-node", str(RANKS),
                                      "--device-memory", BUDGET, "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    return {
        json.dumps(row["plan"], sort_keys=True): row for row in json.loads(result.stdout)["plans"]
    }


def _key(plan: Plan) -> str:
    return json.dumps(json.loads(plan.model_dump_json()), sort_keys=True)


def _fast(plan: Plan, settings: TrialSettings) -> TrialResult:
    return TrialResult(completed_steps=3, samples_per_s=10.0 + plan.micro_batch,
                       peak_memory_bytes=[1], peak_source="fake",
                       device_memory=settings.device_memory)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_every_road_gives_one_figure_per_plan(name: str, tmp_path: Path) -> None:
    model = _model_file(name, MODELS[name], tmp_path)
    record = profile_model(model, batch_size=BATCH, steps=1, warmup=1, device="cpu")
    saved = tmp_path / "profile.json"
    saved.write_text(record.model_dump_json(), encoding="utf-8")
    blocks = record.model.block_stack.count if record.model.block_stack else 0
    texts = plans(blocks)
    flags = [arg for text in texts for arg in ("--plan", text)]
    profiled = _estimate("--profile", str(saved), *flags)
    traced = _estimate(str(model), "--batch-size", str(BATCH), *flags)
    assert len(profiled) == len(texts) >= 12

    machine = Machine(device="cpu", device_memory=48 * 2**30, nproc_per_node=RANKS)
    base = Plan(micro_batch=BATCH, nproc_per_node=RANKS)
    builder = FactBuilder(record, _facts_of(record), machine.with_default_budget(record))
    worst = 0.0
    for text in texts:
        plan = parse_plan(text, base)
        row = profiled[_key(plan)]
        # the policy's own figure for the plan (what suggest's rules and predictions read)
        assert builder.estimate(plan).memory.peak == row["memory"]["peak"], text
        error = traced[_key(plan)]["memory"]["peak"] / row["memory"]["peak"] - 1
        worst = max(worst, abs(error))
        assert abs(error) <= MODEL_FILE_BAR, f"{name} {text}: model-file road {error:+.2%}"

    advice = suggest(record, machine=machine, global_batch=8)
    for item in advice.suggestions:
        assert (
            item.predicted.peak_bytes_after
            == _estimate("--profile", str(saved), "--plan", item.plan.describe())[_key(item.plan)][
                "memory"
            ]["peak"]
        ), item.rule

    rec = recommend(model, global_batch=8, nproc_per_node=RANKS, profile=saved, device="cpu",
                    device_memory=BUDGET)  # fmt: skip
    assert (
        rec.predicted_peak_bytes
        == _estimate("--profile", str(saved), "--plan", rec.plan.describe())[_key(rec.plan)][
            "memory"
        ]["peak"]
    )

    tuned = tune_model(
        str(model), options=TuneOptions(global_batch=8, trials=4, profile_path=str(saved),
                                        storage=str(tmp_path / "s.db"), repeats=0),
        machine=machine, runner=FakeRunner(_fast),
    )  # fmt: skip
    predicted = {
        _key(t.plan): t.predicted_peak_bytes for t in tuned.trials if t.predicted_peak_bytes
    }
    assert predicted
    rows = _estimate("--profile", str(saved),
                     *[a for k in predicted for a in ("--plan", Plan.model_validate_json(k).describe())])  # fmt: skip
    for key, peak in predicted.items():
        assert peak == rows[key]["memory"]["peak"], key
    print(f"{name}: worst model-file row {worst:.2%}")


def _facts_of(record: ProfileRecord):  # the profile's facts as every road reads them
    from autotune.estimator import facts_from_profile

    return facts_from_profile(record)
