"""`autotune profile` end to end: the record, the CLI, time split, FLOPs, and --help without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from _models import TINY_MLP_FILE
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from autotune.cli import app
from autotune.estimator import estimate_plan, facts_from_profile
from autotune.records import Plan, ProfileRecord
from autotune.runtime import _device as dev
from autotune.runtime._blocks import apply_checkpointing, checkpointed_blocks, find_block_stack
from autotune.runtime._step import TrainRunner
from autotune.runtime.modelfile import load_model_file
from autotune.runtime.profiler import _FLOP_FORMULAS, profile

REPO = Path(__file__).resolve().parents[2]


def test_json_output_is_only_the_record_and_matches_the_file(
    examples_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "p.json"
    args = ["profile", str(examples_dir / "mlp_dataloader.py"), "-b", "8", "--steps", "3"]
    result = CliRunner().invoke(
        app, [*args, "--warmup", "1", "--device", "cpu", "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    record = ProfileRecord.model_validate_json(result.stdout)
    assert ProfileRecord.model_validate_json(out.read_text()) == record
    assert record.config.batch_size == 8 and record.time.steps_measured == 3
    assert record.model.block_stack is not None and record.model.block_stack.path == "blocks"
    assert record.model.block_stack.count == 4
    assert record.environment.nvml is None and "nvml" in record.environment.unavailable
    # the cores a node's ranks share (estimate: ranks beyond them take turns), read by psutil
    assert record.environment.cores == len(psutil.Process().cpu_affinity())
    assert record.compute.peak_source == "measured_matmul"
    assert (
        record.provenance.model_sha256 == load_model_file(examples_dir / "mlp_dataloader.py").sha256
    )
    assert "mlp_dataloader.py" in record.provenance.command
    parts = record.time
    assert parts.spread.min <= parts.step <= parts.spread.max
    assert (
        parts.dataloader + parts.forward + parts.backward + parts.optimizer
        <= parts.spread.max * 1.01
    )


def test_table_output_names_the_sources(examples_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = ["profile", str(examples_dir / "mlp_dataloader.py"), "-b", "4", "--steps", "2"]
    result = CliRunner().invoke(app, [*args, "--warmup", "0", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "measured matmul" in result.stdout and "cpu_allocator" in result.stdout
    assert out.exists()


def test_bad_options_exit_2(examples_dir: Path, tmp_path: Path) -> None:
    model = str(examples_dir / "mlp_dataloader.py")
    missing_dir = tmp_path / "nope" / "p.json"
    result = CliRunner().invoke(app, ["profile", model, "-b", "2", "--out", str(missing_dir)])
    assert result.exit_code == 2 and "does not exist" in result.stderr
    if not torch.cuda.is_available():
        result = CliRunner().invoke(app, ["profile", model, "-b", "2", "--device", "cuda"])
        assert result.exit_code == 2 and "--device cuda: CUDA is not available" in result.stderr
    result = CliRunner().invoke(app, ["profile", model, "-b", "0"])
    assert result.exit_code == 2


def test_slow_input_shows_data_loading_as_the_largest_share(examples_dir: Path) -> None:
    record = profile(examples_dir / "slow_input.py", batch_size=16, steps=5, warmup=1, device="cpu")
    time = record.time
    assert time.dataloader > max(time.forward, time.backward, time.optimizer)
    assert time.dataloader > 0.5 * time.step


def test_cpu_sdpa_flops_are_counted() -> None:
    b, h, s, d = 2, 4, 64, 16
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    counter = FlopCounterMode(display=False, custom_mapping=_FLOP_FORMULAS)
    with counter:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    forward = counter.get_total_flops()
    assert forward == 4 * b * h * s * s * d  # QK^T and AV, 2 FLOPs per multiply-add
    with counter:
        out.sum().backward()
    assert counter.get_total_flops() > 2 * forward
    plain = FlopCounterMode(display=False)
    with plain:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert plain.get_total_flops() == 0  # the gap the mapping fills


def _attention_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention as plain products, the key/value heads repeated for every query head."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def test_grouped_query_sdpa_is_counted_as_its_products() -> None:
    """A GQA attention (8 query heads over 2 key/value heads) through the fused kernel, against the
    same attention written as products that torch's own matmul formulas count: equal forwards;
    the fused backward recomputes Q K^T once more (torch before 2.13 asserted on these shapes)."""
    b, s, d = 2, 64, 16
    q = torch.randn(b, 8, s, d, requires_grad=True)
    k, v = (torch.randn(b, 2, s, d, requires_grad=True) for _ in range(2))
    fused = FlopCounterMode(display=False, custom_mapping=_FLOP_FORMULAS)
    with fused:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    fused_forward = fused.get_total_flops()
    with fused:
        out.sum().backward()
    math = FlopCounterMode(display=False)
    with math:
        out = _attention_math(q, k, v)
    math_forward = math.get_total_flops()
    with math:
        out.sum().backward()
    assert fused_forward == math_forward == 4 * b * 8 * s * s * d
    recompute = 2 * b * 8 * s * s * d
    assert (
        fused.get_total_flops() - fused_forward == math.get_total_flops() - math_forward + recompute
    )
    assert {op.__name__.split(".")[0] for op in _FLOP_FORMULAS} >= {
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention_backward",
    }  # the GPU kernels too  # fmt: skip


def test_checkpointing_keeps_the_numbers_and_unwraps(examples_dir: Path) -> None:
    loaded = load_model_file(examples_dir / "mlp_dataloader.py")
    losses = []
    for blocks in (0, 4, 2):
        runner = TrainRunner(loaded, device="cpu", micro_batch=8, checkpoint_blocks=blocks)
        assert checkpointed_blocks(runner.model) == blocks
        losses.append([runner.step().loss for _ in range(2)])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) == losses[2]
    apply_checkpointing(runner.model, 0)
    assert checkpointed_blocks(runner.model) == 0
    found = find_block_stack(runner.model)
    assert found is not None and "forward" not in found[1][0].__dict__


def test_grad_accum_runs_micro_batches(examples_dir: Path) -> None:
    loaded = load_model_file(examples_dir / "slow_input.py")
    calls = []
    original = loaded.move

    def counting_move(batch: object, device: object, non_blocking: bool = False) -> object:
        calls.append(1)
        return original(batch, device, non_blocking)  # type: ignore[arg-type]

    loaded.move = counting_move  # type: ignore[method-assign]
    runner = TrainRunner(loaded, device="cpu", micro_batch=2, grad_accum=3)
    timing = runner.step()
    assert len(calls) == 3 and timing.total >= timing.forward + timing.backward


MATMUL_OPTIMIZER = (
    TINY_MLP_FILE
    + """

