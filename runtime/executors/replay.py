"""CompiledReplay: the fast executor, one generated Python function per Program.

Same interface and semantics as ``mtlir.runtime.executors.interpreter.Interpreter``. At construction it writes the
source of a function for the Program (``source``) and compiles it:

- registers that never change (constants, selectors, object handles) become literals: a message whose arguments
  are all static passes one constant tuple, ``msg_send(P3, (0x600000004000, 0x190000010))``;
- pure instructions of fixed operands are folded at generation time (their results never change);
- the other registers are locals; RANGE ... END become ``for`` loops;
- variables are bound by keyword with their types and bounds checked inline (anything unusual takes the slow path
  of ``bind_variables``, which names the variable and its bounds);
- integer wraps, int -> int casts and divisions by positive constants are inline expressions.

On a native ``MetalBridge`` a message whose every value is proven to fit is a bare ctypes call and a store at a
constant address a ctypes cell (``mtlir.runtime.executors.native``), so a submit costs what the same calls written
by hand cost (``python -m benchmarks --only replay``: 0.93-1.06x). Where the variables bind by keyword, ``run`` is
the generated function itself. An exception raised by the Bridge during a run carries a note naming the
instruction (from the generated line).
"""
from __future__ import annotations

import keyword
import linecache
import math
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from mtlir.errors import MtlirError
from mtlir.ir.dtypes import DType, dtypes
from mtlir.ir.evaluate import c_idiv, c_mod
from mtlir.ir.ops import GroupOp, Ops
from mtlir.program.instructions import Alu, Bitcast, Call, Cast, End, Gep, Index, Instr, Load, Range, Store, Struct
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.executors.executor import (Executor, ProgramError, alu_fn, bind_variables, bitcast_fn, cast_fn,
                                              float_rounder, format_instr)
from mtlir.runtime.executors.interpreter import Interpreter
from mtlir.runtime.executors.native import RETURNS, NativeCalls, fits, size_structs, value_bounds
from mtlir.runtime.metal.marshal import MTLSizeStruct, ret_kind

__all__ = ["CompiledReplay", "EXECUTORS", "make_executor"]

_INT_FMT = "0x{:x}"
_EXPR = {
    Ops.ADD: "{0} + {1}", Ops.SUB: "{0} - {1}", Ops.MUL: "{0} * {1}", Ops.NEG: "-{0}",
    Ops.IDIV: "idiv({0}, {1})", Ops.MOD: "cmod({0}, {1})", Ops.MAX: "max({0}, {1})", Ops.MIN: "min({0}, {1})",
    Ops.SHL: "{0} << {1}", Ops.SHR: "{0} >> {1}", Ops.AND: "{0} & {1}", Ops.OR: "{0} | {1}", Ops.XOR: "{0} ^ {1}",
    Ops.CMPLT: "{0} < {1}", Ops.CMPLE: "{0} <= {1}", Ops.CMPEQ: "{0} == {1}", Ops.CMPNE: "{0} != {1}",
    Ops.WHERE: "({1} if {0} else {2})",
}


_MISSING = object()
# the range of a plain int each integer struct code packs (``_view_store``)
_INT_BOUNDS = {fmt: ((0, (1 << (8 * n)) - 1) if fmt.isupper() else (-(1 << (8 * n - 1)), (1 << (8 * n - 1)) - 1))
               for fmt, n in (("B", 1), ("b", 1), ("H", 2), ("h", 2), ("I", 4), ("i", 4), ("Q", 8), ("q", 8))}
_UNROLL = 512  # the most instructions a loop of constant bound becomes when unrolled (native MetalBridge)
_POINTERS = ("ptr", "id", "sel")  # argument kinds ctypes passes as c_void_p (None is NULL)
_RESERVED = re.compile(r"[rPDWFCKVSNMA]\d+|msg_send|c_call|load|store|idiv|cmod|max|min|range|bool|type|int|replay|make"
                       r"|_program|_slow|_note|_extra|_M|e")  # names of the generated code


