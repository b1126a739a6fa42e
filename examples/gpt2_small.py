"""A GPT-2-small-shaped causal LM (124M parameters, random init, sequence 256): a realistic size.

Tiny models hide what DeepSpeed allocates; this one is what the accuracy benches use to check
that the cost model scales. Nothing is downloaded: the model is built from a config.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

SEQ_LEN = 256
CONFIG = GPT2Config(
    n_positions=SEQ_LEN, n_embd=768, n_layer=12, n_head=12, vocab_size=50257, use_cache=False
)


def build_model():
    return GPT2LMHeadModel(CONFIG)


def build_batch(batch_size):
    ids = torch.randint(0, CONFIG.vocab_size, (batch_size, SEQ_LEN))
    return {"input_ids": ids, "labels": ids}
