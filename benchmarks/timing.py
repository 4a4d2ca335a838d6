"""Interleaved timing: every figure of the benchmarks is a ratio against a reference run in the same process.

``interleaved(fns, n, rounds)`` runs each function ``n`` times per round, the functions taking turns within every
round (so a slower moment of the shared machine hits them alike), and returns the median over ``rounds`` rounds of
the seconds per call of each. CPU time of this process (``time.process_time``) where the work is on the CPU,
wall-clock time (``time.perf_counter``) where it waits on a device. Never a best-of-N: one lucky round of a
reference made a figure like "compiled replay 0.75x the raw calls" possible (issue 14).
"""
from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["interleaved", "MIN_ROUNDS", "ratio"]

MIN_ROUNDS = 7


def interleaved(fns: Mapping[str, Callable[[], Any]], n: int, rounds: int = MIN_ROUNDS, *, cpu: bool = True,
                between: Callable[[], Any] | None = None) -> dict[str, float]:
    """Median seconds per call of each function of ``fns``: ``rounds`` rounds (at least ``MIN_ROUNDS``) of ``n``
    calls each, the functions in turn within a round, the order rotated every round. ``cpu``: process CPU time
    (else wall clock). ``between`` runs before each function's batch, outside the timed part. The garbage
    collector is off while timing (a collection would land on whichever function happens to allocate last)."""
    rounds = max(rounds, MIN_ROUNDS)
    clock = time.process_time if cpu else time.perf_counter
    names = list(fns)
    samples: dict[str, list[float]] = {k: [] for k in names}
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                fn = fns[k]
                if between is not None:
                    between()
                t0 = clock()
                for _ in range(n):
                    fn()
                samples[k].append((clock() - t0) / n)
            gc.collect()
    finally:
        if enabled:
            gc.enable()
    return {k: statistics.median(v) for k, v in samples.items()}


def ratio(a: float, b: float) -> float:
    """``a / b``, or infinity when the reference ``b`` measured as 0 (a clock too coarse for ``n``)."""
    return a / b if b > 0 else float("inf")
