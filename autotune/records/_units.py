"""Parsing and formatting of byte sizes, counts and bandwidths given on the command line."""

from __future__ import annotations

import re

from autotune.records._errors import AutotuneError

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def _split(text: str, units: dict[str, int], flag: str) -> float:
    match = _NUMBER.match(text)
    if not match or match.group(2).lower() not in units:
        known = ", ".join(unit for unit in units if unit)
        raise AutotuneError(
            f"{flag}: cannot read {text!r} (a number with an optional unit: {known})"
        )
    return float(match.group(1)) * units[match.group(2).lower()]


def parse_bytes(text: str, flag: str = "size") -> int:
    """Read a size such as ``80GB``, ``80GiB`` or ``512MiB`` as bytes (GB = 10**9, GiB = 2**30)."""
    value = _split(text, _BYTE_UNITS, flag)
    if value <= 0:
        raise AutotuneError(f"{flag}: {text!r} must be positive")
    return int(value)


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
