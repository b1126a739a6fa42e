"""Synthetic profile records for policy and suggest tests: one knob per situation."""

from __future__ import annotations

from autotune.records import (
    ActivationFit,
    AtPeak,
    BlockStack,
    Capabilities,
    Compute,
    Environment,
    MemoryBreakdown,
    ModelInfo,
    ProfileConfig,
    ProfileRecord,
    Provenance,
    Spread,
    StepTime,
    Throughput,
)

GB = 10**9


def synthetic_profile(
    *,
    device: str = "cuda",
    parameters: int = 100_000_000,
    batch_size: int = 8,
    activations_per_sample: float = 0.1 * GB,
    layers: int = 12,
    step: float = 1.0,
    dataloader: float = 0.0,
    bf16_ratio: float | None = 3.0,
    precision: str = "fp32",
    heads: int | None = 12,
) -> ProfileRecord:
    """A profile with model states 16 bytes/param and activations linear in the batch."""
    params, grads, optim = 4 * parameters, 4 * parameters, 8 * parameters
    acts = int(activations_per_sample * batch_size)
    block_per_sample = 0.9 * activations_per_sample / layers
    fit = ActivationFit(
        batch_sizes=(batch_size // 2 or 1, batch_size),
        fixed=0,
        per_sample=activations_per_sample,
        block_fixed=0,
        block_per_sample=block_per_sample,
        block_input_per_sample=block_per_sample / 20,
    )
    peak = params + grads + optim + acts
    compute = step - dataloader
    cuda = device == "cuda"
    return ProfileRecord(
        config=ProfileConfig(
            batch_size=batch_size,
            precision=precision,  # type: ignore[arg-type]
            checkpointing=False,
            steps=10,
            warmup=2,
            device=device,
        ),
        model=ModelInfo(
            class_name="LlamaForCausalLM",
            parameters=parameters,
            trainable_parameters=parameters,
            largest_layer_parameters=parameters // 10,
            block_stack=BlockStack(
                path="model.layers", count=layers, block_class="LlamaDecoderLayer"
            )
            if layers
            else None,
            tokens_per_sample=512,
            hidden_size=768 if heads else None,
            num_attention_heads=heads,
            num_layers=layers or None,
        ),
        memory=MemoryBreakdown(
            parameters=params,
            gradients=grads,
            optimizer_states=optim,
            activations=acts,
            activation_fit=fit,
            peak=peak,
            peak_source="cuda_max_allocated" if cuda else "cpu_live_tensors",
            at_peak=AtPeak(
                parameters=params, gradients=grads, optimizer_states=optim, activations=acts
            ),
            fits_judged_on="peak",
        ),
        time=StepTime(
            step=step,
            dataloader=dataloader,
            forward=compute / 3,
            backward=2 * compute / 3 * 0.9,
            optimizer=2 * compute / 3 * 0.1,
            spread=Spread(min=step, p25=step, median=step, p75=step, max=step),
            steps_measured=10,
        ),
        throughput=Throughput(samples_per_s=batch_size / step),
        compute=Compute(flops_per_step=None),
        environment=Environment(
            device_type=device,
            device_name="NVIDIA A100-SXM4-80GB" if cuda else "cpu",
            device_count=1,
            device_memory_bytes=80 * GB if cuda else None,
            torch_version="2.13.0",
            capabilities=Capabilities(
                bf16_supported=True,
                fp16_supported=cuda,
                bf16_fp32_speed_ratio=bf16_ratio,
                sdpa_available=True,
                flash_attn_available=False,
                compute_capability="8.0" if cuda else None,
            ),
        ),
        provenance=Provenance(
            command="autotune profile synthetic.py",
            model_file="synthetic.py",
            model_sha256="0" * 64,
            created_at="2026-11-29T00:00:00Z",
            autotune_version="0.1.0",
        ),
    )
