"""Synthetic profile records for tests: one builder, with knobs for the figures a test cares about.

``profile_record`` fills in everything a profile needs around the figures it is given;
``synthetic_profile`` derives those figures from a few knobs (policy and suggest tests).
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.records import (
    ActivationFit,
    AtPeak,
    BlockStack,
    Capabilities,
    Compute,
    Environment,
    MemoryBreakdown,
    ModelInfo,
    ModuleBytes,
    ProfileConfig,
    ProfileRecord,
    Provenance,
    Spread,
    StepTime,
    Throughput,
)

GB = 10**9


def model_info(
    parameters: int,
    layers: int,
    *,
    tokens_per_sample: int = 128,
    class_name: str = "LlamaForCausalLM",
    block_path: str = "model.layers",
    block_class: str = "LlamaDecoderLayer",
    embedding_parameters: int = 0,
    largest_layer_parameters: int = 0,
    hidden_size: int | None = None,
    num_attention_heads: int | None = None,
    num_layers: int | None = None,
    attention: str | None = None,
) -> ModelInfo:
    """A model of ``layers`` blocks (none when 0) whose parameters are all trainable."""
    return ModelInfo(
        class_name=class_name,
        parameters=parameters,
        trainable_parameters=parameters,
        embedding_parameters=embedding_parameters,
        largest_layer_parameters=largest_layer_parameters,
        block_stack=BlockStack(path=block_path, count=layers, block_class=block_class)
        if layers
        else None,
        tokens_per_sample=tokens_per_sample,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        attention=attention,
        num_layers=num_layers,
    )


def activation_fit(
    *,
    fixed: int,
    per_sample: float,
    block: float,
    block_input: float,
    batch_sizes: tuple[int, int] = (2, 4),
) -> ActivationFit:
    """Activations fitted over two batch sizes: whole model and per block, per sample."""
    return ActivationFit(
        batch_sizes=batch_sizes,
        fixed=fixed,
        per_sample=per_sample,
        block_fixed=0,
        block_per_sample=block,
        block_input_per_sample=block_input,
    )


def provenance(**fields: str) -> Provenance:
    """Where a profile came from: ``autotune profile`` of a model file with an all-zero hash."""
    defaults = {
        "command": "autotune profile",
        "model_sha256": "0" * 64,
        "autotune_version": "0.1.0",
    }
    return Provenance(**{**defaults, **fields})


def profile_record(
    *,
    model: ModelInfo,
    batch_size: int,
    device: str = "cpu",
    precision: str = "fp32",
    checkpointing: bool = False,
    steps: int = 10,
    warmup: int = 2,
    # memory; the peak is the sum of at_peak, which defaults to the model states and activations
    model_states: tuple[int, int, int] | None = None,
    activations: int,
    fit: ActivationFit | None,
    at_peak: AtPeak | None = None,
    buffers: int = 0,
    activations_by_module: Sequence[ModuleBytes] = (),
    fits_judged_on: str = "peak",
    # time: phases are forward, backward, optimizer; spread is min, p25, median, p75, max
    step: float,
    dataloader: float,
    phases: tuple[float, float, float],
    spread: tuple[float, float, float, float, float] | None = None,
    samples_per_s: float,
    tokens_per_s: float | None = None,
    compute: Compute | None = None,
    # environment
    device_name: str,
    device_memory: int | None = None,
    torch_version: str = "2.13.0",
    bf16_ratio: float | None = None,
    provenance: Provenance,
) -> ProfileRecord:
    """A profile record; model states default to fp32 Adam's 16 bytes/parameter (4, 4, 8)."""
    n = model.parameters
    params, grads, optim = model_states or (4 * n, 4 * n, 8 * n)
    at_peak = at_peak or AtPeak(
        parameters=params, gradients=grads, optimizer_states=optim, activations=activations
    )
    minimum, p25, median, p75, maximum = spread or (step,) * 5
    forward, backward, optimizer = phases
    cuda = device == "cuda"
    return ProfileRecord(
        config=ProfileConfig(
            batch_size=batch_size,
            precision=precision,  # type: ignore[arg-type]
            checkpointing=checkpointing,
            steps=steps,
            warmup=warmup,
            device=device,
        ),
        model=model,
        memory=MemoryBreakdown(
            parameters=params,
            buffers=buffers,
            gradients=grads,
            optimizer_states=optim,
            activations=activations,
            activations_by_module=list(activations_by_module),
            activation_fit=fit,
            peak=sum(at_peak.model_dump().values()),
            peak_source="cuda_max_allocated" if cuda else "cpu_live_tensors",
            at_peak=at_peak,
            fits_judged_on=fits_judged_on,
        ),
        time=StepTime(
            step=step,
            dataloader=dataloader,
            forward=forward,
            backward=backward,
            optimizer=optimizer,
            spread=Spread(min=minimum, p25=p25, median=median, p75=p75, max=maximum),
            steps_measured=steps,
        ),
        throughput=Throughput(samples_per_s=samples_per_s, tokens_per_s=tokens_per_s),
        compute=compute or Compute(flops_per_step=None),
        environment=Environment(
            device_type=device,
            device_name=device_name,
            device_count=1,
            device_memory_bytes=device_memory,
            torch_version=torch_version,
            capabilities=Capabilities(
                bf16_supported=True,
                fp16_supported=cuda,
                bf16_fp32_speed_ratio=bf16_ratio,
                sdpa_available=True,
                flash_attn_available=False,
                compute_capability="8.0" if cuda else None,
            ),
        ),
        provenance=provenance,
    )


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
    attention: str | None = None,
) -> ProfileRecord:
    """A profile with model states 16 bytes/param and activations linear in the batch."""
    block_per_sample = 0.9 * activations_per_sample / layers
    compute = step - dataloader
    cuda = device == "cuda"
    return profile_record(
        model=model_info(
            parameters,
            layers,
            tokens_per_sample=512,
            largest_layer_parameters=parameters // 10,
            hidden_size=768 if heads else None,
            num_attention_heads=heads,
            num_layers=layers or None,
            attention=attention,
        ),
        batch_size=batch_size,
        device=device,
        precision=precision,
        activations=int(activations_per_sample * batch_size),
        fit=activation_fit(
            fixed=0,
            per_sample=activations_per_sample,
            block=block_per_sample,
            block_input=block_per_sample / 20,
            batch_sizes=(batch_size // 2 or 1, batch_size),
        ),
        step=step,
        dataloader=dataloader,
        phases=(compute / 3, 2 * compute / 3 * 0.9, 2 * compute / 3 * 0.1),
        samples_per_s=batch_size / step,
        device_name="NVIDIA A100-SXM4-80GB" if cuda else "cpu",
        device_memory=80 * GB if cuda else None,
        bf16_ratio=bf16_ratio,
        provenance=provenance(
            model_file="synthetic.py",
            created_at="2026-11-29T00:00:00Z",
            command="autotune profile synthetic.py",
        ),
    )


HAND_P = 1_000_000
"""Parameters of :func:`hand_profile`'s model."""
HAND_L = 4


def hand_profile(
    *, batch: int = 4, checkpointing: bool = False, at_peak: AtPeak | None = None, fit: bool = True
) -> ProfileRecord:
    """A profile as the profiler writes it, with figures chosen by hand."""
    peak_parts = at_peak or AtPeak(
        parameters=4 * HAND_P,
        buffers=128,
        optimizer_states=8 * HAND_P,
        activations=4_000_000,
        temporaries=400_000,
    )
    fitted = activation_fit(
        fixed=8_000, per_sample=998_000.0, block=200_000.0, block_input=10_000.0
    )
    return profile_record(
        model=model_info(
            HAND_P,
            HAND_L,
            class_name="Synthetic",
            block_path="layers",
            block_class="Block",
            embedding_parameters=100_000,
            largest_layer_parameters=200_000,
        ),
        batch_size=batch,
        checkpointing=checkpointing,
        steps=5,
        warmup=1,
        activations=4_000_000,
        buffers=128,
        fit=fitted if fit else None,
        at_peak=peak_parts,
        fits_judged_on="memory.peak",
        step=1.0,
        dataloader=0.05,
        phases=(0.3, 0.55, 0.1),
        spread=(0.9, 0.95, 1.0, 1.05, 1.2),
        samples_per_s=4.0,
        tokens_per_s=512.0,
        compute=Compute(flops_per_step=1e9),
        device_name="test cpu",
        torch_version="x",
        provenance=provenance(
            model_file="m.py", created_at="now", model_sha256="0", autotune_version="0"
        ),
    )
