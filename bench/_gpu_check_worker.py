"""The GPU check's trial worker: autotune's own trial worker, plus what it does not record.

Run by ``SubprocessRunner(worker=this file)`` exactly as ``autotune.runtime.trial.worker``
is, it runs the same trial and also writes, to the JSON file named by ``GPU_CHECK_EXTRA``,
the GPU memory the caching allocator reserved over the trial and the NVML utilisation
sampled while the training steps ran (warm-up included).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from autotune.records import read_record
from autotune.runtime import _device as dev
from autotune.runtime.trial import steps as trial_steps
from autotune.runtime.trial import worker as trial_worker
from autotune.search import WorkerSpec


def _sampled_steps(device: Any, samplers: list[dev.NvmlSampler]) -> Any:
    """The worker's step loop, run inside an NVML sampler."""
    run = trial_steps.Steps.run

    def sampled(self: Any, step: Any, peak_on: Any = None) -> None:
        with dev.NvmlSampler(device) as sampler:
            run(self, step, peak_on)
        samplers.append(sampler)

    return sampled


def main(argv: list[str]) -> int:
    """Run the trial of ``argv[0]`` (a spec file), then write the extra figures."""
    spec = read_record(argv[0], WorkerSpec, "trial spec")
    device = dev.resolve_device(spec.settings.device)
    samplers: list[dev.NvmlSampler] = []
    trial_steps.Steps.run = _sampled_steps(device, samplers)  # type: ignore[method-assign]
    code = trial_worker.main(argv)
    nvml = samplers[0].result() if samplers else None
    peaks = dev.allocator_peak(device)
    extra = {
        "reserved_bytes": peaks[1] if peaks else None,
        "gpu_utilization_percent": nvml.gpu_utilization_percent if nvml else None,
        "nvml_memory_used_bytes": nvml.memory_used_bytes if nvml else None,
        "nvml_reason": samplers[0].reason if samplers else "the steps did not run",
    }
    Path(os.environ["GPU_CHECK_EXTRA"]).write_text(json.dumps(extra), encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
