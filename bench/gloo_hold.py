"""Does gloo's all_reduce still hold its tensor after the call returns? (a cause of ZeRO peak spread)

Each of 200 rounds all-reduces a fresh 400 KB tensor over 2 ranks, drops every Python reference
to it, and asks a weak reference to its storage whether it is still alive: it is when the
process group's worker thread has not yet released the finished work.

Run: OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 \\
         bench/gloo_hold.py
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

ROUNDS = 200


def main() -> None:
    dist.init_process_group("gloo")
    alive = 0
    for _ in range(ROUNDS):
        tensor = torch.ones(100_000)
        storage = weakref.ref(tensor.untyped_storage())
        dist.all_reduce(tensor)
        del tensor
        alive += storage() is not None
    if dist.get_rank() == 0:
        print(f"rank 0: storage alive after all_reduce returned and its last Python reference "
              f"went: {alive} of {ROUNDS} rounds; torch {torch.__version__}")  # fmt: skip
    dist.barrier()  # leave together: a group destroyed under a peer's gloo threads can abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
