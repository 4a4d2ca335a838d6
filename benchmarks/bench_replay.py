"""Host time per submit: the plain Interpreter vs the CompiledReplay vs the raw bridge calls, in one run.

The raw baseline is the same bridge calls one submit makes (every msg_send, C call, store and load, captured once)
replayed from a straight Python list: ``for fn, args in calls: fn(*args)``. All three run against the same linked
``RecordingBridge`` (a standalone fake device), with recording on (each message decoded and named, as ``mtlir lower
--json`` does) and off (pass-through to the fake device: the cheapest bridge there is, so the executor's own
overhead shows most). Printed as ratios to the raw calls measured in the same run (best of several rounds), plus
the full ``Session.submit`` + ``wait`` (autorelease pool, cbslots read, retain/status/release bookkeeping).

    .venv/bin/python benchmarks/bench_replay.py [--trace examples/traces/mlp_deep.apple7.json] [--submits 2000]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtlir.metal import Prototype
from mtlir.passes import lower
from mtlir.program.program import Program
from mtlir.runtime.bridge.recording import RecordingBridge
from mtlir.runtime.executors.interpreter import Interpreter
from mtlir.runtime.executors.replay import CompiledReplay
from mtlir.runtime.link.link import link
from mtlir.runtime.session import Session
from mtlir.frontend.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]


class Capture:
    """A bridge wrapper that notes each call of one run as (the inner bridge's bound method, args)."""

    def __init__(self, inner: RecordingBridge) -> None:
        self.inner, self.target, self.calls = inner, inner.target, []  # type: ignore[var-annotated]

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        self.calls.append((self.inner.msg_send, (proto, args)))
        return self.inner.msg_send(proto, args)

    def c_call(self, fn: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
        self.calls.append((self.inner.c_call, (fn, proto, args)))
        return self.inner.c_call(fn, proto, args)

    def load(self, addr: int, dtype: Any) -> Any:
        self.calls.append((self.inner.load, (addr, dtype)))
        return self.inner.load(addr, dtype)

    def store(self, addr: int, dtype: Any, value: Any) -> None:
        self.calls.append((self.inner.store, (addr, dtype, value)))
        self.inner.store(addr, dtype, value)

    def sel_registerName(self, name: str) -> int:
        return self.inner.sel_registerName(name)


def best_per_call(fns: dict[str, Callable[[], Any]], n: int, rounds: int = 7,
                  between: Callable[[], Any] = lambda: None) -> dict[str, float]:
    """Seconds per call of each function: the best of ``rounds`` rounds of ``n`` calls, the functions taking turns
    within each round (so a slower moment of a shared machine hits them alike). ``between`` runs before each."""
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            between()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t0) / n)
    return best


def lower_trace(path: Path, target: str) -> tuple[Program, dict[str, int]]:
    trace = load_trace(path)
    program = lower(trace.queue(trace.device()), target=target, keep_stages=False).program
    return program, trace.values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=ROOT / "examples/traces/mlp_deep.apple7.json")
    ap.add_argument("--target", choices=["arm64", "x86_64"], default="arm64")
    ap.add_argument("--submits", type=int, default=2000)
    args = ap.parse_args()
    program, values = lower_trace(args.trace, args.target)
    values = {k: v for k, v in values.items()}
    values.setdefault("timeline", 1)
    if "timeline" not in program.variables:
        values.pop("timeline")

    bridge = RecordingBridge(target=args.target)
    linked = link(program, bridge)
    interp = Interpreter(program, bridge, linked.registers)
    compiled = CompiledReplay(program, bridge, linked.registers)
    cap = Capture(bridge)
    CompiledReplay(program, cap, linked.registers).run(**values)  # type: ignore[arg-type]
    calls = cap.calls

    def raw() -> None:
        for fn, a in calls:
            fn(*a)

    nmsg = sum(1 for fn, _ in calls if fn == bridge.msg_send)
    print(f"{args.trace.name} ({program.device.family}, {args.target}): {len(program.instrs)} instructions, "
          f"{len(calls)} bridge calls per submit ({nmsg} messages), {args.submits} submits per round")
    session = Session(program, RecordingBridge(target=args.target))
    session.bridge.recording = False  # type: ignore[attr-defined]
    rest = {k: v for k, v in values.items() if k != "timeline"}

    def submit_wait() -> None:
        session.submit(**rest)
        session.wait()

    for recording in (True, False):
        bridge.recording = recording
        fns = {"raw": raw, "interpreter": lambda: interp.run(**values), "compiled": lambda: compiled.run(**values)}
        if not recording:
            fns["session"] = submit_wait
        t = best_per_call(fns, args.submits, between=bridge.clear)
        line = (f"  recording {'on ' if recording else 'off'}: raw calls {t['raw'] * 1e6:7.2f} us/submit | "
                f"interpreter {t['interpreter'] / t['raw']:5.2f}x | compiled replay {t['compiled'] / t['raw']:5.2f}x")
        if "session" in t:
            line += (f"\n  Session.submit + wait (compiled, recording off): {t['session'] * 1e6:7.2f} us/submit = "
                     f"{t['session'] / t['raw']:5.2f}x the raw calls of the Program alone (pool, cbslots, status, "
                     "GPU times, release)")
        print(line)
    session.close()
    bridge.recording = False
    linked.release()


if __name__ == "__main__":
    main()
