"""Traced activations (fake tensors, nothing allocated) equal the measured ones on the examples."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from autotune.estimator import ActivationSpec
from autotune.estimator._costmodel import saved_activations
from autotune.records import AutotuneError
from autotune.runtime import _memory as mem
from autotune.runtime._blocks import apply_checkpointing
from autotune.runtime.modelfile import load_model_file
from autotune.runtime.trace import facts_from_hf_config, facts_from_model_file, load_hf_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_AUTOCAST = {"amp_bf16": torch.bfloat16}


def measured(path: Path, precision: str, batch_size: int, blocks: int) -> tuple[int, int]:
    """Saved activations and autocast copies of one real forward, counted by the profiler's counter."""
    model_file = load_model_file(path)
    torch.manual_seed(0)
    model = model_file.build_model()
    apply_checkpointing(model, blocks)
    batch = next(model_file.batches(batch_size, workers=0))
    dtype = _AUTOCAST.get(precision)
    with (
        torch.autocast("cpu", dtype=dtype, enabled=dtype is not None),
        mem.count_saved_tensors(model) as saved,
    ):
        loss = model_file.loss(model, batch)
    del loss
    return saved.activations, saved.autocast_weight_copies


def predicted(spec: ActivationSpec, layers: int, batch_size: int, blocks: int) -> float:
    return saved_activations(spec.figures(layers), batch_size, blocks)


@pytest.mark.slow
@pytest.mark.parametrize("example", ["tiny_llama", "mlp_dataloader"])
def test_traced_activations_equal_measured(example: str) -> None:
    path = EXAMPLES / f"{example}.py"
    facts = facts_from_model_file(path, precisions=("fp32", "amp_bf16"))
    layers = facts.num_layers
    assert layers == 4
    for precision, spec in facts.activations.items():
        assert spec.source == "traced"
        for blocks in (0, 2, layers):
            # batch 3 is outside the fit's points (1 and 2): the linear model must carry
            real, copies = measured(path, precision, 3, blocks)
            assert predicted(spec, layers, 3, blocks) == pytest.approx(real, rel=0.01), (
                precision,
                blocks,
            )
            saved_copies = spec.autocast_weight_copies - blocks * spec.block_autocast_weight_copies
            assert saved_copies == pytest.approx(copies, rel=0.01, abs=1)


@pytest.mark.slow
def test_model_file_facts_count_parameters_like_the_profiler() -> None:
    facts = facts_from_model_file(EXAMPLES / "tiny_llama.py", precisions=("fp32",))
    model = load_model_file(EXAMPLES / "tiny_llama.py").build_model()
    assert facts.parameters == sum(p.numel() for p in model.parameters())
    assert facts.block_stack == "model.layers"
    assert facts.seq_len == 128
    assert facts.block_parameters == sum(p.numel() for p in model.model.layers[0].parameters())


def _llama_70b_parameters(cfg: dict[str, int]) -> int:
    """Llama parameter count by hand: embeddings, head, and L identical blocks."""
    h, f, v, layers = (
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
        cfg["num_hidden_layers"],
    )
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # q, o; k, v; gate, up, down; two RMSNorms
    return 2 * v * h + layers * block + h  # embedding + untied head + blocks + final norm


@pytest.mark.slow
def test_70b_config_is_traced_in_seconds_without_its_memory() -> None:
    path = EXAMPLES / "configs" / "llama3_70b.json"
    psutil = pytest.importorskip("psutil")
    before = psutil.Process(os.getpid()).memory_info().rss
    facts = facts_from_hf_config(path, 4096, precisions=("bf16",))
    grown = psutil.Process(os.getpid()).memory_info().rss - before
    assert grown < 2 * 2**30  # 70B in bf16 would be 141 GB
    assert facts.parameters == _llama_70b_parameters(json.loads(path.read_text()))
    assert facts.num_layers == 80
    assert facts.embedding_parameters == 128256 * 8192
    spec = facts.activations["bf16"]
    # every block keeps at least its bf16 input (b, s, h) when checkpointed
    assert spec.block_input_per_sample >= 4096 * 8192 * 2
    assert spec.per_sample > 80 * spec.block_per_sample


@pytest.mark.slow
def test_shortened_trace_scales_to_the_full_stack(tmp_path: Path) -> None:
    import transformers

    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    facts = facts_from_hf_config(path, 32, precisions=("fp32",))
    spec = facts.activations["fp32"]
    cfg = load_hf_config(path)
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, 300, (3, 32))
    for blocks in (0, 6):
        apply_checkpointing(model, blocks)
        with mem.count_saved_tensors(model) as saved:
            loss = model(input_ids=ids, labels=ids).loss
        del loss
        assert predicted(spec, 6, 3, blocks) == pytest.approx(saved.activations, rel=0.01)
    assert facts.parameters == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "cannot read JSON"),
        ('{"hidden_size": 4}', "model_type"),
        ('{"model_type": "nope"}', "nope"),
    ],
)
def test_bad_hf_config_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(AutotuneError, match=message):
        load_hf_config(path)


@pytest.mark.parametrize(
    ("source", "batch", "checkpointed"),
    [("cnn", 8, False), ("tiny_llama", 4, False), ("tiny_llama", 4, True)],
)
def test_whole_step_trace_predicts_the_profilers_peak(
    source: str, batch: int, checkpointed: bool, tmp_path: Path
) -> None:
    # From the model file alone (no profile), the predicted peak, temporaries included,
    # against torch's memory profiler on a real step of the same plan.
    from _models import CNN
    from _reference import reference_step

    from autotune.estimator import estimate_plan
    from autotune.records import Plan

    if source == "cnn":
        path = tmp_path / "cnn.py"
        path.write_text(CNN)
    else:
        path = EXAMPLES / "tiny_llama.py"
    facts = facts_from_model_file(path, precisions=("fp32",))
    assert facts.traced_moment is not None and facts.traced_moment.at_peak.temporaries > 0
    plan = Plan(micro_batch=batch, checkpoint_blocks=facts.num_layers if checkpointed else 0)
    predicted = estimate_plan(facts, plan).memory.peak
    reference = reference_step(path, batch, checkpoint=checkpointed)
    assert predicted == pytest.approx(reference.peak, rel=0.05)


def test_cpu_plans_of_a_cnn_carry_onednn_scratch_the_trace_cannot_see(tmp_path: Path) -> None:
    # oneDNN's convolution scratch is no tensor: fake tensors miss it, c10's allocator holds it.
    # For plans on a CPU the model-file road measures it with one real plain step, so its moment
    # is the peak `autotune profile` measures at that micro-batch (a different run of the model).
    from autotune.compose import profile_model
    from autotune.runtime import hf

    text, _, stem = hf.hf_model_file(hf_config=str(EXAMPLES / "zoo" / "resnet.json"), seq_len=64)
    path = tmp_path / f"{stem}.py"
    path.write_text(text, encoding="utf-8")
    traced = facts_from_model_file(path, precisions=("fp32",)).traced_moment
    moment = facts_from_model_file(path, precisions=("fp32",), cpu_scratch=8).traced_moment
    assert traced is not None and moment is not None and moment.plan == traced.plan
    assert moment.peak > traced.peak  # the scratch, beyond every tensor the trace counts
    profiled = profile_model(path, batch_size=moment.plan.micro_batch, steps=1, warmup=1,
                             device="cpu", trace=False)  # fmt: skip
    assert profiled.memory.peak_source == "cpu_allocator"
    assert moment.peak == pytest.approx(profiled.memory.peak, rel=0.01)
