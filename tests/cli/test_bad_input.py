"""Every command refuses bad input the same way: exactly one line on stderr, starting
``autotune:`` and naming the flag, file or field; exit status 2; nothing on stdout;
no file created or changed. One row per case.

Rows run in a folder holding the inputs they need (``_inputs``); the folder's
contents (names, bytes, times) are compared before and after each row. ``/sys`` is the
read-only folder: read-only even for root, which a chmod'ed folder is not.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from _models import mlp_stack
from _profiles import hand_profile
from typer.testing import CliRunner

from autotune.cli import app
from autotune.records import Recommendation, parse_plan

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"

ZERO_RULE = """
[[rule]]
id = "{id}"
order = 77
all = [["world_size", ">", 1]]
action = "zero"
reason = "because"
"""


def _inputs(folder: Path) -> None:
    """The files the rows refer to, good and bad."""
    (folder / "model.py").write_text(mlp_stack(blocks=2, width=8, hidden=8))
    (folder / "syntax.py").write_text("import torch\n\ndef build_model(:\n")
    (folder / "nobuild.py").write_text("def build_batch(batch_size):\n    return None\n")
    (folder / "boom.py").write_text("import torch\nraise RuntimeError('no GPU here')\n")
    (folder / "adir").mkdir()
    profile = json.loads(hand_profile().model_dump_json())
    (folder / "profile.json").write_text(json.dumps(profile))
    (folder / "future.json").write_text(json.dumps({**profile, "schema_version": 99}))
    (folder / "old.json").write_text(json.dumps({**profile, "schema_version": 0}))
    (folder / "badfield.json").write_text(
        json.dumps({**profile, "memory": {**profile["memory"], "peak": "lots"}})
    )
    (folder / "notjson.json").write_text("{not json")
    rec = json.loads(
        Recommendation(source="plan", plan=parse_plan("stage=2,mb=2")).model_dump_json()
    )
    (folder / "rec.json").write_text(json.dumps(rec))
    (folder / "rec_future.json").write_text(json.dumps({**rec, "schema_version": 7}))
    (folder / "tune_future.json").write_text(
        json.dumps({"schema_version": 5, "recommendation": rec})
    )
    (folder / "base_list.json").write_text("[1, 2]")
    _study_of_another_model(folder / "other_model.db")
    (folder / "base_conflict.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    (folder / "base_unknown.json").write_text(json.dumps({"train_batch_sise": 8}))
    (folder / "bad.toml").write_text("[[rule]\nid = ")
    (folder / "conflict.toml").write_text(ZERO_RULE.format(id="a") + ZERO_RULE.format(id="b"))
    (folder / "unknown_action.toml").write_text(
        '[[rule]]\nid = "x"\norder = 1\nall = [["world_size", ">", 1]]\naction = "fly"\nreason = "r"\n'
    )
    llama = json.loads((CONFIGS / "llama2_7b.json").read_text())
    heads = {**llama, "num_attention_heads": 7, "num_key_value_heads": 7}
    (folder / "hf_heads.json").write_text(json.dumps(heads))
    (folder / "hf_notype.json").write_text(json.dumps({"hidden_size": 8}))
    (folder / "existing.json").write_text('{"keep": "me"}\n')


# fmt: off
ROWS: list[tuple[str, tuple[str, ...], str]] = [
    # autotune itself
    ("no-such-command", ("fly",), "No such command 'fly'"),
    ("unknown-option", ("profile", "model.py", "-b", "1", "--bogus"), "--bogus: no such option"),
    # profile: flags are checked before torch is imported or the model built
    ("profile-missing-model", ("profile", "missing.py", "-b", "1"), "missing.py: no such model file"),
    ("profile-directory", ("profile", "adir", "-b", "1"), "adir: is a directory, not a model file"),
    ("profile-no-model", ("profile", "-b", "2"), "MODEL: give a model file"),
    ("profile-no-batch", ("profile", "model.py"), "--batch-size: required"),
    ("profile-batch-0", ("profile", "model.py", "--batch-size", "0"), "--batch-size: must be >= 1 (got 0)"),
    ("profile-batch-neg", ("profile", "model.py", "-b", "-3"), "--batch-size: must be >= 1 (got -3)"),
    ("profile-batch-text", ("profile", "model.py", "-b", "many"), "--batch-size: must be an integer (got 'many')"),
    ("profile-steps-0", ("profile", "model.py", "-b", "1", "--steps", "0"), "--steps: must be >= 1 (got 0)"),
    ("profile-warmup-neg", ("profile", "model.py", "-b", "1", "--warmup", "-1"), "--warmup: must be >= 0 (got -1)"),
    ("profile-autocast", ("profile", "model.py", "-b", "1", "--autocast", "fp8"), "--autocast: 'fp8' is not one of"),
    ("profile-precision-renamed", ("profile", "model.py", "-b", "1", "--precision", "bf16"), "--precision: renamed to --autocast"),
    ("profile-checkpointing", ("profile", "model.py", "-b", "1", "--checkpointing", "maybe"), "--checkpointing:"),
    ("profile-device-name", ("profile", "model.py", "-b", "1", "--device", "tpu"), "--device: must be auto, cpu, cuda"),
    ("profile-out-dir-missing", ("profile", "model.py", "-b", "1", "--out", "nodir/p.json"), "--out nodir/p.json: directory nodir does not exist"),
    ("profile-out-directory", ("profile", "model.py", "-b", "1", "--out", "adir"), "--out adir: is a directory"),
    ("profile-out-read-only", ("profile", "model.py", "-b", "1", "--out", "/sys/p.json"), "cannot write in /sys"),
    ("profile-bad-before-existing", ("profile", "model.py", "-b", "0", "--out", "existing.json"), "--batch-size"),
    ("profile-syntax-error", ("profile", "syntax.py", "-b", "1"), "syntax.py:3: syntax error"),
    ("profile-no-build-model", ("profile", "nobuild.py", "-b", "1"), "nobuild.py: no build_model()"),
    ("profile-import-raises", ("profile", "boom.py", "-b", "1"), "boom.py:2: import failed: RuntimeError: no GPU here"),
    # estimate
    ("estimate-nothing", ("estimate",), "--batch-size: required (or give --profile)"),
    ("estimate-no-batch", ("estimate", "model.py"), "--batch-size: required"),
    ("estimate-batch-0", ("estimate", "model.py", "-b", "0"), "--batch-size: must be >= 1 (got 0)"),
    ("estimate-margin-high", ("estimate", "model.py", "-b", "1", "--margin", "1.5"), "--margin: must be <= 0.9 (got 1.5)"),
    ("estimate-margin-neg", ("estimate", "model.py", "-b", "1", "--margin", "-0.1"), "--margin: must be >= 0"),
    ("estimate-nproc-0", ("estimate", "model.py", "-b", "1", "--nproc-per-node", "0"), "--nproc-per-node: must be >= 1 (got 0)"),
    ("estimate-nnodes-0", ("estimate", "model.py", "-b", "1", "--nproc-per-node", "2", "--nnodes", "0"), "--nnodes: must be >= 1 (got 0)"),
    ("estimate-world-size-renamed", ("estimate", "model.py", "-b", "1", "--world-size", "2"), "--world-size: renamed; give --nproc-per-node N"),
    ("estimate-nodes-renamed", ("estimate", "model.py", "-b", "1", "--nodes", "2"), "--nodes: renamed to --nnodes"),
    ("estimate-plan-stage", ("estimate", "model.py", "-b", "1", "--plan", "stage=9"), "--plan"),
    ("estimate-plan-knob", ("estimate", "model.py", "-b", "1", "--plan", "speed=11"), "--plan"),
    ("estimate-plan-and-grid", ("estimate", "model.py", "-b", "1", "--plan", "mb=2", "--all-plans"), "--plan and --all-plans"),
    ("estimate-device-memory", ("estimate", "model.py", "-b", "1", "--device-memory", "lots"), "--device-memory"),
    ("estimate-train-tokens", ("estimate", "model.py", "-b", "1", "--train-tokens", "many"), "--train-tokens"),
    ("estimate-mfu-high", ("estimate", "model.py", "-b", "1", "--mfu", "1.5"), "--mfu: must be <= 1.0 (got 1.5)"),
    ("estimate-mfu-0", ("estimate", "model.py", "-b", "1", "--mfu", "0"), "--mfu: must be > 0 (got 0)"),
    ("estimate-intra-0", ("estimate", "model.py", "-b", "1", "--intra-gbps", "0"), "--intra-gbps: must be > 0 (got 0)"),
    ("estimate-check-memory", ("estimate", "model.py", "-b", "1", "--check", "stage=3"), "--check 'stage=3': needs memory=SIZE"),
    ("estimate-autocast", ("estimate", "model.py", "-b", "1", "--autocast", "fp8"), "--autocast"),
    ("estimate-precision-renamed", ("estimate", "model.py", "-b", "1", "--precision", "bf16"), "--precision: renamed to --autocast"),
    ("estimate-seq-len-alone", ("estimate", "model.py", "-b", "1", "--seq-len", "8"), "--seq-len: only with --hf-config"),
    ("estimate-model-and-hf", ("estimate", "model.py", "-b", "1", "--hf-config", "hf_heads.json"), "MODEL and --hf-config: give one of them"),
    ("estimate-hf-no-seq", ("estimate", "--hf-config", "hf_heads.json", "-b", "1"), "--hf-config needs --seq-len"),
    ("estimate-hf-missing", ("estimate", "--hf-config", "nope.json", "--seq-len", "8", "-b", "1"), "--hf-config nope.json: no such file"),
    ("estimate-hf-not-json", ("estimate", "--hf-config", "notjson.json", "--seq-len", "8", "-b", "1"), "--hf-config notjson.json: cannot read JSON"),
    ("estimate-hf-no-type", ("estimate", "--hf-config", "hf_notype.json", "--seq-len", "8", "-b", "1"), "--hf-config hf_notype.json: no model_type"),
    ("estimate-hf-heads", ("estimate", "--hf-config", "hf_heads.json", "--seq-len", "8", "-b", "1"), "--hf-config hf_heads.json: model_type 'llama': ValueError: The hidden size (4096) is not a multiple of the number of attention heads (7)"),
    ("estimate-profile-missing", ("estimate", "--profile", "nope.json"), "nope.json: no such profile file"),
    ("estimate-profile-not-json", ("estimate", "--profile", "notjson.json"), "notjson.json: not valid JSON"),
    ("estimate-profile-future", ("estimate", "--profile", "future.json"), "future.json: profile has schema_version 99, newer than the 1"),
    # suggest
    ("suggest-default-missing", ("suggest",), "autotune-profile.json: no such profile file"),
    ("suggest-future", ("suggest", "future.json"), "future.json: profile has schema_version 99, newer than the 1 this autotune reads"),
    ("suggest-old", ("suggest", "old.json"), "old.json: profile has schema_version 0, older than the 1"),
    ("suggest-bad-field", ("suggest", "badfield.json"), "badfield.json: not a valid profile: field memory.peak"),
    ("suggest-not-json", ("suggest", "notjson.json"), "notjson.json: not valid JSON (line 1"),
    ("suggest-directory", ("suggest", "adir"), "adir: cannot read profile"),
    ("suggest-device-memory", ("suggest", "profile.json", "--device-memory", "12XB"), "--device-memory"),
    ("suggest-nproc-0", ("suggest", "profile.json", "--nproc-per-node", "0"), "--nproc-per-node: must be >= 1 (got 0)"),
    ("suggest-nnodes-0", ("suggest", "profile.json", "--nnodes", "0"), "--nnodes: must be >= 1 (got 0)"),
    ("suggest-world-size-renamed", ("suggest", "profile.json", "--world-size", "3"), "--world-size: renamed; give --nproc-per-node N"),
    ("suggest-gpus-per-node-renamed", ("suggest", "profile.json", "--gpus-per-node", "2"), "--gpus-per-node: renamed to --nproc-per-node"),
    ("suggest-inter-0", ("suggest", "profile.json", "--inter-gbps", "0"), "--inter-gbps: must be > 0 (got 0)"),
    ("suggest-link-record", ("suggest", "profile.json", "--link", "rec.json"), "--link: rec.json: neither a tune record (autotune-tune.json) nor a link record"),
    ("suggest-link-missing", ("suggest", "profile.json", "--link", "nope.json"), "nope.json: no such --link file"),
    ("suggest-global-batch-0", ("suggest", "profile.json", "--global-batch", "0"), "--global-batch: must be >= 1 (got 0)"),
    ("suggest-policy-missing", ("suggest", "profile.json", "--policy", "nope.toml"), "nope.toml"),
    ("suggest-policy-syntax", ("suggest", "profile.json", "--policy", "bad.toml"), "bad.toml"),
    ("suggest-policy-conflict", ("suggest", "profile.json", "--policy", "conflict.toml"), "conflict.toml: rule 'b': field action: sets precision and zero_stage at order 77, as rule 'a' does"),
    ("suggest-policy-action", ("suggest", "profile.json", "--policy", "unknown_action.toml"), "unknown_action.toml: rule 'x'"),
    # confirm
    ("confirm-repeats-0", ("confirm", "model.py", "-b", "4", "--profile", "profile.json", "--repeats", "0"), "--repeats: must be >= 1 (got 0)"),
    ("confirm-steps-0", ("confirm", "model.py", "-b", "4", "--profile", "profile.json", "--steps", "0"), "--steps: must be >= 1 (got 0)"),
    ("confirm-warmup-neg", ("confirm", "model.py", "-b", "4", "--profile", "profile.json", "--warmup", "-1"), "--warmup: must be >= 0 (got -1)"),
    ("confirm-batch-0", ("confirm", "model.py", "-b", "0"), "--batch-size: must be >= 1 (got 0)"),
    ("confirm-max-changes-0", ("confirm", "model.py", "-b", "4", "--profile", "profile.json", "--max-changes", "0"), "--max-changes: must be >= 1 (got 0)"),
    ("confirm-loss-tolerance", ("confirm", "model.py", "-b", "4", "--profile", "profile.json", "--loss-tolerance", "2"), "loss_tolerance (--loss-tolerance): must be between 0 and 1 (got 2.0)"),
    ("confirm-global-batch-0", ("confirm", "model.py", "-b", "4", "--profile", "profile.json", "--global-batch", "0"), "--global-batch: must be >= 1 (got 0)"),
    ("confirm-device-name", ("confirm", "model.py", "-b", "4", "--profile", "profile.json", "--device", "gpu0"), "--device: must be auto, cpu, cuda or cuda:N (got 'gpu0')"),
    ("confirm-output-directory", ("confirm", "model.py", "-b", "4", "--profile", "profile.json", "-o", "adir"), "--output adir: is a directory"),
    ("confirm-output-dir-missing", ("confirm", "model.py", "-b", "4", "--profile", "profile.json", "-o", "nodir/c.json"), "--output nodir/c.json: directory nodir does not exist"),
    ("confirm-profile-future", ("confirm", "model.py", "-b", "4", "--profile", "future.json"), "future.json: profile has schema_version 99"),
    ("confirm-missing-model", ("confirm", "missing.py", "-b", "4", "--profile", "profile.json"), "missing.py: no such model file"),
    ("confirm-batch-mismatch", ("confirm", "model.py", "-b", "2", "--profile", "profile.json"), "--batch-size 2 differs from the profile's batch size 4"),
    # tune: flags, storage and --baseline before any measurement
    ("tune-no-global-batch", ("tune", "model.py"), "--global-batch: required"),
    ("tune-trials-0", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--trials", "0"), "--trials: must be >= 1 (got 0)"),
    ("tune-budget-neg", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--budget-minutes", "-1"), "--budget-minutes: must be > 0 (got -1)"),
    ("tune-budget-0", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--budget-minutes", "0"), "--budget-minutes: must be > 0 (got 0)"),
    ("tune-repeats-negative", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--repeats", "-1"), "--repeats: must be >= 0 (got -1)"),
    ("tune-margin-high", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--margin", "1.5"), "--margin: must be <= 0.9 (got 1.5)"),
    ("tune-trial-timeout-0", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--trial-timeout-s", "0"), "--trial-timeout-s: must be > 0 (got 0)"),
    ("tune-trial-timeout-old-name", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--trial-timeout", "0"), "--trial-timeout-s: must be > 0 (got 0)"),
    ("tune-global-batch-0", ("tune", "model.py", "--global-batch", "0"), "--global-batch: must be >= 1 (got 0)"),
    ("tune-nproc-0", ("tune", "model.py", "--global-batch", "4", "--nproc-per-node", "0"), "--nproc-per-node: must be >= 1 (got 0)"),
    ("tune-does-not-split", ("tune", "model.py", "--global-batch", "3", "--nproc-per-node", "2", "--profile", "profile.json"), "global_batch (--global-batch) 3 does not split over nproc_per_node (--nproc-per-node) 2"),
    ("tune-steps-0", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--steps", "0"), "--steps: must be >= 1 (got 0)"),
    ("tune-warmup-neg", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--warmup", "-2"), "--warmup: must be >= 0 (got -2)"),
    ("tune-device-name", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--device", "mps"), "--device: must be auto, cpu, cuda or cuda:N (got 'mps')"),
    ("tune-missing-model", ("tune", "missing.py", "--global-batch", "4"), "missing.py: no such model file"),
    ("tune-directory", ("tune", "adir", "--global-batch", "4"), "adir: is a directory, not a model file"),
    ("tune-out-dir-under-a-file", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--out-dir", "profile.json/sub"), "--out-dir profile.json/sub: profile.json is not a directory"),
    ("tune-out-dir-read-only", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--out-dir", "/sys"), "--out-dir /sys: cannot write in /sys"),
    ("tune-baseline-syntax", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--baseline", "mb=x"), "--baseline"),
    ("tune-baseline-global-batch", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--baseline", "mb=3"), "baseline (--baseline): global batch 3 != global_batch (--global-batch) 4"),
    ("tune-device-memory", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--device-memory", "lots"), "--device-memory"),
    ("tune-profile-future", ("tune", "model.py", "--global-batch", "4", "--profile", "future.json"), "future.json: profile has schema_version 99"),
    ("tune-policy-missing", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--policy", "nope.toml"), "nope.toml"),
    ("tune-policy-conflict", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--policy", "conflict.toml"), "conflict.toml: rule 'b': field action: sets precision and zero_stage"),
    ("tune-storage-dir-missing", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--storage", "nodir/t.db"), "--storage sqlite:///"),
    ("tune-storage-read-only", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--storage", "sqlite:////sys/t.db"), "--storage sqlite:////sys/t.db: cannot open the study: OperationalError: unable to open database file"),
    ("tune-storage-dialect", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--storage", "nosuchdb://x/y"), "--storage nosuchdb://x/y: cannot open the study"),
    ("tune-storage-postgres-driver", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--storage", "postgresql://me:secret@localhost/db"), "--storage postgresql://me:***@localhost/db: the PostgreSQL driver (psycopg) is not installed: pip install 'autotune-advisor[postgres]'"),
    ("tune-storage-psycopg2", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--storage", "postgresql+psycopg2://me@localhost/db"), "the PostgreSQL driver 'psycopg2' is not installed"),
    ("tune-study-of-another-model", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--storage", "other_model.db"), "--study model-g4-n1: its trials measured something else (the model file's content 000000000000 -> "),
    ("tune-storage-password-kept-out", ("tune", "model.py", "--global-batch", "4", "--device", "cpu", "--profile", "profile.json", "--storage", "postgresql+psycopg2://me:pw-s3cret@localhost/db"), "--storage postgresql+psycopg2://me:***@localhost/db: the PostgreSQL driver 'psycopg2' is not installed"),
    # the order of checks: a model that raises on import is never reached
    ("tune-storage-before-profiling", ("tune", "boom.py", "--global-batch", "4", "--storage", "nodir/t.db"), "--storage sqlite:///"),
    ("tune-baseline-before-profiling", ("tune", "boom.py", "--global-batch", "4", "--baseline", "mb=3"), "baseline (--baseline): global batch 3 != global_batch (--global-batch) 4"),
    ("tune-policy-before-profiling", ("tune", "boom.py", "--global-batch", "4", "--policy", "conflict.toml"), "conflict.toml: rule 'b'"),
    ("tune-out-dir-before-profiling", ("tune", "boom.py", "--global-batch", "4", "--out-dir", "profile.json/x"), "--out-dir profile.json/x: profile.json is not a directory"),
    ("profile-out-before-model", ("profile", "boom.py", "-b", "1", "--out", "adir"), "--out adir: is a directory"),
    ("confirm-output-before-model", ("confirm", "boom.py", "-b", "1", "-o", "adir"), "--output adir: is a directory"),
    ("report-out-before-inputs", ("report", "future.json", "--out", "adir"), "--out adir: is a directory"),
    # config
    ("config-nothing", ("config",), "give a RECOMMENDATION.json or --plan KNOBS (exactly one)"),
    ("config-both", ("config", "rec.json", "--plan", "mb=2"), "give a RECOMMENDATION.json or --plan KNOBS"),
    ("config-plan-stage", ("config", "--plan", "stage=9"), "--plan"),
    ("config-nproc-0", ("config", "--plan", "mb=2", "--nproc-per-node", "0"), "--nproc-per-node: must be >= 1 (got 0)"),
    ("config-world-size-renamed", ("config", "--plan", "mb=2", "--world-size", "4"), "--world-size: renamed; give --nproc-per-node N"),
    ("config-framework", ("config", "--plan", "mb=2", "--framework", "jax"), "--framework: 'jax' is not one of"),
    ("config-missing", ("config", "nope.json"), "nope.json: no such recommendation file"),
    ("config-future-rec", ("config", "rec_future.json"), "rec_future.json: recommendation has schema_version 7, newer than the 1"),
    ("config-future-tune", ("config", "tune_future.json"), "tune_future.json: tune record has schema_version 5, newer than the 1"),
    ("config-base-missing", ("config", "--plan", "mb=2", "--base", "nope.json"), "nope.json: no such DeepSpeed config file"),
    ("config-base-list", ("config", "--plan", "mb=2", "--base", "base_list.json"), "base_list.json: a DeepSpeed config must be a JSON object"),
    ("config-base-conflict", ("config", "--plan", "stage=2,mb=2", "--base", "base_conflict.json"), "--base base_conflict.json: zero_optimization.stage"),
    ("config-base-unknown", ("config", "--plan", "mb=2", "--base", "base_unknown.json"), "--base base_unknown.json: unknown top-level key 'train_batch_sise'"),
    ("config-out-directory", ("config", "--plan", "mb=2", "--out", "adir"), "--out adir: is a directory"),
    ("config-out-dir-missing", ("config", "--plan", "mb=2", "--out", "nodir/ds.json"), "--out nodir/ds.json: directory nodir does not exist"),
    ("config-out-read-only", ("config", "--plan", "mb=2", "--out", "/sys/ds.json"), "--out /sys/ds.json: cannot write in /sys"),
    ("config-profile-future", ("config", "--plan", "mb=2", "--profile", "future.json"), "future.json: profile has schema_version 99"),
    # report
    ("report-no-out", ("report", "profile.json"), "--out: required"),
    ("report-out-directory", ("report", "profile.json", "--out", "adir"), "--out adir: is a directory"),
    ("report-out-dir-missing", ("report", "profile.json", "--out", "nodir/r.html"), "--out nodir/r.html: directory nodir does not exist"),
    ("report-out-read-only", ("report", "profile.json", "--out", "/sys/r.html"), "--out /sys/r.html: cannot write in /sys"),
    ("report-missing", ("report", "nope.json", "--out", "r.html"), "nope.json: no such profile file"),
    ("report-future", ("report", "future.json", "--out", "r.html"), "future.json: profile has schema_version 99"),
    ("report-study-alone", ("report", "--study", "s", "--out", "r.html"), "--study and --storage go together"),
    ("report-storage-missing", ("report", "--study", "s", "--storage", "nope.db", "--out", "r.html"), "--storage: no such file nope.db"),
    ("report-device-memory", ("report", "profile.json", "--device-memory", "lots", "--out", "r.html"), "--device-memory"),
    ("report-recommendation-future", ("report", "--recommendation", "rec_future.json", "--out", "r.html"), "rec_future.json: recommendation has schema_version 7"),
]
# fmt: on


def _study_of_another_model(path: Path) -> None:
    """A study named as ``tune model.py --global-batch 4`` names its own, whose trials
    measured another model file."""
    import optuna

    from autotune.search._identity import IDENTITY_KEY

    study = optuna.create_study(storage=f"sqlite:///{path}", study_name="model-g4-n1")
    study.set_user_attr(IDENTITY_KEY, {"model_sha256": "0" * 64})


def _snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
            for p in sorted(folder.rglob("*"))}  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bad-input")
    _inputs(folder)
    return folder


@pytest.mark.parametrize(("args", "names"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_bad_input_is_one_line_naming_it_exit_2_nothing_written(
    args: tuple[str, ...], names: str, inputs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(inputs)
    monkeypatch.setenv("TMPDIR", str(inputs / "adir"))  # a stray trial folder would show
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as on a machine without the extra
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    before = _snapshot(inputs)
    result = CliRunner().invoke(app, list(args))
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    assert len(lines) == 1 and lines[0].startswith("autotune: "), result.stderr
    assert names in lines[0], lines[0]
    assert result.stdout == ""
    assert _snapshot(inputs) == before, "a file was created or changed"
    assert "TMPDIR" in os.environ


def test_the_matrix_has_every_case_once() -> None:
    ids = [row[0] for row in ROWS]
    assert len(ids) == len(set(ids)) and len(ids) >= 70
    commands = {row[1][0] for row in ROWS}
    assert {"profile", "estimate", "suggest", "confirm", "tune", "config", "report"} <= commands
