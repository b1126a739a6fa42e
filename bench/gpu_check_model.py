"""The GPU check's model file: a Llama of about 1.1B parameters at sequence 2048 (random init).

The TinyLlama-1.1B shape: hidden 2048, 22 layers, 32 heads (4 key/value heads), SwiGLU
5632, vocabulary 32000, SDPA attention. ``GPU_CHECK_MODEL=tiny`` gives a 2-layer model of
the same kind at sequence 64 for the CPU smoke run. ``GPU_CHECK_INIT_DEVICE=cuda`` builds the
weights on that device: 1.1B random draws on the host take ~10 s in each process, on the
GPU well under one. The estimate's trace leaves it unset (it builds on meta/fake tensors).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import transformers

SHAPES: dict[str, dict[str, int]] = {
    "1b": {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
           "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
           "max_position_embeddings": 2048},
    "tiny": {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 172,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 64},
}  # fmt: skip
SIZE = os.environ.get("GPU_CHECK_MODEL", "1b")
SHAPE = SHAPES[SIZE]
SEQ_LEN = SHAPE["max_position_embeddings"]
VOCAB = SHAPE["vocab_size"]
LAYERS = SHAPE["num_hidden_layers"]


def build_model() -> torch.nn.Module:
    """A Llama from a config (random init), with SDPA attention."""
    config = transformers.LlamaConfig(**SHAPE, use_cache=False, attn_implementation="sdpa")
    device = os.environ.get("GPU_CHECK_INIT_DEVICE")
    if device:
        with torch.device(device):
            return transformers.LlamaForCausalLM(config)
    return transformers.LlamaForCausalLM(config)


def build_batch(batch_size: int) -> dict[str, Any]:
    """Random token ids of the full sequence; labels = inputs (the model shifts them)."""
    ids = torch.randint(0, VOCAB, (batch_size, SEQ_LEN))
    return {"input_ids": ids, "labels": ids.clone()}
