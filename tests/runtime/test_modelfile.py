"""The model-file contract: every way a file can be wrong gives one line with its line number, exit 2."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from autotune.cli import app
from autotune.records import AutotuneError
from autotune.runtime.modelfile import load_model_file, move_batch, rebuild_loader

GOOD_MODEL = """
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def build_batch(batch_size):
    return (torch.randn(batch_size, 4), torch.randn(batch_size, 1))


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)
"""


def _replace(old: str, new: str) -> str:
    assert old in GOOD_MODEL
    return GOOD_MODEL.replace(old, new)


# (case, file text, expected message fragment); "# HERE" marks the line the message must name.
BAD_MODELS = [
    ("syntax", _replace("def build_model():", "def build_model(:  # HERE"), "syntax error"),
    (
        "import",
        _replace("import torch\n", "import torch\nimport no_such_module_xyz  # HERE\n"),
        "import failed: ModuleNotFoundError",
    ),
    ("no build_model", _replace("def build_model():", "def make_model():"), "no build_model()"),
    (
        "no batches",
        _replace("def build_batch(batch_size):", "def make_batch(batch_size):"),
        "needs build_batch(batch_size) or build_dataloader(batch_size)",
    ),
    (
        "forward raises",
        _replace(
            "    x, y = batch\n",
            "    x, y = batch\n    raise ValueError('shapes do not line up')  # HERE\n",
        ),
        "loss_fn(model, batch) raised ValueError: shapes do not line up",
    ),
    (
        "build_model raises",
        _replace("    return nn.Sequential(", "    1 / 0  # HERE\n    return nn.Sequential("),
        "build_model() raised ZeroDivisionError",
    ),
    (
        "loss not scalar",
        _replace("nn.functional.mse_loss(model(x), y)", "model(x)"),
        "the loss is not a scalar (shape (",
    ),
    (
        "nan loss",
        _replace(
            "nn.functional.mse_loss(model(x), y)",
            "nn.functional.mse_loss(model(x), y) * float('nan')",
        ),
        "the loss is nan (not finite)",
    ),
    (
        "inf loss",
        _replace(
            "nn.functional.mse_loss(model(x), y)",
            "nn.functional.mse_loss(model(x), y) + float('inf')",
        ),
        "the loss is inf (not finite)",
    ),
    (
        "no trainable parameters",
        _replace(
            "    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))",
            "    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))\n"
            "    model.requires_grad_(False)\n    return model",
        ),
        "no trainable parameters",
    ),
    (
        "batch of the wrong type",
        _replace(
            "return (torch.randn(batch_size, 4), torch.randn(batch_size, 1))", "return 'tokens'"
        ),
        "a batch of the wrong type (str)",
    ),
    (
        "build_model returns no module",
        _replace(
            "    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))", "    return 3"
        ),
        "build_model() returned int, not a torch.nn.Module",
    ),
    (
        "loss without grad",
        _replace(
            "nn.functional.mse_loss(model(x), y)", "nn.functional.mse_loss(model(x), y).detach()"
        ),
        "does not require grad",
    ),
    (
        "default loss needs a dict",
        _replace("def loss_fn(model, batch):", "def other_fn(model, batch):"),
        "the default loss needs a dict",
    ),
]


def _marked_line(text: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if "# HERE" in line:
            return number
    return None


@pytest.mark.parametrize(("case", "text", "fragment"), BAD_MODELS, ids=[c[0] for c in BAD_MODELS])
def test_bad_model_file_gives_one_line_and_exit_2(
    case: str, text: str, fragment: str, tmp_path: Path
) -> None:
    model = tmp_path / "bad_model.py"
    model.write_text(text)
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            str(model),
            "-b",
            "2",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    assert fragment in lines[0]
    line = _marked_line(text)
    prefix = f"autotune: {model.resolve()}" + (f":{line}:" if line else ":")
    assert lines[0].startswith(prefix), (prefix, lines[0])
    assert not out.exists()
    assert not list(tmp_path.glob(".profile.json*")), "a temporary output file was left behind"


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        AutotuneError, match=re.escape(f"{tmp_path / 'nope.py'}: no such model file")
    ):
        load_model_file(tmp_path / "nope.py")


def test_good_file_loads_with_hash_and_defaults(tmp_path: Path) -> None:
    model = tmp_path / "good.py"
    model.write_text(GOOD_MODEL)
    loaded = load_model_file(model)
    import hashlib

    assert loaded.sha256 == hashlib.sha256(model.read_bytes()).hexdigest()
    net = loaded.build_model()
    assert isinstance(loaded.build_optimizer(net.parameters()), torch.optim.AdamW)
    batch = next(loaded.batches(3))
    assert batch[0].shape == (3, 4)
    assert loaded.tokens_per_sample(batch) is None
    assert loaded.loss(net, batch).dim() == 0


def test_tokens_per_sample_from_input_ids_then_constant(tmp_path: Path) -> None:
    model = tmp_path / "tok.py"
    model.write_text(GOOD_MODEL + "\nTOKENS_PER_SAMPLE = 77\n")
    loaded = load_model_file(model)
    assert loaded.tokens_per_sample({"input_ids": torch.zeros(2, 33, dtype=torch.long)}) == 33
    assert loaded.tokens_per_sample((torch.zeros(2, 4),)) == 77


def test_move_batch_handles_containers_and_rejects_others() -> None:
    batch: dict[str, Any] = {"a": torch.ones(2), "b": [torch.zeros(1), 3], "c": "text"}
    moved = move_batch(batch, "cpu")
    assert torch.equal(moved["a"], batch["a"]) and moved["b"][1] == 3 and moved["c"] == "text"
    with pytest.raises(AutotuneError, match="m.py: a batch of the wrong type \\(int\\)"):
        move_batch(5, "cpu", source="m.py")


def test_rebuilt_loader_keeps_data_and_changes_workers(examples_dir: Path) -> None:
    loaded = load_model_file(examples_dir / "mlp_dataloader.py")
    original = loaded.module.build_dataloader(16)
    rebuilt = rebuild_loader(original, 2, False)
    assert rebuilt.num_workers == 2 and rebuilt.persistent_workers
    assert rebuilt.dataset is original.dataset and rebuilt.batch_size == 16
    assert rebuilt.drop_last == original.drop_last and rebuilt.sampler is original.sampler


def test_workers_give_the_same_batches(examples_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_model_file(examples_dir / "slow_input.py")
    monkeypatch.setattr(loaded.module, "DECODE_SECONDS", 0.0)
    plain = loaded.batches(8)
    parallel = loaded.batches(8, workers=2)
    try:
        for _ in range(3):
            a, b = next(plain), next(parallel)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    finally:
        parallel.close()  # type: ignore[attr-defined]


def test_dataloader_stream_is_endless(tmp_path: Path) -> None:
    model = tmp_path / "short.py"
    model.write_text(
        GOOD_MODEL.replace("def build_batch(batch_size):", "def unused(batch_size):")
        + "\ndef build_dataloader(batch_size):\n"
        "    return [(torch.randn(batch_size, 4), torch.randn(batch_size, 1))] * 2\n"
    )
    stream = load_model_file(model).batches(2)
    assert len([next(stream) for _ in range(5)]) == 5
