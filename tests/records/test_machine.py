"""The machine record takes sizes as the docs show them: bytes, or a string with a unit."""

from __future__ import annotations

import pytest

import autotune
from autotune.records import AutotuneError, Machine

GiB, GB = 2**30, 10**9


@pytest.mark.parametrize(
    ("fields", "device_memory", "host_memory"),
    [
        ({"device_memory": "80GiB"}, 80 * GiB, None),
        ({"device_memory": "80GB", "host_memory": "512Gi"}, 80 * GB, 512 * GiB),
        ({"device_memory": 80 * GiB}, 80 * GiB, None),  # bytes, as before
        ({"device_memory": 80e9}, 80 * GB, None),  # a whole float is bytes too
        ({"device_memory": "1.5 GiB"}, 3 * GiB // 2, None),
    ],
)
def test_a_size_is_bytes_or_a_string_with_a_unit(
    fields: dict[str, object], device_memory: int, host_memory: int | None
) -> None:
    machine = autotune.Machine(**fields)  # type: ignore[arg-type]
    assert (machine.device_memory, machine.host_memory) == (device_memory, host_memory)
    assert isinstance(machine.device_memory, int)


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        (
            {"device_memory": 80},
            "device_memory (--device-memory): 80 bytes? give a size with a unit, e.g. '80GiB'",
        ),  # fmt: skip
        (
            {"host_memory": 512},
            "host_memory (--host-memory): 512 bytes? give a size with a unit, e.g. '512GiB'",
        ),  # fmt: skip
        (
            {"device_memory": "80"},
            "device_memory (--device-memory) 80: give a unit, e.g. 80GiB or 80GB",
        ),  # fmt: skip
        ({"device_memory": 0}, "device_memory (--device-memory): must be positive (got 0 B)"),
        (
            {"device_memory": [80]},
            "device_memory (--device-memory): give bytes or a size with a "
            "unit, e.g. '80GiB' (got [80])",
        ),  # fmt: skip
    ],
)
def test_a_size_without_its_unit_is_one_line(fields: dict[str, object], line: str) -> None:
    with pytest.raises(AutotuneError) as caught:
        Machine(**fields)  # type: ignore[arg-type]
    assert str(caught.value) == line


def test_a_changed_copy_keeps_the_bytes() -> None:
    from dataclasses import replace

    machine = Machine(device_memory="2GiB")
    assert replace(machine, margin=0.2).device_memory == 2 * GiB


def test_the_host_link_is_the_flags_else_the_one_nvml_read_on_the_profiled_gpu() -> None:
    from _profiles import synthetic_profile

    record = synthetic_profile()  # a GPU profile that read no link
    read = record.model_copy(
        update={"environment": record.environment.model_copy(update={"pcie_gbps": 504.0})}
    )
    machine = Machine().with_default_budget(read)
    assert (machine.pcie_gbps, machine.pcie_source) == (504.0, "nvml")
    given = Machine(pcie_gbps=100.0).with_default_budget(read)
    assert (given.pcie_gbps, given.pcie_source) == (100.0, "given")
    unknown = Machine().with_default_budget(record)
    assert (unknown.pcie_gbps, unknown.pcie_source) == (None, None)
