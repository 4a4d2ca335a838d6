"""Host time per submit of the two executors against the same messages written out by hand, on a ctypes bridge.

The bridge is an unmodified ``MetalBridge`` on the stand-in libobjc of tests/native (``benchmarks.standin``): every
message is a real ``objc_msgSend`` through ctypes into C methods that only record their arguments, so what an
executor adds shows in full (a fake device in Python, about 0.8 us per call, hid it: issue 14).

The reference, "hand-written calls", is the message sequence of one submit written out as straight-line Python:
one bare ctypes function per prototype (``MetalBridge.function``: argtypes and restype set, selector resolved
once), each call with its values as literals, a result passed on in a local, a constant MTLSize built once and an
MTLSize whose value depends on the submit's variables built at the call, a store or load through a ctypes object
made once per address. Which values depend on the variables is found by capturing two submits with different
values. It takes the Program's variables by keyword as an executor's ``run`` does (and ignores them). No checks:
that is the floor a person could write. All three are timed interleaved (``benchmarks.timing``: CPU time, medians
of 15 rounds of 2000 submits; 7 rounds of 100 with ``quick``).

``replay_figures(quick)`` returns ``replay_interp_over_direct`` and ``replay_compiled_over_direct`` (the worst
case over the programs measured) with the absolute microseconds per submit of each program beside them.
"""
from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.standin import build_standin, standin_registers
from benchmarks.timing import interleaved, ratio
from mtlir.frontend.trace import load_trace
from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import Prototype
from mtlir.passes import lower
from mtlir.program.program import Program
from mtlir.runtime.executors.interpreter import Interpreter
from mtlir.runtime.executors.replay import CompiledReplay
from mtlir.runtime.metal.bridge import MetalBridge
from mtlir.runtime.metal.marshal import MTLSizeStruct

__all__ = ["replay_figures", "handwritten", "Capture", "CASES"]

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"
# (trace, ICB path): a submit of an ICB (a dozen messages) and the direct path (every dispatch encoded)
CASES = [("mlp_deep.apple7", True), ("mlp_deep.apple7", False), ("symbolic_kv.apple7", True),
         ("symbolic_kv.apple7", False), ("cnn.apple7", False)]
_CTYPES = {dtypes.uint64: ctypes.c_uint64, dtypes.int64: ctypes.c_int64, dtypes.uint32: ctypes.c_uint32,
           dtypes.int32: ctypes.c_int32, dtypes.uint16: ctypes.c_uint16, dtypes.int16: ctypes.c_int16,
           dtypes.uint8: ctypes.c_uint8, dtypes.int8: ctypes.c_int8, dtypes.float32: ctypes.c_float,
           dtypes.float64: ctypes.c_double, dtypes.bool: ctypes.c_uint8}


