"""Byte sizes: parsing budget strings and printing them back."""

from __future__ import annotations

import math
import re

from ..errors import KvbenchError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_LARGEST = 2.0**80  # a size beyond this (a yobibyte) is a typo, and past float's range an error
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int | float, what: str = "size", zero_ok: bool = False) -> int:
    """Parse ``"12GiB"``, ``"40GB"``, ``"1.5 MiB"`` or a plain byte count into bytes; a size of
    zero is refused unless ``zero_ok`` (a CPU tier's 0: none)."""
    if isinstance(value, bool):
        raise KvbenchError(f"{what}: expected a size such as '12GiB', got {value!r}")
    if isinstance(value, (int, float)) and value < 0 or isinstance(value, str) and value.strip().startswith("-"):
        raise KvbenchError(f"{what}: must not be negative, got {value!r}")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value) or value != int(value):
            raise KvbenchError(f"{what}: expected a whole number of bytes, got {value!r}")
        if value > _LARGEST:
            raise KvbenchError(f"{what}: a size of {len(str(value))} digits is beyond any machine")
        number, unit = float(value), ""
    else:
        m = _SIZE_RE.match(str(value))
        if not m:
            raise KvbenchError(f"{what}: cannot parse {value!r}; use bytes or a unit such as '12GiB', '40GB', '512MiB'")
        number, unit = float(m.group(1)), m.group(2).lower()
        if unit not in _UNITS:
            known = ", ".join(u for u in ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"))
            raise KvbenchError(f"{what}: unknown unit {m.group(2)!r} in {value!r} (known: {known})")
        if number * _UNITS[unit] > _LARGEST:  # "1e400" is inf: no byte count
            raise KvbenchError(f"{what}: {value!r} is beyond any machine")
        if _UNITS[unit] == 1 and number != int(number):
            raise KvbenchError(f"{what}: expected a whole number of bytes, got {value!r}")
    nbytes = int(number * _UNITS[unit])
    if nbytes <= 0 and not (zero_ok and number == 0):
        raise KvbenchError(f"{what}: must be positive, got {value!r}")
    return nbytes


def format_bytes(nbytes: float) -> str:
    """Human-readable binary size: 819200 -> '800.0 KiB'."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(value) < 1024 or unit == "EiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
