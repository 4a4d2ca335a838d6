"""Direct calls: a Program's messages as bare ctypes calls on a native ``MetalBridge``, where every value provably
fits its prototype.

``MetalBridge.msg_send`` checks each argument against the prototype before the ctypes call, because ctypes wraps
integers silently (docs/metal-bridge.md, "Checks"). In a Program most values need no check at run time: a
constant, a selector or a linked object is checked once, here, before the first run; a value an instruction
computes is a Python int within its dtype's range (integers wrap to their dtype), a variable lies within its
bounds, a pointer result of a message is an address. ``value_bounds`` proves those ranges; ``NativeCalls`` gives
the executors the bare ctypes function of a prototype (``MetalBridge.function``: argtypes and restype set once),
the converted form of a constant argument (an ``MTLSizeStruct`` for an MTLSize on x86_64), and a ctypes cell for
a store or load at a constant host address. A message with a value that cannot be proven to fit goes through
``msg_send`` as before, so the checks and their errors (``BridgeError`` naming the selector and the argument) are
unchanged. Only a ``MetalBridge`` whose target is the machine's own gets direct calls (a ``RecordingBridge`` or a
simulated device keeps its ``msg_send``, which records or interprets each message).
"""
from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

from mtlir.ir.dtypes import DType, dtypes
from mtlir.ir.ops import GroupOp
from mtlir.metal import Prototype
from mtlir.program.instructions import Alu, Bitcast, Call, Cast, Gep, Index, Load, Range, Struct
from mtlir.program.program import Program
from mtlir.runtime.metal.bridge import MetalBridge
from mtlir.runtime.metal.marshal import Unfit, checker, ret_kind
from mtlir.errors import BridgeError

__all__ = ["NativeCalls", "value_bounds", "Bounds", "RETURNS", "fits"]

Bounds = tuple[int, int]
U64: Bounds = (0, (1 << 64) - 1)
# how a direct call's raw ctypes result becomes what msg_send returns (marshal's conversions), ``{}`` the call
RETURNS = {"void": "{}", "bool": "(1 if {} & 255 else 0)", "ptr": "({} or 0)", "plain": "{}"}
_CELLS: dict[DType, Any] = {dtypes.uint64: ctypes.c_uint64, dtypes.int64: ctypes.c_int64,
                            dtypes.uint32: ctypes.c_uint32, dtypes.int32: ctypes.c_int32,
                            dtypes.uint16: ctypes.c_uint16, dtypes.int16: ctypes.c_int16,
                            dtypes.uint8: ctypes.c_uint8, dtypes.int8: ctypes.c_int8}


def _cell_type(dt: DType) -> Any:
    """The ctypes integer type of an integer-like ``dt`` in host memory (an id or a pointer: a uint64), or None."""
    return _CELLS.get(dt, ctypes.c_uint64 if dt.kind in ("ptr", "id", "sel") and dt.itemsize == 8 else None)


def _word(dt: DType) -> bool:
    return bool(dt.is_word and dt.kind != "bool")


def _range(dt: DType) -> Bounds:
    return dtypes.min(dt), dtypes.max(dt)


def fits(b: Bounds | None, dt: DType) -> bool:
    """Whether every value within ``b`` fits the integer-like ``dt`` (a BOOL: 0 or 1)."""
    if b is None or not (dt.is_word or dt.kind == "bool"):
        return False
    lo, hi = _range(dt)
    return lo <= b[0] and b[1] <= hi


def _ret_bounds(proto: Prototype) -> Bounds | None:
    kind = ret_kind(proto.ret)
    if kind == "ptr":
        return U64
    if kind == "bool":
        return (0, 1)
    return _range(proto.ret) if kind == "plain" and _word(proto.ret) else None