class Capture:
    """A bridge that forwards to ``inner`` and notes each call of a run: ("msg", proto, args, result),
    ("c", fn, proto, args, result), ("load", addr, dtype, result), ("store", addr, dtype, value)."""

    def __init__(self, inner: MetalBridge) -> None:
        self.inner, self.target = inner, inner.target
        self.calls: list[tuple[Any, ...]] = []

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        r = self.inner.msg_send(proto, args)
        self.calls.append(("msg", proto, args, r))
        return r

    def c_call(self, fn: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
        r = self.inner.c_call(fn, proto, args)
        self.calls.append(("c", fn, proto, args, r))
        return r

    def load(self, addr: int, dtype: DType) -> Any:
        r = self.inner.load(addr, dtype)
        self.calls.append(("load", addr, dtype, r))
        return r

    def store(self, addr: int, dtype: DType, value: Any) -> None:
        self.inner.store(addr, dtype, value)
        self.calls.append(("store", addr, dtype, value))

    def sel_registerName(self, name: str) -> int:
        return self.inner.sel_registerName(name)


def handwritten(bridge: MetalBridge, run: list[tuple[Any, ...]], other: list[tuple[Any, ...]],
                variables: tuple[str, ...] = ()) -> Callable[..., Any]:
    """The calls of ``run`` (a ``Capture``'s list) as a straight-line function of bare ctypes calls (module
    docstring), taking ``variables`` by keyword as an executor's ``run`` does (the values themselves are the
    captured literals); ``other``: the same Program's calls with other variable values (an MTLSize that differs
    between the two is built at its call). Raises ``ValueError`` when the two runs do not send the same calls."""
    if [c[0] for c in run] != [c[0] for c in other]:
        raise ValueError("the two captured submits differ in their calls")
    ns: dict[str, Any] = {"S": MTLSizeStruct}
    names: dict[Any, str] = {}
    results: dict[int, str] = {}  # a non-zero result -> the local holding it

    def const(value: Any, key: Any) -> str:
        name = names.get(key)
        if name is None:
            name = names[key] = f"g{len(ns)}"
            ns[name] = value
        return name

    def word(v: Any) -> str:
        if type(v) is int and v in results:
            return results[v]
        return repr(v)

    lines = [f"def submit({', '.join(f'{v}=None' for v in variables)}):"]
    for i, (a, b) in enumerate(zip(run, other)):
        kind = a[0]
        if kind in ("msg", "c"):
            proto, args, res = (a[1], a[2], a[3]) if kind == "msg" else (a[2], a[3], a[4])
            fn = (bridge.function(proto) if kind == "msg" else bridge._c_calls[(a[1], proto)].fn)
            f = const(fn, ("fn", kind, a[1] if kind == "c" else None, id(proto)))
            refs = []
            for k, (dt, v) in enumerate(zip(proto.args, args)):
                if dt is dtypes.MTLSize:
                    same = v == (b[2] if kind == "msg" else b[3])[k]
                    refs.append(const(MTLSizeStruct(*v), ("size", v)) if same else f"S{tuple(v)!r}")
                else:
                    refs.append(word(v))
            lhs = ""
            if type(res) is int and res != 0 and res not in results:
                results[res] = lhs_name = f"v{i}"
                lhs = f"{lhs_name} = "
            lines.append(f"    {lhs}{f}({', '.join(refs)})")
        else:
            _, addr, dt, value = a
            ct = _CTYPES.get(dt, ctypes.c_uint64 if dt.itemsize == 8 else None)  # an id or a pointer: a word
            if ct is None:
                raise ValueError(f"no hand-written store or load of {dt.name}")
            cell = const(ct.from_address(addr), ("cell", addr, dt))
            lines.append(f"    {cell}.value = {word(value)}" if kind == "store" else f"    {cell}.value")
    exec(compile("\n".join(lines) + "\n", "<hand-written calls>", "exec"), ns)
    submit: Callable[[], Any] = ns["submit"]
    return submit


def _case(bridge: MetalBridge, trace: str, icb: bool) -> tuple[Program, dict[str, int], dict[str, int]]:
    """The Program of ``trace`` for x86_64 on the ICB or direct path, its values and a second set of values."""
    tr = load_trace(TRACES / f"{trace}.json")
    program = lower(tr.queue(dataclasses.replace(tr.device(), icb=icb)), target="x86_64", keep_stages=False).program
    values = {k: int(v) for k, v in tr.values.items() if k in program.variables}
    if "timeline" in program.variables:
        values.setdefault("timeline", 1)
    other = {k: (v + 1 if v + 1 <= program.variables[k][2] else v - 1) for k, v in values.items()}
    return program, values, other


def replay_figures(quick: bool = False) -> dict[str, Any]:
    """Median host CPU time per submit of ``Interpreter`` and ``CompiledReplay`` against the hand-written calls,
    interleaved in one process, per case of ``CASES`` (a trace on the ICB or the direct path). Returns
    ``replay_interp_over_direct`` and ``replay_compiled_over_direct`` (the worst case) and ``replay_cases``
    (per case: messages per submit, µs per submit of each, the two ratios). Raises ``StandInError`` where the
    stand-in cannot be built (not x86_64, no C compiler)."""
    bridge = build_standin()
    cases: dict[str, Any] = {}
    n = 100 if quick else 2000
    for trace, icb in (CASES[:2] if quick else CASES):
        program, values, other = _case(bridge, trace, icb)
        regs = standin_registers(program, bridge)
        interp, compiled = Interpreter(program, bridge, regs), CompiledReplay(program, bridge, regs)
        caps = []
        for vals in (values, other):
            cap = Capture(bridge)
            CompiledReplay(program, cap, regs).run(**vals)  # type: ignore[arg-type]
            caps.append(cap.calls)
        hand = handwritten(bridge, caps[0], caps[1], tuple(program.variables))
        t = interleaved({"hand-written": lambda: hand(**values), "interpreter": lambda: interp.run(**values),
                         "compiled": lambda: compiled.run(**values)}, n, 7 if quick else 15)
        cases[f"{trace} {'icb' if icb else 'direct'}"] = {
            "messages": sum(1 for c in caps[0] if c[0] == "msg"), "calls": len(caps[0]),
            "us_hand_written": t["hand-written"] * 1e6, "us_interpreter": t["interpreter"] * 1e6,
            "us_compiled": t["compiled"] * 1e6,
            "interp_over_direct": ratio(t["interpreter"], t["hand-written"]),
            "compiled_over_direct": ratio(t["compiled"], t["hand-written"])}
    return {"replay_interp_over_direct": max(c["interp_over_direct"] for c in cases.values()),
            "replay_compiled_over_direct": max(c["compiled_over_direct"] for c in cases.values()),
            "replay_cases": cases}