class Orthogonal(torch.optim.SGD):  # a step with matrix products in it, as Muon's has
    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and p.grad.dim() == 2:
                    p.grad.copy_(p.grad @ p.grad.T @ p.grad)
        return super().step(closure)


def build_optimizer(params):
    return Orthogonal(params, lr=1e-3)
"""
)


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_a_steps_flops_are_its_forward_and_backward_products_with_or_without_warm_up(
    tmp_path: Path, warmup: int
) -> None:
    path = tmp_path / "model.py"
    path.write_text(MATMUL_OPTIMIZER)
    record = profile(path, batch_size=4, steps=1, warmup=warmup, device="cpu")
    # By hand, 2 FLOPs a multiply-add at batch B: forward 2*B*8*8 + 2*B*8*1; backward, the
    # second layer's input and weight gradients 2*B*8 each, the first layer's weight gradient
    # 2*B*8*8 (its input needs none). The optimizer's products are no model FLOPs.
    by_hand = 4 * (2 * 8 * 8 + 2 * 8 + 2 * 8 + 2 * 8 + 2 * 8 * 8)
    assert record.compute.flops_per_step == record.compute.hardware_flops_per_step == by_hand


@pytest.mark.slow
def test_tiny_llama_profile(examples_dir: Path) -> None:
    record = profile(
        examples_dir / "tiny_llama.py",
        batch_size=2,
        steps=2,
        warmup=1,
        device="cpu",
        checkpointing=True,
    )
    model = record.model
    assert model.block_stack is not None
    assert (model.block_stack.path, model.block_stack.count) == ("model.layers", 4)
    assert model.attention == "sdpa"  # the example asks for it; the policy reads it
    assert model.tokens_per_sample == 128 and model.hidden_size == 128
    names = [part.module for part in record.memory.activations_by_module]
    assert {f"model.layers.{i}" for i in range(4)} <= set(names)
    tokens = 2 * 128
    non_embedding = model.parameters - model.embedding_parameters
    compute = record.compute
    assert compute.flops_per_step is not None and compute.hardware_flops_per_step is not None
    # Linear layers alone give ~6 FLOPs per parameter per token; attention adds to it.
    assert compute.flops_per_step >= 0.9 * 6 * non_embedding * tokens
    assert compute.hardware_flops_per_step > compute.flops_per_step
    assert record.throughput.tokens_per_s == pytest.approx(record.throughput.samples_per_s * 128)


def test_peak_flops_table_and_unknown_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda")
    monkeypatch.setattr(dev, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert dev.peak_flops(cuda, "bf16") == (989e12, "table", None)
    monkeypatch.setattr(dev, "device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    assert dev.peak_flops(cuda, "bf16")[0] == 312e12
    monkeypatch.setattr(dev, "device_name", lambda device: "Mystery GPU")
    value, source, reason = dev.peak_flops(cuda, "bf16")
    assert value is None and source is None and reason and "Mystery GPU" in reason


def test_nvml_sampler_on_cpu_gives_none_with_reason() -> None:
    with dev.NvmlSampler(torch.device("cpu")) as sampler:
        pass
    assert sampler.result() is None and sampler.reason and "cpu" in sampler.reason


_NO_TORCH = (
    "import sys; sys.modules['torch'] = None; sys.argv = ['autotune'] + sys.argv[1:];"
    "from autotune.cli import main; main()"
)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["profile", "--help"]])
def test_help_and_version_run_without_torch(args: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert ("autotune" in result.stdout) and "Traceback" not in result.stderr


@pytest.mark.gpu
def test_cuda_profile_uses_allocator_peak_and_nvml(examples_dir: Path) -> None:
    record = profile(examples_dir / "tiny_llama.py", batch_size=4, steps=3, warmup=1, device="cuda")
    memory = record.memory
    assert memory.peak_source == "cuda_max_allocated" and memory.cuda_reserved is not None
    assert memory.cuda_reserved >= memory.peak
    assert sum(memory.at_peak.model_dump().values()) == memory.peak
    assert record.environment.capabilities.compute_capability is not None
    assert record.environment.nvml is not None or "nvml" in record.environment.unavailable
    assert json.loads(record.model_dump_json())["memory"]["peak"] == memory.peak


def test_profile_leaves_no_tensor_of_the_model_alive(examples_dir: Path) -> None:
    # The saved-tensor counter once returned each saved tensor from its pack hook: an op's
    # saved output then held its own grad_fn, a cycle through C++ gc cannot break, and the
    # activation fit's forward (never backwarded) kept the whole model alive after profile()
    # returned: 1.7 GB on GPT-2 small, in the process that then launches the trials.
    import gc

    def cpu_tensors() -> set[int]:
        gc.collect()
        return {
            id(o)
            for o in gc.get_objects()
            if isinstance(o, torch.Tensor) and o.device.type == "cpu"
        }

    before = cpu_tensors()
    profile(str(examples_dir / "tiny_llama.py"), batch_size=2, steps=1, warmup=1, device="cpu")
    assert cpu_tensors() - before == set()


SLEEPY = '''
import time

import torch
from torch import nn

FP32_S, BF16_S = 0.3, 0.075


class Sleepy(nn.Module):
    """Its forward sleeps 300 ms in fp32 and 75 ms under bf16 autocast: bf16 at a known 1/4."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x):
        time.sleep(BF16_S if torch.is_autocast_enabled("cpu") else FP32_S)
        return self.linear(x)


