"""A Hub name with no network fails at once, on one line, without asking the Hub (no retries)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.cli import app


def test_a_hub_name_without_network_fails_at_once_without_a_download(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import huggingface_hub.constants
    import transformers

    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def no_network(*args: Any, **kwargs: Any) -> socket.socket:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", no_network)
    asked: list[bool] = []
    real = transformers.AutoConfig.from_pretrained

    def from_pretrained(name: str, **kwargs: Any) -> Any:
        asked.append(bool(kwargs.get("local_files_only")))
        return real(name, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    args = ["estimate", "--hf-config", "no-such-org/no-such-model", "--seq-len", "8", "-b", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "autotune: --hf-config no-such-org/no-such-model: not in the local Hugging Face cache "
        "and huggingface.co cannot be reached (Name or service not known); give a local "
        "config.json or model directory"
    ]
    assert asked == [True]  # the cache only: the Hub was never asked, so nothing retried
