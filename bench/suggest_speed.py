"""How long does `autotune suggest` take from a saved profile? (goal: <= 0.5 s wall, whole process)

Run: .venv/bin/python bench/suggest_speed.py [--repeats 7]
Writes nothing; prints the median and spread of whole-process wall and CPU times of
`autotune suggest PROFILE --json` (Python start-up and imports included), for a
small profile and for a 16-device case that runs the ZeRO rules.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _profiles import synthetic_profile  # noqa: E402

from autotune.policy import suggest
from autotune.records import ProfileRecord, read_record, write_record

CASES = {
    "input_bound_gpu": ({"dataloader": 0.5}, []),
    "70B_16_devices_slow_link": (
        {"device": "cpu", "bf16_ratio": 0.15, "parameters": 70_000_000_000, "layers": 80},
        [
            "--device-memory",
            "80GB",
            "--nproc-per-node",
            "8",
            "--nnodes",
            "2",
            "--inter-gbps",
            "25",
        ],
    ),
}


def wall_times(profile: Path, extra: list[str], repeats: int) -> tuple[list[float], list[float]]:
    """Whole-process wall seconds and CPU seconds (user + system) of each run of the CLI."""
    command = [
        str(Path(sys.executable).parent / "autotune"),
        "suggest",
        str(profile),
        "--json",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    times, cpu = [], []
    for _ in range(repeats):
        used = _children_cpu()
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - start)
        cpu.append(_children_cpu() - used)
    return times, cpu


def in_process(profile: Path, extra: list[str], repeats: int) -> list[float]:
    """Seconds of read_record + suggest() alone, without interpreter start-up and imports."""
    options: dict[str, object] = {}
    flags = dict(zip(extra[::2], extra[1::2], strict=True))
    if "--device-memory" in flags:
        options["device_memory"] = int(flags["--device-memory"].removesuffix("GB")) * 10**9
    if "--nproc-per-node" in flags:
        per_node = int(flags["--nproc-per-node"])
        options["nproc_per_node"] = per_node
        options["world_size"] = per_node * int(flags.get("--nnodes", "1"))
    if "--inter-gbps" in flags:
        options["inter_gbps"] = float(flags["--inter-gbps"])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        suggest(read_record(profile, ProfileRecord, "profile"), **options)  # type: ignore[arg-type]
        times.append(time.perf_counter() - start)
    return times


def _children_cpu() -> float:
    # CPU time is what the command costs; wall time also counts waiting for the shared cores.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name, (knobs, extra) in CASES.items():
            path = write_record(Path(folder) / f"{name}.json", synthetic_profile(**knobs))
            times, cpu = wall_times(path, extra, args.repeats)
            print(
                f"{name}: wall median {statistics.median(times):.3f} s "
                f"(min {min(times):.3f}, max {max(times):.3f}); "
                f"CPU median {statistics.median(cpu):.3f} s; n={len(times)}"
            )
            alone = in_process(path, extra, args.repeats)
            print(f"{name}: suggest() in-process median {statistics.median(alone) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