def value_bounds(program: Program, values: Mapping[int, Any]) -> tuple[dict[int, Bounds], dict[int, tuple[Any, ...]]]:
    """Registers whose value is always a Python int within known bounds, on a ``MetalBridge``: ``(bounds, fields)``
    where ``fields[r]`` holds the bounds of each field of a STRUCT register (None for a field without). ``values``:
    the registers that hold a value before the run (constants, selectors, objects). A register written more
    than once gets no bounds (the bounds of one write would not cover the others)."""
    writes: dict[int, int] = {}
    for ins in program.instrs:
        if ins.dst >= 0:
            writes[ins.dst] = writes.get(ins.dst, 0) + 1
    bounds: dict[int, Bounds] = {r: (v, v) for r, v in values.items() if type(v) is int}
    bounds.update({r: (lo, hi) for r, lo, hi in program.variables.values()})
    fields: dict[int, tuple[Any, ...]] = {r: tuple((x, x) if type(x) is int else None for x in v)
                                          for r, v in values.items() if type(v) is tuple}
    for ins in program.instrs:
        dst = ins.dst
        if dst < 0 or writes.get(dst) != 1:
            continue
        match ins:
            case Alu(op=op, dtype=dt) if op not in GroupOp.Comparison and _word(dt):
                bounds[dst] = _range(dt)
            case Cast(dtype=dt, src=src) if _word(dt) and src in bounds and fits(bounds[src], dt):
                bounds[dst] = bounds[src]  # an integer conversion that keeps every value
            case Cast(dtype=dt) | Bitcast(dtype=dt) | Load(dtype=dt) if _word(dt):
                bounds[dst] = _range(dt)
            case Call(proto=proto):
                b = _ret_bounds(proto)
                if b is not None:
                    bounds[dst] = b
            case Struct(fields=srcs):
                fields[dst] = tuple(bounds.get(s) for s in srcs)
            case Gep(field=f, src=src) if src in fields and 0 <= f < len(fields[src]) and fields[src][f]:
                bounds[dst] = fields[src][f]
            case Range(bound=b) if b in bounds:  # the counter, read inside its loop only: 0 .. bound - 1
                bounds[dst] = (0, max(bounds[b][1] - 1, 0))
            case Index(itemsize=size, base=base, index=index) if base in bounds and index in bounds and size >= 0:
                (b0, b1), (i0, i1) = bounds[base], bounds[index]
                bounds[dst] = (b0 + i0 * size, b1 + i1 * size)
    return bounds, fields


class NativeCalls:
    """The direct-call side of a native ``MetalBridge`` (module docstring); ``of(bridge)`` is None for any other
    Bridge."""

    def __init__(self, bridge: MetalBridge) -> None:
        self.bridge = bridge

    @staticmethod
    def of(bridge: Any) -> NativeCalls | None:
        """A ``NativeCalls`` for a ``MetalBridge`` of this machine's target (exactly that class: a subclass may
        do more per message), else None."""
        if type(bridge) is MetalBridge and bridge.native:
            return NativeCalls(bridge)
        return None

    def function(self, proto: Prototype) -> Any:
        """The bare ctypes function of ``objc_msgSend`` with ``proto``, or None when it cannot travel."""
        try:
            return self.bridge.function(proto)
        except BridgeError:
            return None

    @staticmethod
    def constant(dt: DType, value: Any) -> tuple[bool, Any]:
        """``(True, the value as the ctypes call takes it)`` for a constant argument of dtype ``dt`` that fits
        (an int, a float, an ``MTLSizeStruct``), ``(False, None)`` when it does not (``msg_send`` reports it)."""
        try:
            return True, checker(dt)(value)
        except (Unfit, TypeError, ValueError):
            return False, None

    @staticmethod
    def array(base: Any, dt: DType, index: Bounds | None, itemsize: int) -> Any:
        """A ctypes array of ``dt`` at the host address ``base`` that an index within ``index`` (bounds) reads
        as ``base + index * itemsize`` would (a host table a loop reads), or None (not an integer-like dtype of
        that size, a negative or unbounded index, more than 2**24 entries)."""
        ct = _cell_type(dt)
        if (ct is None or index is None or index[0] < 0 or index[1] >= 1 << 24 or ctypes.sizeof(ct) != itemsize
                or type(base) is not int or not 0 < base < (1 << 64)):
            return None
        return (ct * (index[1] + 1)).from_address(base)

    @staticmethod
    def cell(addr: Any, dt: DType) -> Any:
        """A ctypes integer object at the host address ``addr`` for a store or load of the integer-like ``dt``
        (an id or a pointer as a uint64), or None (a float, a struct, a bad address: ``store``/``load`` do it)."""
        ct = _cell_type(dt)
        if ct is None or type(addr) is not int or not 0 < addr < (1 << 64):
            return None
        return ct.from_address(addr)

    @staticmethod
    def pointer_cell(cell: Any) -> Any:
        """The ctypes ``c_void_p`` over the same memory as ``cell`` (a ``cell`` of a pointer's size), or None: a
        store of a pointer result as ctypes returns it (None for NULL) writes the same word as ``cell`` would
        write the converted result (0 for NULL)."""
        if cell is None or ctypes.sizeof(cell) != ctypes.sizeof(ctypes.c_void_p):
            return None
        return ctypes.c_void_p.from_address(ctypes.addressof(cell))


