"""A non-transformer example: a residual MLP fed by a DataLoader, with its own loss_fn."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 64
HIDDEN = 256
CLASSES = 10
SAMPLES = 2048


class Block(nn.Module):
    """Pre-norm residual MLP block: the repeated unit checkpointing applies to."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class ResidualMLP(nn.Module):
    """Input projection, a stack of blocks, a classifier head."""

    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.blocks = nn.ModuleList(Block(HIDDEN) for _ in range(blocks))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build_model() -> nn.Module:
    return ResidualMLP()


def build_dataloader(batch_size: int) -> DataLoader:
    """A shuffled loader over a fixed random data set (seeded: the same every run)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
