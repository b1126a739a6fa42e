"""The tiny Llama the three example scripts train, built from ``../configs/tiny_llama.json``
with random init, and its synthetic token data (no downloads).

Also a model file (``build_model``, ``build_batch``): ``autotune tune examples/scripts/tiny_model.py``
trials the same model and optimizer as the scripts, which is how a test compares the peaks.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import transformers

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny_llama.json"
SEQ_LEN = 64
LR = 1e-3


def build_model() -> torch.nn.Module:
    """The Llama of the config, random init, SDPA attention, no KV cache."""
    config = transformers.AutoConfig.from_pretrained(CONFIG, use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def build_optimizer(params: object) -> torch.optim.Optimizer:
    """What the scripts build (and the HF Trainer's default): AdamW."""
    return torch.optim.AdamW(params, lr=LR)  # type: ignore[arg-type]


class Tokens(torch.utils.data.Dataset):
    """Fixed random token sequences; labels are the inputs (the model shifts them)."""

    def __init__(self, size: int = 128, vocab: int = 1000) -> None:
        self.ids = torch.randint(
            0, vocab, (size, SEQ_LEN), generator=torch.Generator().manual_seed(0)
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def build_batch(batch_size: int) -> dict[str, torch.Tensor]:
    """One batch like the scripts' loaders give (model-file hook)."""
    ids = torch.randint(0, 1000, (batch_size, SEQ_LEN))
    return {"input_ids": ids, "labels": ids.clone()}


def single_process_env() -> None:
    """The launcher's variables for a plain ``python`` run of one rank (DeepSpeed wants them)."""
    if "RANK" in os.environ:
        return
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip


def leave_group() -> None:
    """Leave the process group together before exiting: a gloo group that outlives its peer's
    exit can abort the process in its destructor ("terminate called without an active
    exception", SIGABRT) after the training itself has finished."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
