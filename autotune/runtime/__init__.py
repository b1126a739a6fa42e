"""The torch boundary: everything that imports torch, CUDA, NVML or DeepSpeed lives here.

Public modules (the composer, the CLI and benches use them): ``profiler`` (measure real
steps), ``trace`` and ``trace_cache`` (the pre-run estimate's traced step), ``hf``
(Hugging Face model sources), ``modelfile`` (the user's model file), ``ab`` (interleaved
A/B steps), ``ds_validate`` (DeepSpeed's own config check) and ``trial`` (the trial
processes). Modules with a leading underscore are this package's own.
"""

__all__ = ["ab", "ds_validate", "hf", "modelfile", "profiler", "trace", "trace_cache", "trial"]