Arg = tuple[bool, Any]  # (True, a constant as the ctypes call takes it) or (False, the register to read)


def plan_message(native: NativeCalls, ins: Call, fixed: Mapping[int, Any], bounds: Mapping[int, Bounds],
                 sizes: set[int] | frozenset[int] = frozenset()) -> tuple[Any, list[Arg]] | None:
    """How a message of ``objc_msgSend`` runs as a direct call: ``(ctypes function, one Arg per argument)``, or
    None when one value cannot be proven to fit. ``fixed``: registers whose value is known before the run;
    ``sizes``: STRUCT registers that hold an ``MTLSizeStruct`` (``size_structs``)."""
    if ins.fn != "objc_msgSend" or len(ins.args) != len(ins.proto.args):
        return None
    fn = native.function(ins.proto)
    if fn is None:
        return None
    args: list[Arg] = []
    for dt, a in zip(ins.proto.args, ins.args):
        if a in fixed:
            ok, v = native.constant(dt, fixed[a])
            if not ok:
                return None
            args.append((True, v))
        elif (dt is dtypes.MTLSize and a in sizes) or (dt is not dtypes.MTLSize and fits(bounds.get(a), dt)):
            args.append((False, a))
        else:
            return None
    return fn, args


def size_structs(program: Program, native: NativeCalls, fixed: Mapping[int, Any], bounds: Mapping[int, Bounds],
                 fields: Mapping[int, tuple[Any, ...]]) -> set[int]:
    """STRUCT registers that can be built as an ``MTLSizeStruct`` instead of a tuple: three fields that fit
    NSUInteger, written once, read only as MTLSize arguments of messages that all run as direct calls."""
    writes: dict[int, int] = {}
    for ins in program.instrs:
        if ins.dst >= 0:
            writes[ins.dst] = writes.get(ins.dst, 0) + 1
    sizes = {ins.dst for ins in program.instrs if type(ins) is Struct and writes[ins.dst] == 1
             and ins.dst not in fixed and len(fields.get(ins.dst, ())) == 3
             and all(fits(b, dtypes.uint64) for b in fields[ins.dst])}
    sizes -= set(program.results.values())
    changed = True
    while changed and sizes:
        changed = False
        for ins in program.instrs:
            used = sizes.intersection(ins.reads())
            if not used:
                continue
            ok = type(ins) is Call and plan_message(native, ins, fixed, bounds, sizes) is not None and all(
                dt is dtypes.MTLSize for dt, a in zip(ins.proto.args, ins.args) if a in used)
            if not ok:
                sizes -= used
                changed = True
    return sizes
