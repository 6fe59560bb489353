"""The interleaved loop of the in-process director micro-benchmarks (bench_routing.py, bench_llmkube.py)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any


def interleave(cases: Mapping[str, tuple[Any, dict]], rounds: int, run: Callable[[Any, dict], float],
               floor: str) -> None:
    """Time every case once per round, in the same order each round, and print the median seconds per request of
    each case and its ratio to the `floor` case."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, (d, headers) in cases.items():
            times[name].append(run(d, headers))
    base = statistics.median(times[floor])
    label = f"vs {floor}"
    print(f"{'case':<10} {'median us/request':>18} {label:>{max(8, len(label))}}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<10} {med * 1e6:>18.1f} {med / base:>{max(8, len(label))}.2f}")
