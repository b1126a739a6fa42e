"""A model whose input pipeline is the bottleneck: each sample takes a few ms to "decode".

With ``workers=0`` most of the step waits for data; DataLoader workers
(``dataloader_workers=4``) hide most of that wait.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 32
HIDDEN = 64
CLASSES = 4
SAMPLES = 4096
DECODE_SECONDS = 0.008


class SlowDataset(Dataset):
    """Deterministic random samples, each behind a sleep standing in for decoding or I/O."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(DECODE_SECONDS)
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(FEATURES, generator=generator)
        return x, torch.tensor(index % CLASSES)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.blocks = nn.ModuleList(Block(HIDDEN) for _ in range(2))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build_model() -> nn.Module:
    return SmallNet()


def build_dataloader(batch_size: int) -> DataLoader:
    return DataLoader(SlowDataset(), batch_size=batch_size, shuffle=False, drop_last=True)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
