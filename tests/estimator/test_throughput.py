"""The throughput claim check against FLOPs per token worked out by hand from LLaMA-7B's config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.estimator import ActivationSpec, Claim, ModelFacts, table_peak_flops
from autotune.estimator._claims import check_claim
from autotune.records import AutotuneError, Plan

CONFIG = json.loads(
    (Path(__file__).resolve().parents[2] / "examples" / "configs" / "llama2_7b.json").read_text()
)
H, FF, L = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["num_hidden_layers"]
V, S = CONFIG["vocab_size"], 4096
BLOCK = 4 * H * H + 3 * H * FF + 2 * H  # q, k, v, o (32 kv heads); gate, up, down; two RMSNorms
EMBEDDING = V * H
PSI = 2 * V * H + L * BLOCK + H  # input embedding, untied head, blocks, final norm
MODEL_FLOPS = 6 * (PSI - EMBEDDING) + 12 * L * H * S  # METHOD.md section 4
RECOMPUTED = MODEL_FLOPS + L * (2 * BLOCK + 4 * H * S)  # one more forward of every block


def llama_7b() -> ModelFacts:
    return ModelFacts(
        name="LlamaForCausalLM",
        parameters=PSI,
        trainable_parameters=PSI,
        embedding_parameters=EMBEDDING,
        num_layers=L,
        block_parameters=BLOCK,
        hidden_size=H,
        seq_len=S,
        activations={"bf16": ActivationSpec(fixed=0, per_sample=1, source="traced")},
    )


def test_hand_counts_match_the_published_size() -> None:
    assert PSI == 6_738_415_616
    assert 4.55e10 < MODEL_FLOPS < 4.65e10  # METHOD.md section 6: about 4.6e10


def test_seed_row_without_recompute_states_twice_the_tflops_its_tokens_allow() -> None:
    claim = Claim(Plan(precision="amp_bf16", micro_batch=2), text="row 1", tokens_per_s=1240,
                  tflops=112.5, device="A100")  # fmt: skip
    check = check_claim(llama_7b(), claim)
    tp = check.throughput
    assert tp is not None and check.memory is None
    assert tp.model_flops_per_token == MODEL_FLOPS
    assert tp.implied_model_tflops == pytest.approx(1240 * MODEL_FLOPS / 1e12)
    assert 57 < tp.implied_model_tflops < 58
    assert tp.peak_tflops == 312 and tp.peak_dtype == "bf16"
    assert tp.implied_mfu == pytest.approx(1240 * MODEL_FLOPS / 312e12)
    assert tp.consistent is False and tp.under_peak is True and check.possible is False
    ratio = f"{112.5 / (1240 * MODEL_FLOPS / 1e12):.2f}x"
    assert ratio == "1.97x" and ratio in check.explanation
    assert f"{1240 * MODEL_FLOPS / 1e12:.1f} TFLOPS" in check.explanation


def test_seed_row_with_every_block_recomputed() -> None:
    plan = Plan(precision="amp_bf16", checkpoint_blocks=L)
    check = check_claim(llama_7b(), Claim(plan, tokens_per_s=2150, tflops=185.2, device="A100"))
    tp = check.throughput
    assert tp is not None
    assert tp.hardware_flops_per_token == RECOMPUTED
    assert 1.32 < RECOMPUTED / MODEL_FLOPS < 4 / 3  # about x4/3, less the head
    hardware = 2150 * RECOMPUTED / 1e12
    assert tp.implied_hardware_tflops == pytest.approx(hardware)
    assert 131 < hardware < 133
    assert tp.consistent is False and tp.under_peak is True
    assert f"{185.2 / hardware:.2f}x" in check.explanation  # 1.41x: the stated TFLOPS are 1.4x


@pytest.mark.parametrize(
    ("claim", "consistent", "under_peak"),
    [
        ({"tokens_per_s": 1240, "tflops": 1240 * MODEL_FLOPS / 1e12}, True, True),
        ({"tokens_per_s": 1240, "tflops": 1.1 * 1240 * MODEL_FLOPS / 1e12}, True, True),
        ({"tflops": 400.0}, None, False),
        ({"tokens_per_s": 8000}, None, False),  # 8000 x 4.6e10 = 369 TFLOPS > 312
        ({"tokens_per_s": 1240, "mfu": 1240 * MODEL_FLOPS / 312e12}, True, True),
        ({"tokens_per_s": 1240, "mfu": 0.5}, False, True),
        ({"tokens_per_s": 1240, "mfu": 1.2}, False, False),
    ],
)
def test_verdicts(claim: dict[str, float], consistent: bool | None, under_peak: bool) -> None:
    check = check_claim(llama_7b(), Claim(Plan(), device="A100", peak_dtype="bf16", **claim))
    assert check.throughput is not None
    assert (check.throughput.consistent, check.throughput.under_peak) == (consistent, under_peak)
    assert check.possible is (consistent is not False and under_peak)


def test_peak_follows_the_precision_and_the_table_is_one() -> None:
    check = check_claim(llama_7b(), Claim(Plan(precision="fp32"), tflops=50, device="A100"))
    assert check.throughput is not None and check.throughput.peak_tflops == 19.5
    assert check.throughput.under_peak is False
    assert table_peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert table_peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert table_peak_flops("Tesla V100-SXM2-32GB", "bf16") is None


def test_nothing_stated_or_unknown_device_is_one_line() -> None:
    with pytest.raises(AutotuneError, match="states nothing"):
        check_claim(llama_7b(), Claim(Plan(), text="stage=2"))
    with pytest.raises(AutotuneError, match="B200"):
        check_claim(llama_7b(), Claim(Plan(), tflops=1.0, device="B200"))
    no_seq = llama_7b().model_copy(update={"seq_len": None})
    with pytest.raises(AutotuneError, match="sequence length"):
        check_claim(no_seq, Claim(Plan(), tokens_per_s=10.0))