class CompiledReplay(Executor):
    """The compiled executor: one generated Python function per Program (``source`` holds its text).

    Registers that never change (constants, selectors, objects) become literals; the others are locals; RANGE ...
    END become ``for`` loops; a message is ``msg_send(PROTO, (receiver, sel, ...))`` with a constant tuple when
    every argument is static. On a native ``MetalBridge`` a message of proven values is a bare ctypes call
    (``mtlir.runtime.executors.native``; ``raw``: pointer results kept as ctypes returns them, ``sizes``: MTLSize
    structs built once). Same semantics as ``Interpreter`` (a loop counter is local to its loop)."""

    name = "compiled"
    _count: ClassVar[int] = 0

    def __init__(self, program: Program, bridge: Bridge, registers: Sequence[Any] | None = None, *,
                 results: Sequence[int] = ()) -> None:
        super().__init__(program, bridge, registers, results=results)
        self.namespace: dict[str, Any] = {"idiv": c_idiv, "cmod": c_mod, "max": max, "min": min, "range": range}
        self.lines: dict[int, int] = {}  # source line -> pc
        self._names: dict[Any, str] = {}
        self._keywords = all(n.isidentifier() and not keyword.iskeyword(n) and not _RESERVED.fullmatch(n)
                             for n in program.variables)
        self.namespace["_M"] = _MISSING
        self.namespace["_slow"] = self._slow
        self.namespace["_note"] = self._note
        self.known: dict[int, Any] = {}  # registers folded at generation time: pure ops of static operands
        self.ints: set[int] = {r for r, _, _ in program.variables.values()}  # registers that hold a Python int
        self.ints |= {r for r in self.static if type(self.registers[r]) is int}
        self.writes: dict[int, int] = {}
        for ins in program.instrs:
            if ins.dst >= 0:
                self.writes[ins.dst] = self.writes.get(ins.dst, 0) + 1
        self.native = NativeCalls.of(bridge)
        self.bounds, self.fields = (value_bounds(program, {r: self.registers[r] for r in self.static})
                                    if self.native is not None else ({}, {}))
        self.defs = {ins.dst: ins for ins in program.instrs if ins.dst >= 0 and self.writes.get(ins.dst) == 1}
        self.readers: dict[int, list[Instr]] = {}
        for ins in program.instrs:
            for r in set(ins.reads()):
                self.readers.setdefault(r, []).append(ins)
        self.raw = self._raw_results()
        self.sizes = (size_structs(program, self.native, {r: self.registers[r] for r in self.static}, self.bounds,
                                   self.fields) if self.native is not None else set())
        self.source = self._generate()
        CompiledReplay._count += 1
        filename = f"<mtlir compiled replay {CompiledReplay._count}>"
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
        exec(compile(self.source, filename, "exec"), self.namespace)
        self._filename = filename
        b = bridge
        self._replay: Callable[..., tuple[Any, ...]] = self.namespace["make"](b.msg_send, b.c_call, b.load, b.store)
        if self._keywords:  # the generated function takes run's arguments itself: run(program=None, /, **values)
            self.run = self._replay

    def _const(self, prefix: str, value: Any, key: Any = None) -> str:
        """A global name of the generated code holding ``value`` (one name per distinct ``key``, or value)."""
        cache_key = (prefix, value if key is None else key)
        name = self._names.get(cache_key)
        if name is None:
            name = self._names[cache_key] = f"{prefix}{len(self.namespace)}"
            self.namespace[name] = value
        return name

    def _fixed_value(self, r: int) -> Any:
        return self.registers[r] if r in self.static else self.known.get(r)

    def _fixed(self, r: int) -> bool:
        return r in self.static or r in self.known

    def _ref(self, r: int) -> str:
        if r in self.static or r in self.known:
            v = self.registers[r] if r in self.static else self.known[r]
            if type(v) is int:
                return _INT_FMT.format(v) if v >= 0 else str(v)
            if type(v) is bool or v is None or (type(v) is float and math.isfinite(v)):
                return repr(v)
            if type(v) is tuple and all(type(x) is int for x in v):
                return repr(v)
            name = f"K{r}"
            self.namespace[name] = v
            return name
        return f"r{r}"

    def _wrap(self, dtype: DType, expr: str) -> str:
        if dtype.kind == "bool":
            return f"bool({expr})"
        if dtype.is_float:
            return expr if dtype.itemsize == 8 else f"{self._const('F', float_rounder(dtype), key=dtype)}({expr})"
        if dtype.kind == "int":  # two's complement, inline: ((x + 2**(b-1)) & (2**b - 1)) - 2**(b-1)
            half = 1 << (dtype.bits - 1)
            return f"((({expr}) + 0x{half:x}) & 0x{(1 << dtype.bits) - 1:x}) - 0x{half:x}"
        return f"({expr}) & 0x{(1 << dtype.bits) - 1:x}"

    _PURE = (Alu, Cast, Bitcast, Index, Struct, Gep)

    def _fold(self, ins: Instr) -> bool:
        """Evaluate a pure instruction of fixed operands now (its result never changes); False if it cannot."""
        if type(ins) not in self._PURE or self.writes.get(ins.dst, 0) != 1 or ins.dst in self.results:
            return False
        regs = ins.reads()
        if not all(self._fixed(r) for r in regs):
            return False
        val = [self.registers[r] if r in self.static else self.known[r] for r in regs]
        try:
            match ins:
                case Alu(op=op, dtype=dtype):
                    v = alu_fn(op, dtype)(*val)
                case Cast(dtype=dtype):
                    v = cast_fn(dtype)(val[0])
                case Bitcast(dtype=dtype):
                    v = bitcast_fn(dtype)(val[0])
                case Index(itemsize=itemsize):
                    v = val[0] + val[1] * itemsize
                case Struct():
                    v = tuple(val)
                case Gep(field=field):
                    v = val[0][field]
        except Exception:  # let it fail at run time, where the interpreter fails too
            return False
        self.known[ins.dst] = v
        if type(v) is int:
            self.ints.add(ins.dst)
        return True

    def _produces_int(self, ins: Instr) -> bool:
        """Whether the instruction's result is always a Python int (a wrapped integer of a word dtype)."""
        match ins:
            case Alu(op=op, dtype=dtype):
                return bool(op not in GroupOp.Comparison and dtype.is_word and dtype.kind != "bool")
            case Cast(dtype=dtype) | Bitcast(dtype=dtype) | Load(dtype=dtype):
                return bool(dtype.is_word and dtype.kind != "bool")
            case Index(base=base, index=index):
                return base in self.ints and index in self.ints
        return False

    def _alu(self, pc: int, op: Ops, dtype: DType, srcs: tuple[int, ...]) -> str:
        """The expression of an ALU instruction: C semantics inline (a division by a positive constant without a
        call), the result wrapped to ``dtype``. Raises ``ProgramError`` for an op the dtype does not have."""
        try:
            alu_fn(op, dtype)  # validates op and dtype
        except ProgramError as e:
            raise ProgramError(f"instruction {format_instr(self.program, pc)}: {e}") from None
        expr = _EXPR[op].format(*(self._ref(a) for a in srcs))
        divisor = self._fixed_value(srcs[1]) if len(srcs) > 1 else None
        if op in (Ops.IDIV, Ops.MOD) and type(divisor) is int and divisor > 0:  # C semantics inline
            a, py = self._ref(srcs[0]), "//" if op is Ops.IDIV else "%"
            expr = f"({a} {py} {divisor} if {a} >= 0 else -(-{a} {py} {divisor}))"
        return expr if op in GroupOp.Comparison else self._wrap(dtype, expr)

    def _generate(self) -> str:
        program = self.program
        names = list(program.variables)
        if self._keywords:  # bind by keyword, types and bounds checked inline; anything unusual -> _slow
            params = "".join(f", {n}=_M" for n in names)
            out = [f"def replay(_program=None, /{params}, **_extra):"]
            checks = " or ".join(f"type({n}) is not int or not {lo} <= {n} <= {hi}"
                                 for n, (_, lo, hi) in program.variables.items())
            call = "".join(f", {n}={n}" for n in names)
            out.append(f"    if _program is not None or _extra{' or ' + checks if checks else ''}:")
            out.append(f"        return _slow(_program{call}, **_extra)")
            out += [f"    r{r} = {n}" for n, (r, _, _) in program.variables.items()]
            out.append("    try:")  # free in Python 3.11 while nothing raises
            depth = 2
        else:
            out = [f"def replay({', '.join(f'r{r}' for r, _, _ in program.variables.values())}):"]
            depth = 1
        empty_body = False
        for pc, ins, counter in self._expanded():
            dst = ins.dst
            pad = "    " * depth
            lhs = f"r{dst} = " if dst >= 0 else ""
            if counter is not None:  # an unrolled loop's iteration: its counter is a constant from here
                self.known[dst] = counter
                self.ints.add(dst)
                continue
            if self._fold(ins):
                continue
            self.known.pop(dst, None)  # an unrolled copy may have folded it with another counter
            if dst >= 0 and self.writes.get(dst, 0) == 1 and self._produces_int(ins):
                self.ints.add(dst)
            match ins:
                case End():
                    if empty_body:
                        out.append(pad + "pass")
                    depth -= 1
                    empty_body = False
                    continue
                case Range(bound=bound):
                    out.append(f"{pad}for r{dst} in range({self._ref(bound)}):")
                    self.lines[len(out)] = pc
                    depth += 1
                    empty_body = True
                    continue
                case Call(fn="objc_msgSend", proto=proto, args=args) if self._direct(proto, args, dst=dst) is not None:
                    line = lhs + self._direct(proto, args, dst >= 0, dst=dst)  # type: ignore[operator]
                case Store(dtype=dtype, addr=addr, value=value) if self._cell(dtype, addr, value) is not None:
                    line = f"{self._cell(dtype, addr, value)}.value = {self._ref(value)}"
                case Call(fn=fn, proto=proto, args=args):
                    refs = [f"({self._ref(a)} or 0)" if a in self.raw else
                            f"(r{a}.width, r{a}.height, r{a}.depth)" if a in self.sizes else self._ref(a) for a in args]
                    tup = f"({', '.join(refs)}{',' if len(refs) == 1 else ''})"
                    p = self._const("P", proto)
                    sender = self._sender(proto, args) if fn == "objc_msgSend" else None
                    line = (f"{lhs}{sender}({tup})" if sender is not None
                            else f"{lhs}msg_send({p}, {tup})" if fn == "objc_msgSend"
                            else f"{lhs}c_call({fn!r}, {p}, {tup})")
                case Store(dtype=dtype, addr=addr, value=value) if self._view_store(dtype, addr, value) is not None:
                    line = self._view_store(dtype, addr, value)  # type: ignore[assignment]
                case Store(dtype=dtype, addr=addr, value=value):
                    line = f"store({self._ref(addr)}, {self._const('D', dtype)}, {self._ref(value)})"
                case Load(dtype=dtype, addr=addr) if self._cell_load(dtype, addr) is not None:
                    line = f"{lhs}{self._cell_load(dtype, addr)}.value"
                case Load(dtype=dtype, addr=addr) if self._array_load(dtype, addr) is not None:
                    line = f"{lhs}{self._array_load(dtype, addr)}"
                case Load(dtype=dtype, addr=addr):
                    line = f"{lhs}load({self._ref(addr)}, {self._const('D', dtype)})"
                case Index() if dst in self.readers and dst not in self.results and all(
                        type(r) is Load and self._array_load(r.dtype, dst) is not None for r in self.readers[dst]):
                    continue  # read only through ctypes arrays (_array_load): nothing to compute
                case Index(itemsize=itemsize, base=base, index=index):
                    scale = "" if itemsize == 1 else f" * {itemsize}"
                    line = f"{lhs}{self._ref(base)} + {self._ref(index)}{scale}"
                case Alu(op=op, dtype=dtype, srcs=srcs):
                    line = lhs + self._alu(pc, op, dtype, srcs)
                case Struct(fields=fields) if dst in self.sizes:  # an MTLSize only direct calls read
                    line = f"{lhs}{self._const('S', MTLSizeStruct)}({', '.join(self._ref(a) for a in fields)})"
                case Struct(fields=fields):
                    line = f"{lhs}({', '.join(self._ref(a) for a in fields)},)"
                case Gep(field=field, src=src):
                    line = f"{lhs}{self._ref(src)}[{field}]"
                case Cast(dtype=dtype, src=src) if src in self.ints and dtype.is_word and dtype.kind != "bool":
                    ref = self._ref(src)  # int -> int: just the wrap, or nothing where the value is proven to fit
                    line = lhs + (ref if fits(self.bounds.get(src), dtype) else self._wrap(dtype, ref))
                case Cast(dtype=dtype, src=src) | Bitcast(dtype=dtype, src=src):
                    conv = (cast_fn if type(ins) is Cast else bitcast_fn)(dtype)
                    line = f"{lhs}{self._const('C', conv, key=(ins.opcode, dtype))}({self._ref(src)})"
            out.append(pad + line)
            self.lines[len(out)] = pc
            empty_body = False
        if self._keywords:
            out += ["        pass", "    except Exception as e:", "        _note(e)", "        raise"]
        ret = ", ".join(self._ref(r) for r in self.results)
        out.append(f"    return ({ret}{',' if len(self.results) == 1 else ''})")
        head = ["def make(msg_send, c_call, load, store):"]
        body = ["    " + line for line in out] + ["    return replay"]
        self.lines = {line + 1: pc for line, pc in self.lines.items()}  # the head line comes first
        return "\n".join(head + body) + "\n"

    def _sender(self, proto: Any, args: tuple[int, ...]) -> str | None:
        """The name of the Bridge's sender of a message of fixed SEL (``SimDevice.sender``: ``msg_send`` with the
        look-ups of its (prototype, SEL) pair done once, every check kept per message); None where the Bridge has
        none (the message goes through ``msg_send``)."""
        make = getattr(self.bridge, "sender", None)
        if make is None or len(args) < 2 or not self._fixed(args[1]):
            return None
        sel = self._fixed_value(args[1])
        key = ("P", ("sender", id(proto), sel))  # the Program holds ``proto``: its id stays its own
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"P{len(self.namespace)}"
            self.namespace[name] = make(proto, sel)
        return name

    def _direct(self, proto: Any, args: tuple[int, ...], result: bool = False, dst: int = -1) -> str | None:
        """A message as a bare ctypes call on a native MetalBridge (``mtlir.runtime.executors.native``): each
        constant argument checked and converted now, each computed one proven to fit; None when one cannot be
        (the message then goes through ``msg_send``, which checks it). ``result``: convert the raw result as
        ``msg_send`` does, unless ``dst`` is one of the ``raw`` registers."""
        if self.native is None or len(args) != len(proto.args):
            return None
        fn = self.native.function(proto)
        if fn is None:
            return None
        refs = []
        for dt, a in zip(proto.args, args):
            if self._fixed(a):
                ok, v = NativeCalls.constant(dt, self._fixed_value(a))
                if not ok:
                    return None
                if type(v) is int:
                    refs.append(_INT_FMT.format(v))
                elif type(v) is float and math.isfinite(v):
                    refs.append(repr(v))
                else:
                    refs.append(self._const("V", v, key=(id(dt), repr(self._fixed_value(a)))))
            elif dt is dtypes.MTLSize and a in self.sizes:
                refs.append(f"r{a}")
            elif dt is dtypes.MTLSize:
                f = self.fields.get(a)
                if f is None or len(f) != 3 or not all(fits(b, dtypes.uint64) for b in f):
                    return None
                refs.append(f"{self._const('S', MTLSizeStruct)}(*r{a})")
            elif a in self.raw:  # a raw pointer result: None (NULL) goes to a pointer argument as it is
                refs.append(f"r{a}" if dt.kind in _POINTERS else f"(r{a} or 0)")
            elif fits(self.bounds.get(a), dt):
                refs.append(f"r{a}")
            else:
                return None
        call = f"{self._const('N', fn, key=('fn', id(fn)))}({', '.join(refs)})"
        return RETURNS[ret_kind(proto.ret)].format(call) if result and dst not in self.raw else call

    def _expanded(self) -> list[tuple[int, Instr, int | None]]:
        """The instructions to generate, ``(pc, instruction, None)``, with each loop of a constant bound on a
        native MetalBridge unrolled (at most ``_UNROLL`` instructions, no loop inside): per iteration
        ``(range pc, RANGE, i)`` (the counter is the constant i from there), then the body; no END."""
        instrs, pc = self.program.instrs, 0
        out: list[tuple[int, Instr, int | None]] = []
        while pc < len(instrs):
            ins = instrs[pc]
            if self.native is not None and type(ins) is Range and type(self._fixed_value(ins.bound)) is int:
                bound, body = self._fixed_value(ins.bound), range(pc + 1, ins.end_pc)
                if bound * len(body) <= _UNROLL and not any(type(instrs[q]) is Range for q in body):
                    for i in range(max(bound, 0)):
                        out.append((pc, ins, i))
                        out += [(q, instrs[q], None) for q in body]
                    pc = ins.end_pc + 1
                    continue
            out.append((pc, ins, None))
            pc += 1
        return out

    def _cell_load(self, dtype: DType, addr: int) -> str | None:
        """A load at a constant host address on a native MetalBridge as a ctypes cell (its name), else None."""
        if self.native is None or not self._fixed(addr):
            return None
        cell = NativeCalls.cell(self._fixed_value(addr), dtype)
        return None if cell is None else self._const("M", cell, key=("cell", self._fixed_value(addr), dtype))

    def _array_load(self, dtype: DType, addr: int) -> str | None:
        """On a native MetalBridge, a load at ``base + index * itemsize`` (an INDEX of a constant host address by
        a bounded index, e.g. a loop counter reading a host table) as the index of a ctypes array; None
        otherwise (``load`` reads it)."""
        ins = self.defs.get(addr)
        if self.native is None or type(ins) is not Index or not self._fixed(ins.base) or self._fixed(ins.index):
            return None
        arr = NativeCalls.array(self._fixed_value(ins.base), dtype, self.bounds.get(ins.index), ins.itemsize)
        if arr is None:
            return None
        key = ("array", self._fixed_value(ins.base), dtype, len(arr))
        return f"{self._const('A', arr, key=key)}[{self._ref(ins.index)}]"

    def _raw_results(self) -> set[int]:
        """Pointer results of messages on a native MetalBridge that may stay as ctypes returns them (None for
        NULL): written once, not a result, read only as arguments of messages (``_direct`` passes them to a
        pointer parameter as they are; anywhere else they are read as ``(r or 0)``) or stored at a constant
        address of a pointer's size (``_cell``: through a ``c_void_p``, which stores None as 0)."""
        if self.native is None:
            return set()
        raw = {ins.dst for ins in self.program.instrs if type(ins) is Call and ins.fn == "objc_msgSend"
               and ins.dst >= 0 and self.writes.get(ins.dst) == 1 and ret_kind(ins.proto.ret) == "ptr"}
        raw -= set(self.results)
        for ins in self.program.instrs:
            if type(ins) is Store and self._fixed(ins.addr) and fits(self.bounds.get(ins.value), ins.dtype) and \
                    NativeCalls.pointer_cell(NativeCalls.cell(self._fixed_value(ins.addr), ins.dtype)) is not None:
                continue  # stored at a constant address through a c_void_p cell (_cell): None stores 0
            if type(ins) is not Call or ins.fn != "objc_msgSend":
                raw -= set(ins.reads())
        return raw

    def _cell(self, dtype: DType, addr: int, value: int) -> str | None:
        """A store at a constant host address of a value that fits, as a ctypes cell's assignment (the name of
        the cell), on a native MetalBridge; None otherwise (``store`` checks it)."""
        if self.native is None or not self._fixed(addr):
            return None
        if self._fixed(value):
            ok, _ = NativeCalls.constant(dtype, self._fixed_value(value))
            if not ok or type(self._fixed_value(value)) is not int:
                return None
        elif not fits(self.bounds.get(value), dtype):
            return None
        cell = NativeCalls.cell(self._fixed_value(addr), dtype)
        if value in self.raw:  # a pointer result as ctypes returns it (None for NULL)
            cell = NativeCalls.pointer_cell(cell)
            return None if cell is None else self._const("M", cell, key=("pointer", self._fixed_value(addr)))
        return None if cell is None else self._const("M", cell, key=("cell", self._fixed_value(addr), dtype))

    def _view_store(self, dtype: DType, addr: int, value: int) -> str | None:
        """On a bridge that lends views of its plain host memory (``host_view``: a SimDevice's ``malloc`` blocks,
        where a store is only a copy), an integer store at a constant address as a ``pack_into`` on the view: the
        line, a plain int in the dtype's range packed, anything else (a value that does not fit, not an int)
        through ``store``, which converts or refuses it as before. None where the bridge lends no view (a
        buffer's contents, whose CPU writes the device checks: rule 15) or on a native bridge (``_cell``)."""
        host_view = getattr(self.bridge, "host_view", None)
        if host_view is None or self.native is not None or not self._fixed(addr) or dtype.kind == "float" \
                or dtype.fmt not in _INT_BOUNDS or type(self._fixed_value(addr)) is not int:
            return None
        target = self._fixed_value(addr)
        key = ("view", target, dtype)
        cell = self._names.get(("M", key))
        if cell is None:
            try:
                view = host_view(target, dtype.itemsize)
            except MtlirError:  # unmapped or freed: ``store`` raises it at run time, as before
                return None
            if view is None:
                return None
            cell = self._const("M", view, key=key)
        pack = self._const("W", struct.Struct("<" + dtype.fmt).pack_into, key=("pack", dtype.fmt))
        lo, hi = _INT_BOUNDS[dtype.fmt]
        v = self._ref(value)
        return (f"{pack}({cell}, 0, {v}) if type({v}) is int and {lo} <= {v} <= {hi} "
                f"else store({self._ref(addr)}, {self._const('D', dtype)}, {v})")

    def _slow(self, program: Program | None, /, **values: Any) -> tuple[Any, ...]:
        """The slow path of a keyword-bound replay: another Program named (``Executor``), a value that is not a
        plain int in bounds, or an unknown name. ``bind_variables`` raises the error naming the variable, or
        converts (e.g. numpy integers) and the run goes on."""
        values = {k: v for k, v in values.items() if v is not _MISSING}
        if program is not None and program is not self.program:
            return self._other(program).run(**values)
        vals = bind_variables(self.program, values)
        return self._replay(**dict(zip(self.program.variables, vals)))

    def _note(self, e: BaseException) -> None:
        """Add to ``e`` a note naming the instruction of the generated line it came from (none for a deferred
        device error: GPU work before, not this call)."""
        tb, pc = e.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self._filename:
                pc = self.lines.get(tb.tb_lineno)
            tb = tb.tb_next
        if pc is not None and not getattr(e, "deferred", False):
            e.add_note(f"while running instruction {format_instr(self.program, pc)} ({self.name})")

    def _run(self, program: Program | None = None, /, **values: Any) -> tuple[Any, ...]:
        """``run`` where the variables do not bind by keyword: execute the Program once through the generated
        function; same contract as the Interpreter's (``program``: see ``Executor``). Where they do, ``run`` is
        the generated function itself (set per instance at construction: one Python call less per submit)."""
        if program is not None and program is not self.program:
            return self._other(program).run(**values)
        if self._keywords:
            return self._replay(**values)
        try:
            return self._replay(*bind_variables(self.program, values))
        except Exception as e:
            self._note(e)
            raise


EXECUTORS: dict[str, type[Executor]] = {"interpreter": Interpreter, "compiled": CompiledReplay}


def make_executor(kind: str, program: Program, bridge: Bridge, registers: Sequence[Any] | None = None, *,
                  results: Sequence[int] = ()) -> Executor:
    """An executor by name: ``"interpreter"`` or ``"compiled"``; raises ``ValueError`` for another name."""
    cls = EXECUTORS.get(kind)
    if cls is None:
        raise ValueError(f"unknown executor {kind!r}: expected {' or '.join(EXECUTORS)}")
    return cls(program, bridge, registers, results=results)

