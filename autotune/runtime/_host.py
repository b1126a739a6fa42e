"""What this machine's CPU does for an offloaded optimizer: the rate it steps Adam at."""

from __future__ import annotations

import statistics
import time

import torch

PROBE_ELEMENTS = 16 * 2**20
"""Elements the probe steps: 256 MiB of parameter, gradient and moments, beyond any CPU cache,
as an offloaded partition is."""


def host_adam_rate(elements: int = PROBE_ELEMENTS, steps: int = 5) -> float:
    """Elements per second torch's fused Adam steps on this CPU with this process's threads.

    An offloaded optimizer (DeepSpeed's ``cpu_adam``, FSDP2's ``CPUOffloadPolicy`` with a
    fused optimizer) steps each rank's fp32 partition with vectorised code that reads the
    parameter, gradient and both moments and writes three of them back: the same streams this
    probe runs. The median of ``steps`` steps after one warm-up step.
    """
    param = torch.nn.Parameter(torch.zeros(elements))
    param.grad = torch.ones(elements)
    optimizer = torch.optim.Adam([param], lr=1e-3, fused=True)
    optimizer.step()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return elements / statistics.median(seconds)
