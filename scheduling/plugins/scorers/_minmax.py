"""Shared min-max helper for load scorers."""

from __future__ import annotations

from collections.abc import Sequence


def inverse_minmax(values: Sequence[float]) -> list[float]:
    """(max − v) / (max − min) per value; 1.0 everywhere when all values are equal."""
    hi = max(values)
    lo = min(values)
    if hi == lo:
        return [1.0] * len(values)
    span = 1.0 / (hi - lo)
    return [(hi - v) * span for v in values]
