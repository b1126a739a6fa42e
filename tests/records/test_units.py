"""Sizes, counts and rates as people read and write them."""

from __future__ import annotations

import pytest

from autotune.records import (
    AutotuneError,
    format_bytes,
    format_count,
    format_flops,
    format_given_bytes,
    parse_bytes,
    parse_count,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GB", 80 * 10**9),
        ("80GiB", 80 * 2**30),
        ("512MiB", 512 * 2**20),
        ("3GiB", 3 * 2**30),
        ("80gb", 80 * 10**9),
        ("80G", 80 * 10**9),
        ("80Gi", 80 * 2**30),
        ("1.5T", 1_500 * 10**9),
        ("512Mi", 512 * 2**20),
        ("64k", 64_000),
    ],
)
def test_sizes_read_decimal_and_binary_units(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_counts_read_si_units() -> None:
    assert parse_count("300B") == 300 * 10**9
    assert parse_count("7.5B") == 7_500_000_000


@pytest.mark.parametrize("text", ["0GB", "-1GiB"])
def test_a_size_must_be_positive_and_the_flag_is_named(text: str) -> None:
    with pytest.raises(AutotuneError, match="--device-memory"):
        parse_bytes(text, "--device-memory")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (362.6e9, "362.6 GFLOP/s"),
        (989e12, "989.0 TFLOP/s"),
        (1.2e15, "1.2 PFLOP/s"),
        (5e6, "5.0 MFLOP/s"),
        (12.0, "12 FLOP/s"),
        (None, "–"),
    ],
)
def test_flop_rates_print_in_si_units(value: float | None, expected: str) -> None:
    assert format_flops(value) == expected


def test_none_is_not_measured_not_zero() -> None:
    assert format_bytes(None) == "–" and format_bytes(0) == "0 B"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1_047_680, "1.05M"), (3.29e9, "3.29B"), (6.74e12, "6.74T"), (1500, "1.50K"), (999, "999")],
)
def test_counts_print_in_short_units(value: float, expected: str) -> None:
    assert format_count(value) == expected


@pytest.mark.parametrize("text", ["80", "80.5", " 16 "])
def test_a_bare_number_is_refused_with_one_line_asking_for_a_unit(text: str) -> None:
    number = text.strip()
    with pytest.raises(AutotuneError) as caught:
        parse_bytes(text, "--device-memory")
    assert (
        str(caught.value)
        == f"--device-memory {number}: give a unit, e.g. {number}GiB or {number}GB"
    )


def test_bytes_and_both_unit_families_are_read() -> None:
    assert parse_bytes("512B") == 512
    assert parse_bytes("1.5GiB") == 1_610_612_736  # 1.5 x 1024**3
    assert parse_bytes("80 GB") == 80_000_000_000
    with pytest.raises(AutotuneError, match="--device-memory: cannot read '80GX'"):
        parse_bytes("80GX", "--device-memory")


@pytest.mark.parametrize(
    ("value", "given", "expected"),
    [
        # 80e9 / 1024**3 = 74.506; 80 x 1024**3 / 1e9 = 85.899
        (80_000_000_000, "80GB", "80 GB (74.51 GiB)"),
        (85_899_345_920, "80GiB", "80 GiB (85.90 GB)"),
        (1_610_612_736, "1.5gib", "1.50 GiB (1.61 GB)"),
        (512 * 1024**2, "512MiB", "512 MiB (536.87 MB)"),
        # without the text: the family the value is round in
        (85_899_345_920, None, "80 GiB (85.90 GB)"),
        (80_000_000_000, None, "80 GB (74.51 GiB)"),
        (3 * 1024**3, None, "3 GiB (3.22 GB)"),
        (None, None, "–"),
    ],
)
def test_memory_shows_in_the_unit_given_with_the_other_beside(
    value: int | None, given: str | None, expected: str
) -> None:
    assert format_given_bytes(value, given) == expected
