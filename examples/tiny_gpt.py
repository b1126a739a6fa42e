"""A small GPT-2-style causal LM (random init, no downloads) for autotune: 3 blocks, hidden 128, seq 128."""

from __future__ import annotations

import torch
import transformers

SEQ_LEN = 128
VOCAB = 1000


def build_model() -> torch.nn.Module:
    """A 3-block GPT-2 built from a config, with SDPA attention."""
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ_LEN,
        n_embd=128,
        n_layer=3,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return transformers.GPT2LMHeadModel(config)


def build_batch(batch_size: int) -> dict[str, torch.Tensor]:
    """Random token ids; labels = inputs (the model shifts them)."""
    ids = torch.randint(0, VOCAB, (batch_size, SEQ_LEN))
    return {"input_ids": ids, "labels": ids.clone()}
