"""Tiny model files the tests share: each a model-file text that ``autotune`` imports."""

from __future__ import annotations

MLP_STACK = """
import torch
from torch import nn

BLOCKS, WIDTH, HIDDEN = {blocks}, {width}, {hidden}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    return Net()


def build_batch(batch_size):
    return torch.randn(batch_size, WIDTH), torch.randn(batch_size, 1)


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x).float(), y)
"""


def mlp_stack(blocks: int = 3, width: int = 32, hidden: int = 64) -> str:
    """A residual MLP of ``blocks`` blocks (the block stack autotune checkpoints), MSE loss."""
    return MLP_STACK.format(blocks=blocks, width=width, hidden=hidden)


def mlp_stack_parameters(blocks: int = 3, width: int = 32, hidden: int = 64) -> int:
    """Its parameter count, from the layer shapes (weights and biases)."""
    block = (width * hidden + hidden) + (hidden * width + width)
    return blocks * block + width + 1
