"""A tiny Llama (random init, no downloads) for autotune: 4 layers, hidden 128, seq 128."""

from __future__ import annotations

from typing import Any

import torch
import transformers

SEQ_LEN = 128
VOCAB = 1000
# Fused attention, stated explicitly (transformers' default may change).
ATTENTION: dict[str, Any] = {"attn_implementation": "sdpa"}


def build_model() -> torch.nn.Module:
    """A 4-layer Llama built from a config, with SDPA attention."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ_LEN,
        use_cache=False,
        **ATTENTION,
    )
    return transformers.LlamaForCausalLM(config)


def build_batch(batch_size: int) -> dict[str, torch.Tensor]:
    """Random token ids; labels = inputs (the model shifts them)."""
    ids = torch.randint(0, VOCAB, (batch_size, SEQ_LEN))
    return {"input_ids": ids, "labels": ids.clone()}
