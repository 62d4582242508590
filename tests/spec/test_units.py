"""Sizes as suites and the command line write them (``harness.spec.units.parse_size``): every
malformed size is a one-line ``KvbenchError``, never a traceback nor a quietly rounded count."""

from __future__ import annotations

import pytest
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.units import parse_size


@pytest.mark.parametrize(
    ("value", "expected"),
    [("12GiB", 12 * 2**30), ("40GB", 40 * 10**9), ("1.5 MiB", 1_572_864), ("512", 512), (2**40, 2**40), (3.0, 3)],
)
def test_sizes(value: object, expected: int) -> None:
    assert parse_size(value, "kv_budget") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("1e400", "beyond any machine"),  # float("1e400") is inf: int() of it raised OverflowError
        (10**400, "beyond any machine"),
        ("1.5", "whole number of bytes"),  # was read as 1 byte
        ("1.5B", "whole number of bytes"),
        (1.5, "whole number of bytes"),
        (float("nan"), "whole number of bytes"),
        (True, "expected a size"),
        ("0", "must be positive"),
        ("12 parsecs", "unknown unit"),
        ("-1GiB", "must not be negative"),
    ],
)
def test_bad_sizes_are_one_line(value: object, needle: str) -> None:
    with pytest.raises(KvbenchError) as err:
        parse_size(value, "kv_budget")  # type: ignore[arg-type]
    assert needle in str(err.value) and "\n" not in str(err.value)
