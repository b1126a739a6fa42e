"""Parsing and formatting of byte sizes, counts and bandwidths given on the command line."""

from __future__ import annotations

import re

from autotune.records._errors import AutotuneError

_BYTE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    # the same without the B, as `free -h` and Kubernetes write them (G = GB, Gi = GiB)
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_DECIMAL = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


def _split(text: str, units: dict[str, int], flag: str) -> float:
    match = _NUMBER.match(text)
    if not match or match.group(2).lower() not in units:
        known = ", ".join(unit for unit in units if unit)
        raise AutotuneError(
            f"{flag}: cannot read {text!r} (a number with an optional unit: {known})"
        )
    return float(match.group(1)) * units[match.group(2).lower()]


def parse_bytes(text: str, flag: str = "size") -> int:
    """Read a size such as ``80GB``, ``80GiB`` or ``512MiB`` as bytes (GB = 10**9, GiB = 2**30;
    any case; the B may be left out: ``80G`` is 80 GB, ``80Gi`` 80 GiB).

    A bare number is refused: ``80`` could be bytes, GB or GiB, which differ by 7%. (In a count
    such as ``--train-tokens 300B`` the B is billions: a count has no bytes.)

    Raises:
        AutotuneError: no unit, an unknown unit, or not positive; the message names ``flag``.
    """
    match = _NUMBER.match(text)
    if match and not match.group(2):
        number = match.group(1)
        raise AutotuneError(f"{flag} {text.strip()}: give a unit, e.g. {number}GiB or {number}GB")
    if not match or match.group(2).lower() not in _BYTE_UNITS:
        raise AutotuneError(
            f"{flag}: cannot read {text!r} (a number and a unit: B, kB, MB, GB, TB, "
            "KiB, MiB, GiB, TiB; or k, M, G, T, Ki, Mi, Gi, Ti)"
        )
    value = float(match.group(1)) * _BYTE_UNITS[match.group(2).lower()]
    if value <= 0:
        raise AutotuneError(f"{flag}: {text!r} must be positive")
    return int(value)


def _in_units(value: float, units: tuple[tuple[str, int], ...]) -> str:
    """``value`` in the largest unit of ``units`` it reaches: ``80 GiB``, ``74.51 GiB``."""
    for unit, scale in units:
        if abs(value) >= scale or unit == units[-1][0]:
            scaled = value / scale
            text = f"{scaled:.0f}" if scaled == round(scaled) else f"{scaled:.2f}"
            return f"{text} {unit}"
    raise AssertionError("unreachable")


def _decimals(value: float, units: tuple[tuple[str, int], ...]) -> int:
    """Decimal places ``value`` needs in its unit of ``units`` (3: more than two)."""
    scale = next((scale for _, scale in units if abs(value) >= scale), units[-1][1])
    scaled = value / scale
    return next((d for d in range(3) if abs(scaled * 10**d - round(scaled * 10**d)) < 1e-6), 3)


def format_given_bytes(value: int | None, given: str | None = None) -> str:
    """A size in the unit the user gave it in, with the other family beside it.

    ``given`` is the text the user typed (``80GB``); without it the family is the one the
    value is round in (a budget typed as ``80GiB`` is a whole number of GiB, not of GB).

    Example:
        >>> format_given_bytes(80 * 10**9, "80GB"), format_given_bytes(80 * 2**30)
        ('80 GB (74.51 GiB)', '80 GiB (85.90 GB)')
    """
    if value is None:
        return "–"
    match = _NUMBER.match(given) if given else None
    unit = match.group(2).lower() if match else ""
    if unit in _BYTE_UNITS and unit != "b":
        binary = unit.endswith("ib")
    else:
        binary = _decimals(value, _BINARY) <= _decimals(value, _DECIMAL)
    first, other = (_BINARY, _DECIMAL) if binary else (_DECIMAL, _BINARY)
    return f"{_in_units(value, first)} ({_in_units(value, other)})"


def parse_count(text: str, flag: str = "count") -> int:
    """Read a count such as ``300B`` (3e11), ``7.5B`` or ``2M``."""
    value = _split(text, _COUNT_UNITS, flag)
    if value <= 0:
        raise AutotuneError(f"{flag}: {text!r} must be positive")
    return int(value)


def format_bytes(value: float | None) -> str:
    """Human-readable bytes in binary units; ``None`` (not measured) prints as an en dash."""
    if value is None:
        return "–"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _scaled(value: float, prefixes: tuple[tuple[str, float], ...]) -> tuple[float, str]:
    """``value`` in the largest of ``prefixes`` (name, scale; largest first) it reaches, else as is."""
    for prefix, scale in prefixes:
        if abs(value) >= scale:
            return value / scale, prefix
    return value, ""


def format_count(value: float | None) -> str:
    """Human-readable count (1.2K, 3.4M, 7.0B); ``None`` prints as an en dash."""
    if value is None:
        return "–"
    scaled, prefix = _scaled(value, (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)))
    return f"{scaled:.2f}{prefix}" if prefix else f"{value:.0f}"


def format_flops(value: float | None) -> str:
    """A rate of floating-point operations in SI units (``362.6 GFLOP/s``); ``None`` as an en dash."""
    if value is None:
        return "–"
    scaled, prefix = _scaled(value, (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)))
    return f"{scaled:.1f} {prefix}FLOP/s" if prefix else f"{value:.0f} FLOP/s"
