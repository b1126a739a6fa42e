"""The Hugging Face entry: --hf-config / --hf-model with --seq-len, as a generated model file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from autotune.cli import app
from autotune.records import AutotuneError, ProfileRecord
from autotune.runtime.hf import model_source
from autotune.runtime.modelfile import load_model_file
from autotune.runtime.profiler import profile

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
    from_file = profile(
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