def build_model():
    return Sleepy()


def build_batch(batch_size):
    return torch.randn(batch_size, 4)


def loss_fn(model, batch):
    return model(batch).float().pow(2).mean()
'''


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_profile_measures_the_models_own_bf16_over_fp32_compute(
    precision: str, tmp_path: Path
) -> None:
    # a model whose forward takes a known time at each precision (sleeps, nothing else): the
    # probe's ratio comes out as the sleeps' 1/4 whichever precision the profile ran at
    path = tmp_path / "sleepy.py"
    path.write_text(SLEEPY)
    record = profile(path, batch_size=2, steps=3, warmup=1, device="cpu", precision=precision)  # type: ignore[arg-type]
    assert record.time.bf16_over_fp32 == pytest.approx(0.25, rel=0.3)
    assert "time.bf16_over_fp32" not in record.environment.unavailable


def test_the_bf16_probe_holds_when_the_host_slows_down_mid_profile(tmp_path: Path) -> None:
    # the host's slow phase begins after the first timed step (every sleep 3x longer from the
    # model's 4th forward on): pairing each timed step with a bf16 pass run right after it keeps
    # the ratio at 1/4. Probing after all the timed steps, as before, measured 3/4.
    slowing = SLEEPY.replace(
        '        time.sleep(BF16_S if torch.is_autocast_enabled("cpu") else FP32_S)',
        "        Sleepy.calls += 1\n"
        "        phase = 3 if Sleepy.calls > 3 else 1\n"
        '        time.sleep(phase * (BF16_S if torch.is_autocast_enabled("cpu") else FP32_S))',
    ).replace("    def __init__(self):", "    calls = 0\n\n    def __init__(self):")
    assert slowing.count("Sleepy.calls") == 2
    path = tmp_path / "slowing.py"
    path.write_text(slowing)
    record = profile(path, batch_size=2, steps=3, warmup=1, device="cpu")
    assert record.time.bf16_over_fp32 == pytest.approx(0.25, rel=0.3)


def test_the_bf16_probe_pairs_three_timed_steps_whatever_the_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12 timed steps: a bf16 pass after the warm-up and after 3 of them, not after all 12
    counted = SLEEPY.replace(
        '        time.sleep(BF16_S if torch.is_autocast_enabled("cpu") else FP32_S)',
        '        if torch.is_autocast_enabled("cpu"):\n'
        '            with open(os.environ["BF16_CALLS"], "a") as calls:\n'
        '                calls.write("1")\n'
        '        time.sleep(BF16_S if torch.is_autocast_enabled("cpu") else FP32_S)',
    ).replace("import time\n", "import os\nimport time\n")
    path, calls = tmp_path / "counted.py", tmp_path / "calls"
    path.write_text(counted)
    monkeypatch.setenv("BF16_CALLS", str(calls))
    record = profile(path, batch_size=2, steps=12, warmup=1, device="cpu")
    assert record.time.bf16_over_fp32 is not None
    assert len(calls.read_text()) == 1 + 3


def test_fp16_profile_says_why_it_has_no_bf16_probe(tmp_path: Path) -> None:
    path = tmp_path / "sleepy.py"
    path.write_text(SLEEPY)
    record = profile(path, batch_size=2, steps=1, warmup=0, device="cpu", precision="fp16")
    assert record.time.bf16_over_fp32 is None
    assert "fp16" in record.environment.unavailable["time.bf16_over_fp32"]


SLEEPY_STACK = """
import time

import torch
from torch import nn

BLOCK_S = {"fp32": 0.04, "bf16": 0.01}  # each of 3 blocks: bf16 4x faster
HEAD_S = 0.06  # the head: no faster in bf16


def _dtype():
    return "bf16" if torch.is_autocast_enabled("cpu") else "fp32"


class Block(nn.Module):
    # elementwise, no matmul: a CPU's first bf16 matmul of a shape can take milliseconds
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        time.sleep(BLOCK_S[_dtype()])
        return x * self.scale


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Parameter(torch.ones(4))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        time.sleep(HEAD_S)
        return (x * self.head).sum(-1)


def build_model():
    return Stack()


def build_batch(batch_size):
    return torch.randn(batch_size, 4)


def loss_fn(model, batch):
    return model(batch).float().pow(2).mean()
"""
"""Known shares of the forward in the block stack: fp32 0.12 of 0.18 s (2/3), bf16 0.03 of 0.09 s
(1/3). Every block has as many parameters as the head, so parameter counts say 3/4 at both."""


@pytest.mark.parametrize("checkpointing", [False, True])
def test_profile_measures_the_block_stacks_share_of_the_forward_at_both_precisions(
    checkpointing: bool, tmp_path: Path
) -> None:
    # the blocks' sleeps over the whole forward's, at the profile's fp32 and at its bf16
    # counterpart's; with every block checkpointed the recompute in backward is not counted
    path = tmp_path / "sleepy_stack.py"
    path.write_text(SLEEPY_STACK)
    record = profile(path, batch_size=2, steps=3, warmup=1, device="cpu",
                     checkpointing=checkpointing)  # fmt: skip
    shares = record.time.block_forward_share
    assert shares["fp32"] == pytest.approx(2 / 3, abs=0.08)
    assert shares["bf16"] == pytest.approx(1 / 3, abs=0.08)


def test_a_model_without_a_block_stack_has_no_block_share(tmp_path: Path) -> None:
    path = tmp_path / "sleepy.py"
    path.write_text(SLEEPY)
    record = profile(path, batch_size=2, steps=1, warmup=1, device="cpu")
    assert record.time.block_forward_share == {}


def test_a_checkpointed_bf16_step_predicted_from_an_fp32_profile_is_the_one_measured(
    tmp_path: Path,
) -> None:
    # the independent measure: a profile of the plan itself (bf16, every block checkpointed,
    # its recompute sleeping again in backward): 0.09 s of forward and 0.03 s of recompute. By
    # parameter counts the blocks would be 3/4 of the forward, their recompute 0.068 s
    path = tmp_path / "sleepy_stack.py"
    path.write_text(SLEEPY_STACK)
    fp32 = profile(path, batch_size=2, steps=3, warmup=1, device="cpu")
    facts = facts_from_profile(fp32)
    measured = profile(path, batch_size=2, steps=3, warmup=1, device="cpu", precision="bf16",
                       checkpointing=True)  # fmt: skip
    plan = Plan(micro_batch=2, precision="amp_bf16", checkpoint_blocks=facts.num_layers)
    predicted = estimate_plan(facts, plan).predicted_step_seconds
    assert predicted == pytest.approx(measured.time.step, rel=0.12)
