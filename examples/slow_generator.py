"""An input-bound model whose ``build_dataloader`` is a plain Python generator, not a DataLoader.

Each batch takes 30 ms to make (a sleep standing in for reading and decoding). autotune
diagnoses the step as input-bound, but it cannot give a generator workers: ``confirm``
reports the change as not applicable, with the code change (a ``Dataset`` in a
``DataLoader`` with ``num_workers``), instead of measuring two identical plans.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch import nn

FEATURES = 32
CLASSES = 4
BATCH_SECONDS = 0.03


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(FEATURES) for _ in range(2))
        self.head = nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model() -> nn.Module:
    return SmallNet()


def build_dataloader(batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless batches, each made in this process (no workers can be added to a generator)."""
    generator = torch.Generator().manual_seed(0)
    while True:
        time.sleep(BATCH_SECONDS)
        x = torch.randn(batch_size, FEATURES, generator=generator)
        yield x, torch.randint(0, CLASSES, (batch_size,), generator=generator)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
