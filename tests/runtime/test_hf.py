"""The Hugging Face entry: --hf-config / --hf-model with --seq-len, as a generated model file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from autotune.cli import app
from autotune.compose import profile_model
from autotune.records import AutotuneError, ProfileRecord
from autotune.runtime.hf import model_source
from autotune.runtime.modelfile import load_model_file

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
TINY = CONFIGS / "tiny_llama.json"
runner = CliRunner()


def small_config(tmp_path: Path, **changes: object) -> Path:
    values = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
              "vocab_size": 50, "max_position_embeddings": 16, **changes}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    return path


@pytest.mark.slow
def test_profile_from_a_config_equals_the_equivalent_model_file(
    examples_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "hf.json"
    args = ["profile", "--hf-config", str(TINY), "--seq-len", "128", "-b", "2", "--steps", "1"]
    result = runner.invoke(app, [*args, "--warmup", "0", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    from_config = ProfileRecord.model_validate_json(out.read_text())
    from_file = profile_model(  # the road `autotune profile` takes: the other precisions traced
        examples_dir / "tiny_llama.py", batch_size=2, steps=1, warmup=0, device="cpu"
    )
    assert from_config.model == from_file.model
    assert from_config.model.attention == "sdpa" and from_config.model.tokens_per_sample == 128
    measured = {"process_rss", "cuda_reserved"}  # the process, not the step
    assert from_config.memory.model_dump(exclude=measured) == from_file.memory.model_dump(
        exclude=measured
    )
    for field in ("flops_per_step", "hardware_flops_per_step"):
        assert getattr(from_config.compute, field) == getattr(from_file.compute, field)
    assert from_config.config == from_file.config
    prov = from_config.provenance
    assert prov.model_file == f"hf-config {TINY} --seq-len 128"
    assert "--hf-config" in prov.command and "--seq-len 128" in prov.command


def test_local_weights_are_loaded_and_fed_token_batches(tmp_path: Path) -> None:
    import transformers

    saved = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**json.loads(small_config(tmp_path).read_text()))
    )
    saved.save_pretrained(tmp_path / "weights")
    with model_source(None, hf_model=str(tmp_path / "weights"), seq_len=8) as source:
        model_file = load_model_file(source.path)
        model = model_file.build_model()
        batch = next(model_file.batches(3))
        loss = model_file.loss(model, batch)
        generated = source.path
    assert not generated.exists()  # the generated file lives only as long as the block
    assert source.label == f"hf-model {tmp_path / 'weights'} --seq-len 8"
    expected = saved.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert batch["input_ids"].shape == (3, 8) and int(batch["input_ids"].max()) < 50
    assert torch.equal(batch["labels"], batch["input_ids"]) and torch.isfinite(loss)


@pytest.mark.parametrize(
    ("config", "extra", "message"),
    [
        ({"model_type": "nope"}, [], "model_type 'nope'"),
        ({"model_type": "vit"}, [], "cannot build a causal language model"),
        ({"hidden_size": 33}, [], "not a multiple"),
        ({}, ["--seq-len", "17"], "--seq-len 17: above max_position_embeddings 16"),
    ],
)
@pytest.mark.parametrize("command", ["profile", "confirm", "tune"])
def test_a_config_that_cannot_run_is_one_line(
    tmp_path: Path, command: str, config: dict[str, object], extra: list[str], message: str
) -> None:
    path = small_config(tmp_path, **config)
    sizes = ["--global-batch", "2"] if command == "tune" else ["-b", "2"]
    args = [command, "--hf-config", str(path), *sizes, *(extra or ["--seq-len", "8"])]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    # (tune's progress bar may have drawn its first line on stderr before the check)
    assert result.stderr.splitlines()[-1].startswith("autotune: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hf-config", str(TINY)], "--hf-config needs --seq-len"),
        (["MODEL.py", "--hf-config", str(TINY), "--seq-len", "8"], "give one of them"),
        (["MODEL.py", "--seq-len", "8"], "--seq-len: only with --hf-config or --hf-model"),
        (["--hf-config", "missing/config.json", "--seq-len", "8"], "no such file"),
        (["--hf-model", "missing-dir/", "--seq-len", "8"], "no such file"),
        ([], "MODEL: give a model file, --hf-config or --hf-model"),
    ],
)
def test_entry_mistakes_are_named(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["profile", *args, "-b", "2", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and not out.exists()


def test_hub_name_offline_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # never the network
    source = model_source(None, hf_config="no-such-org/no-such-model", seq_len=8)
    with pytest.raises(AutotuneError, match="--hf-config no-such-org/no-such-model: cannot load"):
        source.__enter__()


def test_recommend_and_estimate_share_the_checks(tmp_path: Path) -> None:
    import autotune

    with pytest.raises(AutotuneError, match="above max_position_embeddings 16"):
        autotune.recommend(hf_config=str(small_config(tmp_path)), seq_len=32, global_batch=2)
    result = runner.invoke(
        app, ["estimate", "--hf-config", str(TINY), "--seq-len", "256", "-b", "1"]
    )
    assert result.exit_code == 2 and "above max_position_embeddings 128" in result.stderr


ZOO = Path(__file__).resolve().parents[2] / "examples" / "zoo"
# config -> (the head its architectures choose, the model class, the batch fields)
HEADS = {
    "bert": ("masked-lm", "BertForMaskedLM", {"input_ids", "labels"}),
    "t5": ("seq2seq-lm", "T5ForConditionalGeneration", {"input_ids", "labels"}),
    "distilbert": (
        "sequence-classification",
        "DistilBertForSequenceClassification",
        {"input_ids", "labels"},
    ),  # fmt: skip
    "vit": ("image-classification", "ViTForImageClassification", {"pixel_values", "labels"}),
    "whisper": (
        "speech-seq2seq",
        "WhisperForConditionalGeneration",
        {"input_features", "labels"},
    ),  # fmt: skip
    "wav2vec2": ("ctc", "Wav2Vec2ForCTC", {"input_values", "labels"}),
    "clip": ("contrastive", "CLIPModel", {"input_ids", "pixel_values", "return_loss"}),
    "gpt2": ("causal-lm", "GPT2LMHeadModel", {"input_ids", "labels"}),
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_the_head_comes_from_the_configs_architectures(name: str) -> None:
    task, cls, fields = HEADS[name]
    seq_len = {"vit": 32, "wav2vec2": 1600, "clip": 16}.get(name, 16)
    with model_source(None, hf_config=str(ZOO / f"{name}.json"), seq_len=seq_len) as source:
        model_file = load_model_file(source.path)
        assert task == model_file.module.TASK
        model = model_file.build_model()
        assert type(model).__name__ == cls
        batch = next(model_file.batches(2, workers=0))
        assert set(batch) == fields
        loss = model_file.loss(model, batch)  # checked: a finite scalar connected to the weights
    loss.backward()
    if task == "image-classification":
        assert batch["pixel_values"].shape == (2, 3, 32, 32) and batch["labels"].shape == (2,)
    if task == "seq2seq-lm":  # encoder ids and decoder labels (the model shifts them in)
        assert batch["input_ids"].shape == batch["labels"].shape == (2, 16)


def test_task_flag_overrides_the_architectures_and_bad_ones_are_one_line(tmp_path: Path) -> None:
    config = json.loads((ZOO / "bert.json").read_text())
    config["num_labels"] = 3
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with model_source(
        None, hf_config=str(path), seq_len=8, task="sequence-classification"
    ) as source:
        model_file = load_model_file(source.path)
        assert type(model_file.build_model()).__name__ == "BertForSequenceClassification"
        assert next(model_file.batches(2, workers=0))["labels"].max() < 3
        assert source.label.endswith("--task sequence-classification")
    with (
        pytest.raises(AutotuneError, match=r"^--task translation: not one of causal-lm"),
        model_source(None, hf_config=str(path), seq_len=8, task="translation"),
    ):
        pass
    with (
        pytest.raises(AutotuneError, match=r"^--task: only with --hf-config"),
        model_source(path, task="masked-lm"),
    ):
        pass
    config["architectures"] = ["BertLMHeadWhatever"]
    path.write_text(json.dumps(config))
    with (
        pytest.raises(AutotuneError, match=r"has no task head autotune knows; give --task"),
        model_source(None, hf_config=str(path), seq_len=8),
    ):
        pass


@pytest.mark.slow
@pytest.mark.parametrize(("name", "seq_len"), [("bert", "16"), ("t5", "16"), ("vit", "32")])
def test_non_causal_configs_profile_and_estimate_from_the_command_line(
    name: str, seq_len: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    config = str(ZOO / f"{name}.json")
    out = tmp_path / "profile.json"
    args = ["profile", "--hf-config", config, "--seq-len", seq_len, "-b", "4", "--steps", "1"]
    result = runner.invoke(app, [*args, "--warmup", "0", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    record = ProfileRecord.model_validate_json(out.read_text())
    assert record.model.class_name == HEADS[name][1]
    estimate = runner.invoke(
        app, ["estimate", "--hf-config", config, "--seq-len", seq_len, "-b", "4", "--json"]
    )
    assert estimate.exit_code == 0, estimate.output
    plan = json.loads(estimate.stdout)["plans"][0]
    assert plan["source"] == "traced"
    assert any(note.startswith("activations traced on fake tensors") for note in plan["notes"])
    assert plan["memory"]["peak"] == pytest.approx(record.memory.peak, rel=0.05)
