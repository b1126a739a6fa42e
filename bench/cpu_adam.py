"""Is an offloaded optimizer's step time what the estimate predicts?

An offloaded plan steps Adam on the host: each rank of a node steps its fp32 partition
(trainable / world size elements) with DeepSpeed's ``cpu_adam`` at the same time as the
node's other ranks. The estimate predicts that step from one figure the profile probes, the
rate torch's fused Adam steps at on this CPU (``autotune.runtime._host.host_adam_rate``), as
``partition x ranks per node / rate`` (``autotune.estimator._costmodel.host_adam_seconds``).

Measured here, independently: ``--ranks`` processes started together, each with its share of
the CPU's threads (as ``torchrun`` gives a rank), each stepping ``DeepSpeedCPUAdam`` over a
flat fp32 partition of the model's size; a node's step ends with its slowest rank, so the
measured step is the slowest rank's median. Probe and measurement alternate over ``--rounds``
rounds; the table gives medians with [min, max] over rounds.

The rows: GPT-2 small (``examples/gpt2_small.py``, 124M) on 1 and 2 ranks, and Llama-2-7B's
partition over 64 ranks with 2 of them on this node (``examples/configs/llama2_7b.json``), a
size and layout the rate was never looked at on.

Run: ``TORCH_EXTENSIONS_DIR=~/.cache/autotune-torch-extensions DS_ACCELERATOR=cpu
.venv/bin/python bench/cpu_adam.py`` (the first run builds DeepSpeed's ``cpu_adam`` op, about a
minute).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
REPO = Path(__file__).resolve().parents[1]
STEPS = 7
DEADLINE_S = 600


def _child(elements: int, go: str, out: str) -> None:
    """One rank: wait for ``go``, step ``cpu_adam`` over ``elements`` fp32 elements, write the
    median step seconds to ``out``."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    param = torch.nn.Parameter(torch.zeros(elements))
    param.grad = torch.ones(elements)
    optimizer = DeepSpeedCPUAdam([param], lr=1e-3)
    optimizer.step()
    Path(out + ".ready").touch()
    deadline = time.monotonic() + DEADLINE_S
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"cpu_adam child: no go file {go} within {DEADLINE_S} s")
        time.sleep(0.01)
    seconds = []
    for _ in range(STEPS):
        start = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    Path(out).write_text(json.dumps(statistics.median(seconds)))


def measured_step(partition: int, ranks: int, threads: int) -> float:
    """The slowest of ``ranks`` concurrent ranks' median ``cpu_adam`` step over ``partition``."""
    with tempfile.TemporaryDirectory() as tmp:
        go, outs = f"{tmp}/go", [f"{tmp}/rank{r}" for r in range(ranks)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        children = [
            subprocess.Popen(
                [sys.executable, __file__, "--child", str(partition), go, out],
                env=env,
                start_new_session=True,
            )
            for out in outs
        ]
        try:
            deadline = time.monotonic() + DEADLINE_S
            print(f"  waiting for {ranks} cpu_adam ranks to build and warm up", file=sys.stderr)
            while not all(Path(o + ".ready").exists() for o in outs):
                if time.monotonic() > deadline or any(c.poll() for c in children):
                    raise SystemExit("cpu_adam ranks did not get ready (see their stderr)")
                time.sleep(0.05)
            Path(go).touch()
            for child in children:
                if child.wait(timeout=DEADLINE_S) != 0:
                    raise SystemExit(f"a cpu_adam rank exited {child.returncode}")
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
        return max(json.loads(Path(o).read_text()) for o in outs)


def _trainable(source: str) -> int:
    """Trainable parameters of a model file or an HF config, counted by autotune's trace."""
    from autotune.runtime.trace import facts_from_hf_config, facts_from_model_file

    if source.endswith(".json"):
        return facts_from_hf_config(source, seq_len=128, precisions=("fp32",)).trainable_parameters
    return facts_from_model_file(source, precisions=("fp32",), step=False).trainable_parameters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import torch

    from autotune.estimator._costmodel import host_adam_seconds
    from autotune.runtime._host import host_adam_rate

    cores = os.cpu_count() or 1
    gpt2 = _trainable(str(REPO / "examples/gpt2_small.py"))
    llama = _trainable(str(REPO / "examples/configs/llama2_7b.json"))
    rows = [  # (name, trainable, world size, ranks on this node)
        ("GPT-2 small, 1 rank", gpt2, 1, 1),
        ("GPT-2 small, 2 ranks", gpt2, 2, 2),
        ("Llama-2-7B over 64 ranks, 2 on this node (held out)", llama, 64, 2),
    ]
    predicted: dict[str, list[float]] = {name: [] for name, *_ in rows}
    measured: dict[str, list[float]] = {name: [] for name, *_ in rows}
    torch.set_num_threads(cores)
    for index in range(args.rounds):
        print(f"round {index + 1} of {args.rounds}", file=sys.stderr)
        for name, trainable, world, local in rows:
            rate = host_adam_rate()
            partition = trainable // world
            predicted[name].append(host_adam_seconds(partition, local, rate))
            measured[name].append(measured_step(partition, local, max(cores // local, 1)))
    print(f"CPU: {cores} cores, torch {torch.__version__}; {args.rounds} interleaved rounds")
    print("| plan | partition (elements per rank) | predicted s | measured s | error |")
    print("| --- | --- | --- | --- | --- |")
    for name, trainable, world, _ in rows:
        p, m = predicted[name], measured[name]
        error = statistics.median(p) / statistics.median(m) - 1
        print(
            f"| {name} | {trainable // world:,} | {statistics.median(p):.4f} "
            f"[{min(p):.4f}, {max(p):.4f}] | {statistics.median(m):.4f} "
            f"[{min(m):.4f}, {max(m):.4f}] | {error:+.1%} |"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
