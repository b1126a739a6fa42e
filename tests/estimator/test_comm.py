"""The collectives each engine issues per step, their time on a link, and the link fit."""

from __future__ import annotations

import pytest

from autotune.estimator import (
    Calls,
    Link,
    bus_bytes,
    collective_seconds,
    fit_link,
    link_measure,
    plan_link,
    step_calls,
    step_communication,
)
from autotune.estimator._comm import regathered_share
from autotune.records import LinkPoint, Machine, parse_plan

PSI = 1_000_000


def _volume(knobs: str, keep_elements: int = 10**9) -> dict[str, float]:
    plan = parse_plan(knobs)
    volume: dict[str, float] = {}
    # 4 blocks of a fifth of the parameters each: FSDP2's units, the root holding the last fifth
    for c in step_calls(plan, PSI, keep_elements=keep_elements, blocks=4,
                        block_parameters=PSI // 5):  # fmt: skip
        volume[c.collective] = volume.get(c.collective, 0.0) + c.elements / PSI
    return {name: v for name, v in volume.items() if v}


# elements over all calls per step, in units of the parameters (DeepSpeed 0.19, counted in
# tests/runtime/test_shaped_link.py)
@pytest.mark.parametrize(
    ("knobs", "volume"),
    [
        ("stage=0,nproc_per_node=2,ga=2", {"all_reduce": 1}),
        ("stage=1,nproc_per_node=2,ga=2", {"all_reduce": 1, "all_gather": 1}),
        ("stage=2,nproc_per_node=2,ga=2", {"all_reduce": 2, "all_gather": 1}),
        ("stage=3,nproc_per_node=2,ga=2", {"all_gather": 2, "reduce_scatter": 2}),
        # the root's fifth is not gathered again in backward
        ("engine=fsdp2,stage=3,nproc_per_node=2,ga=2", {"all_gather": 3.6, "reduce_scatter": 2}),
        ("engine=fsdp2,stage=2,nproc_per_node=2", {"all_gather": 1, "reduce_scatter": 1}),
        ("stage=3,nproc_per_node=1", {}),
    ],
)
def test_collectives_per_step(knobs: str, volume: dict[str, float]) -> None:
    assert _volume(knobs) == volume


@pytest.mark.parametrize(
    ("blocks", "stage", "all_gathers", "reduce_scatters"),
    # per micro-batch, counted by wrapping torch.distributed in a 2-rank gloo run of a model of an
    # input Linear, `blocks` blocks of two Linears and a head, sharded as autotune's FSDP2 trials
    # shard it (torch 2.13; the same counts for ga=1 and ga=3, three times over)
    [(2, 3, 5, 3), (6, 3, 13, 7), (2, 2, 3, 3), (6, 2, 7, 7)],
)
def test_fsdp2_issues_one_collective_per_unit(
    blocks: int, stage: int, all_gathers: int, reduce_scatters: int
) -> None:
    plan = parse_plan(f"engine=fsdp2,stage={stage},nproc_per_node=2,ga=3")
    calls = step_calls(plan, PSI, blocks=blocks, block_parameters=PSI // (blocks + 1))
    counts = {c: sum(x.count for x in calls if x.collective == c)
              for c in ("all_gather", "reduce_scatter")}  # fmt: skip
    assert counts == {"all_gather": 3 * all_gathers, "reduce_scatter": 3 * reduce_scatters}


def test_zero3_gathers_again_in_backward_what_it_releases() -> None:
    assert _volume("stage=3,nproc_per_node=2", keep_elements=0) == {
        "all_gather": 2,
        "reduce_scatter": 1,
    }
    assert regathered_share(400e6, 10**9) == 0.0
    assert regathered_share(7e9, 10**9) == pytest.approx(1 - 1 / 14)


def test_time_is_latency_per_call_plus_bus_bytes_per_collective() -> None:
    plan = parse_plan("stage=2,nproc_per_node=4")
    calls = step_calls(plan, PSI)
    # all-reduce: 2 (n-1)/n; all-gather (n-1)/n; fp32
    assert bus_bytes(calls, 4, 4) == pytest.approx((1.5 + 0.75) * PSI * 4)
    link = Link(1e-3, 1e9, "x", by_collective={"all_gather": (0.0, 0.5e9)})
    expected = (1e-3 + 1.5 * PSI * 4 / 1e9) + (0.75 * PSI * 4 / 0.5e9)
    assert collective_seconds(calls, 4, 4, link) == pytest.approx(expected)


def _points(latency: float, bandwidth: float, gather_bandwidth: float) -> list[LinkPoint]:
    points = []
    for size in (2**16, 2**20, 2**22):
        for collective, share, bw in (("all_reduce", 1.0, bandwidth),
                                      ("all_gather", 0.5, gather_bandwidth)):  # fmt: skip
            t = latency + size * share / bw
            points.append(LinkPoint(collective=collective, nbytes=size, seconds=t, low=t, high=t,
                                    repeats=1))  # fmt: skip
    return points


def test_the_fit_recovers_latency_and_bus_bandwidth() -> None:
    latency, bandwidth = fit_link(_points(5e-4, 6e7, 6e7), 2)
    assert latency == pytest.approx(5e-4)
    assert bandwidth == pytest.approx(6e7)
    measure = link_measure(_points(5e-4, 6e7, 3e7), 2, "gloo")
    assert measure.collectives["all_gather"].bandwidth_bytes_per_s == pytest.approx(3e7)
    assert measure.gbps == pytest.approx(measure.bandwidth_bytes_per_s * 8e-9)
    with pytest.raises(ValueError, match="two or more sizes"):
        fit_link(_points(5e-4, 6e7, 6e7)[:1], 2)


def test_a_collective_whose_noisy_points_shrink_with_size_is_timed_on_the_whole_fit() -> None:
    # the open loopback in bench/shaped_link.py: a 64 KiB all-gather at 6.4 ms, 4 MiB at 4.2 ms
    points = [p for p in _points(5e-4, 6e7, 6e7) if p.collective == "all_reduce"]
    points += [LinkPoint(collective="all_gather", nbytes=size, seconds=t, low=t, high=t, repeats=1)
               for size, t in ((2**16, 6.4e-3), (2**20, 5.0e-3), (2**22, 4.2e-3))]  # fmt: skip
    with pytest.raises(ValueError, match="do not grow with size"):
        fit_link([p for p in points if p.collective == "all_gather"], 2)
    measure = link_measure(points, 2, "gloo")
    assert set(measure.collectives) == {"all_reduce"}
    assert measure.collectives["all_reduce"].bandwidth_bytes_per_s == pytest.approx(6e7)
    # the all-gather is timed on the fit of every point, which still grows with size
    assert measure.bandwidth_bytes_per_s > 0


def test_a_call_inside_the_swept_sizes_takes_the_measured_time_not_the_fit() -> None:
    # the CI shaped-link job's all-reduce points on a 1 Gbit/s tbf link: 64 KiB passes inside
    # tc's 128 kb burst, faster than the rate; the fit weighs it as much as 4 MiB
    times = {2**16: 0.55e-3, 2**18: 3.97e-3, 2**20: 16.86e-3, 2**22: 66.98e-3}
    points = [LinkPoint(collective="all_reduce", nbytes=n, seconds=t, low=t, high=t, repeats=5)
              for n, t in times.items()]  # fmt: skip
    measure = link_measure(points, 2, "gloo")
    plan = parse_plan("stage=0,nproc_per_node=1,nnodes=2")
    link = plan_link(Machine(link=measure), plan)
    assert link is not None

    def one_call(nbytes: int) -> float:
        return collective_seconds([Calls("all_reduce", nbytes / 4, 1)], 2, 4, link)

    assert one_call(2**22) == pytest.approx(66.98e-3)
    assert one_call(2**21) == pytest.approx(16.86e-3 + (66.98e-3 - 16.86e-3) / 3)
    top = (66.98e-3 - 16.86e-3) / (2**22 - 2**20)  # seconds per byte between the top two
    assert one_call(2**24) == pytest.approx(66.98e-3 + top * (2**24 - 2**22))
    # two calls of half the elements each: the count times each call's time
    assert collective_seconds([Calls("all_reduce", 2**22 / 4, 2)], 2, 4, link) == pytest.approx(
        2 * 16.86e-3 + 2 * (66.98e-3 - 16.86e-3) / 3
    )
    # the fit alone says 0.68 Gbit/s, a quarter under what 4 MiB took
    fitted = Link(measure.latency_s, measure.bandwidth_bytes_per_s, "fit")
    assert collective_seconds([Calls("all_reduce", 2**22 / 4, 1)], 2, 4, fitted) < 0.8 * 66.98e-3
    # below the smallest size: the fit
    latency, bandwidth = link.speed("all_reduce")
    assert one_call(2**12) == pytest.approx(latency + 2**12 / bandwidth)


def test_a_sweep_that_cannot_be_fitted_leaves_the_trial_without_a_link(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autotune.runtime import link

    def unfitted() -> None:
        raise ValueError("collective times do not grow with size (slope -8.7e-12 s/byte)")

    monkeypatch.setattr(link.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(link.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(link, "sweep", unfitted)
    assert link.trial_link() is None
    assert "link sweep not fitted" in capsys.readouterr().err


def test_a_given_speed_overrides_the_measured_link_and_the_note_names_the_source() -> None:
    measure = link_measure(_points(5e-4, 6e7, 6e7), 2, "gloo")
    plan = parse_plan("stage=2,nproc_per_node=1,nnodes=2")
    link = plan_link(Machine(link=measure), plan)
    assert link is not None and link.source.startswith("measured link sweep")
    given = plan_link(Machine(link=measure, inter_gbps=10.0), plan)
    assert given == Link(0.0, 10e9 / 8, "given --inter-gbps")
    _, seconds, note = step_communication(plan, PSI, None, Machine(inter_gbps=10.0))
    assert note is not None and "given --inter-gbps" in note
    assert seconds == pytest.approx(bus_bytes(step_calls(plan, PSI), 2, 4) * 8 / 10e9)
    assert step_communication(plan, PSI, None, Machine())[1] is None
