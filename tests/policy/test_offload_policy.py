"""Offload last: a 13B model on 8 x 24 GiB fits nothing without offload, ZeRO-3 included, so
suggest ends with the optimizer on the host, naming the host RAM it needs and the transfer it
costs; estimate --all-plans lists the offload plans with their host memory."""

from __future__ import annotations

import json
from pathlib import Path

from _profiles import synthetic_profile
from typer.testing import CliRunner

from autotune.cli import app
from autotune.policy import suggest
from autotune.records import Machine

GiB = 2**30
PSI = 13_000_000_000
runner = CliRunner()


def _profile():  # noqa: ANN202 - a ProfileRecord
    return synthetic_profile(parameters=PSI, layers=40, batch_size=1,
                             activations_per_sample=2 * GiB)  # fmt: skip


def test_offload_comes_last_with_its_host_ram_and_transfer() -> None:
    machine = Machine(device_memory=24 * GiB, nproc_per_node=8, host_memory=512 * GiB,
                      pcie_gbps=200.0)  # fmt: skip
    record = suggest(_profile(), machine=machine, global_batch=64)
    rules = [item.rule for item in record.suggestions]
    assert "offload_optimizer" in rules
    offload = rules.index("offload_optimizer")
    # everything without offload came first, ZeRO-3 among it, and did not fit
    assert "zero_3" in rules[:offload]
    assert all(item.predicted.fits_after is False for item in record.suggestions[:offload])
    item = record.suggestions[offload]
    assert item.plan.zero_stage == 3 and item.predicted.fits_after is True
    # host side, computed here: 8 ranks x (fp32 master 4 + Adam 8 + fp32 gradients 4 + the
    # reduced bf16 gradients 2) x psi / 8
    assert item.predicted.host_bytes_after == 18 * PSI
    assert item.predicted.host_fits_after is True
    # traffic: bf16 gradients down for each of 8 micro-batches and the weights back, psi / 8 a rank
    moved = (2 * 8 + 2) * PSI / 8
    assert item.predicted.offload_bytes_per_step == round(moved)
    assert abs(item.predicted.offload_seconds - moved * 8 / 200e9) < 1e-9
    assert item.predicted.host_optimizer_seconds is None  # this profile probed no host rate


def test_offload_states_the_host_adam_step_from_the_probed_rate() -> None:
    """8 ranks of a node each step psi / 8 fp32 elements on one CPU at the probed 2e9 a second."""
    profile = _profile()
    profile = profile.model_copy(update={"environment": profile.environment.model_copy(
        update={"host_adam_per_s": 2e9})})  # fmt: skip
    machine = Machine(device_memory=24 * GiB, nproc_per_node=8, host_memory=512 * GiB)
    record = suggest(profile, machine=machine, global_batch=64)
    item = next(i for i in record.suggestions if i.rule == "offload_optimizer")
    assert item.predicted.host_optimizer_seconds == PSI / 8 * 8 / 2e9


def test_without_host_room_the_offload_plan_does_not_fit(tmp_path: Path) -> None:
    machine = Machine(device_memory=24 * GiB, nproc_per_node=8, host_memory=64 * GiB)
    record = suggest(_profile(), machine=machine, global_batch=64)
    offloaded = [i for i in record.suggestions if i.rule == "offload_optimizer"]
    assert offloaded and offloaded[0].predicted.host_fits_after is False
    assert offloaded[0].predicted.fits_after is False


def test_suggest_prints_the_host_ram_and_the_transfer(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(_profile().model_dump_json())
    shown = runner.invoke(app, ["suggest", str(path), "--device-memory", "24GiB", "--nproc-per-node",
                                "8", "--global-batch", "64", "--host-memory", "512GiB"],
                          env={"COLUMNS": "200"})  # fmt: skip
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert f"host RAM {18 * PSI / GiB:.2f} GiB per node, fits" in text
    assert "time not included: give --pcie-gbps" in text
    assert "the optimizer steps on the host's CPU (time not predicted" in text


def test_all_plans_lists_the_offload_plans_with_their_host_memory(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(_profile().model_dump_json())
    args = ["estimate", "--profile", str(path), "--all-plans", "--nproc-per-node", "8",
            "--device-memory", "24GiB", "--host-memory", "512GiB"]  # fmt: skip
    record = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    offloaded = [e for e in record["plans"] if e["plan"]["offload_optimizer"] != "none"]
    assert offloaded and all(e["host_bytes_per_node"] > 0 for e in offloaded)
    assert {e["plan"]["offload_param"] for e in offloaded} == {"none", "cpu"}
    shown = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert "host/node" in shown.stdout
