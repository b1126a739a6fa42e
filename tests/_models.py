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


CNN = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, CLASSES = 256, 10


def block(cin, cout):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            block(3, 16), block(16, 16), nn.MaxPool2d(2),
            block(16, 32), block(32, 32), nn.MaxPool2d(2),
            block(32, 64), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def build_model():
    return SmallCNN()


def build_dataloader(batch_size):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 3, 32, 32, generator=g)
    y = torch.randint(0, CLASSES, (SAMPLES,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True)


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y, label_smoothing=0.1)
"""
"""A convolutional network (Conv2d + BatchNorm2d + ReLU, pooling, a linear head) fed by a
DataLoader over a TensorDataset, with its own loss."""

FROZEN_TRUNK = (
    CNN
    + """

def build_model():
    model = SmallCNN()
    model.features.requires_grad_(False)
    return model


def build_optimizer(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)
"""
)
"""The CNN with its convolutional trunk frozen: a trainable head with its own optimizer."""

TIED = """
import torch
from torch import nn


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.mid = nn.Linear(16, 16)
        self.head = nn.Linear(16, 50)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.mid(self.frozen(self.emb(ids))))


def build_model():
    return Tied()


def build_batch(batch_size):
    return {"ids": torch.randint(0, 50, (batch_size, 8))}


def loss_fn(model, batch):
    logits = model(batch["ids"])
    return nn.functional.cross_entropy(logits.reshape(-1, 50), batch["ids"].reshape(-1))
"""
"""Tied input and output embeddings, a frozen layer between."""


TINY_MLP_FILE = """
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))


def build_batch(batch_size):
    return torch.randn(batch_size, 8), torch.randn(batch_size, 1)


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)
"""
"""A model file of a tiny regression MLP: for tests about processes, locks and studies,
where the model only has to train."""
