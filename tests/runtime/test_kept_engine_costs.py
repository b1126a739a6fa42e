"""Where a machine keeps its engines' costs: one file per group it can stand for, none for a
group over several machines, read for a link of the same order of bandwidth only. (That a sweep
writes the file and a later one reads it instead of measuring: ``tests/search/
test_trial_runner.py``'s two-rank trial.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autotune.estimator import link_measure
from autotune.records import EngineCost, LinkMeasure, LinkPoint
from autotune.runtime.trial.engine_cost import _read_kept, kept_file


def _link(
    world: int = 2, gbps: float = 8.0, backend: str = "gloo", latency: float = 1e-4
) -> LinkMeasure:
    rate = gbps * 1e9 / 8
    points = [LinkPoint(collective=c, nbytes=size, seconds=latency + size / rate,
                        low=latency + size / rate, high=latency + size / rate, repeats=1)
              for c in ("all_reduce", "all_gather", "reduce_scatter")
              for size in (2**16, 2**22)]  # fmt: skip
    return link_measure(points, world, backend)


@pytest.fixture
def one_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """torchrun's view of a 2-rank group on one machine, with its own cache folder."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _cost(engine: str) -> EngineCost:
    return EngineCost(engine=engine, micro_fixed_s=1e-3, micro_per_tensor_s=1e-5,
                      step_fixed_s=2e-3, step_per_tensor_s=2e-5, blocks=[4, 16],
                      per_block=[1, 1], width=[8, 8], steps=4)  # fmt: skip


def test_a_group_like_this_one_reads_the_same_file(one_machine: Path) -> None:
    link = _link()
    path = kept_file(link)
    assert path is not None and path.parent == one_machine / "engine-costs"
    cost = _cost("deepspeed-3-fp32")
    path.parent.mkdir()
    path.write_text(json.dumps({"gbps": link.gbps, "engine_costs": [cost.model_dump()]}))
    # another sweep of the same loopback: its latency and bandwidth moved a little
    again = _link(gbps=8 * 1.3, latency=3e-4)
    assert kept_file(again) == path and _read_kept(path, again) == {cost.engine: cost}
    # the same ranks on the loopback shaped to 1 Gbit/s: measured anew
    shaped = _link(gbps=1.0)
    assert kept_file(shaped) == path and _read_kept(path, shaped) == {}


def test_what_the_costs_depend_on_names_another_file(
    one_machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = kept_file(_link())
    assert kept_file(_link(backend="mpi")) != path
    assert kept_file(_link(), width=1024) != path  # a smaller model's wide stack
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert kept_file(_link()) != path  # ranks with more threads
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert kept_file(_link(world=4)) not in (path, None)


def test_a_group_over_several_machines_keeps_nothing(
    one_machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # two nodes of a rank each
    assert kept_file(_link()) is None
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # not launched by torchrun: unknown
    assert kept_file(_link()) is None


def test_an_unreadable_file_is_measured_anew(one_machine: Path) -> None:
    path, link = one_machine / "kept.json", _link()
    assert _read_kept(path, link) == {}  # missing
    no_link = {"engine_costs": [_cost("deepspeed-0-fp32").model_dump()]}
    not_costs = {"gbps": link.gbps, "engine_costs": [{"engine": "x"}]}
    for text in ("{", "[]", json.dumps(not_costs), json.dumps(no_link)):
        path.write_text(text)
        assert _read_kept(path, link) == {}
