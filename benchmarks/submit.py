"""A submit's host time as the queue grows, on the ICB path: ``submit_time_100k_over_10``.

The queue of ``bench_lowering.build`` (every EXEC different) with 10 and with 100k commands (``quick``: 1000),
lowered for x86_64 on the ICB path (Apple7, no residency set), linked once, then one submit each run by
``CompiledReplay`` on the ctypes bridge of ``benchmarks.standin``, the two interleaved (CPU time, medians of at
least 7 rounds). An ICB submit sends about ten messages whatever the command count (the commands were encoded
once, at link), so the ratio should stay near 1: it grows only with the ``executeCommandsInBuffer:withRange:``
messages, one per 16384 commands (Apple's largest range, ``MTL.MAX_ICB_RANGE``): 26 messages at 10 commands, 32
at 100k. ``submit_time_per_message_100k_over_10`` divides that out.
"""
from __future__ import annotations

from typing import Any

from benchmarks.bench_lowering import build, messages
from benchmarks.standin import build_standin, standin_registers
from benchmarks.timing import interleaved, ratio
from mtlir.metal import DeviceSpec
from mtlir.passes import lower
from mtlir.runtime.executors.replay import CompiledReplay

__all__ = ["submit_figures"]


def submit_figures(quick: bool = False) -> dict[str, Any]:
    """``submit_time_100k_over_10`` and, beside it, µs per submit and messages per submit at each size.
    Raises ``StandInError`` where the ctypes stand-in cannot be built."""
    bridge = build_standin()
    device = DeviceSpec("Apple7", residency_set=False, icb=True)
    sizes = (10, 1000 if quick else 100_000)
    runs, msgs = {}, {}
    for n in sizes:
        program = lower(build(n, device), target="x86_64", keep_stages=False).program
        values = {k: lo for k, (_, lo, _) in program.variables.items()}
        replay = CompiledReplay(program, bridge, standin_registers(program, bridge))
        replay.run(**values)
        runs[str(n)] = (lambda r=replay, v=values: r.run(**v))
        msgs[str(n)] = messages(program)
    t = interleaved(runs, 200 if quick else 2000)
    small, big = (str(s) for s in sizes)
    return {"submit_time_100k_over_10": ratio(t[big], t[small]),
            "submit_time_per_message_100k_over_10": ratio(t[big] / msgs[big], t[small] / msgs[small]),
            "submit_us": {k: v * 1e6 for k, v in t.items()}, "submit_messages": msgs}
