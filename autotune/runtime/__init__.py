"""The torch boundary: everything that imports torch, CUDA, NVML or DeepSpeed lives here."""
