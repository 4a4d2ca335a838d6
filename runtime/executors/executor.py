"""What every executor of a Program shares: the ``Executor`` interface, the register file, the checks, the
variables' binding and the arithmetic.

Every executor runs the instruction set of ``mtlir.program.instructions`` exactly, through a Bridge, on a register
file prepared once (``prepare_registers``: constants, selectors resolved with ``sel_registerName``, device objects
from ``link``). A run binds the Program's variables by name (``bind_variables``) and touches only the registers
instructions write. The executors: ``Interpreter`` (``mtlir.runtime.executors.interpreter``), the reference for the
semantics, and ``CompiledReplay`` (``mtlir.runtime.executors.replay``), one generated Python function per Program.

Arithmetic has C semantics: integers wrap to the dtype (two's complement), division truncates toward zero, a
float32 result is rounded to float32 (``mtlir.ir.evaluate`` gives ``c_idiv``, ``c_mod``, ``wrap``): ``alu_fn``,
``cast_fn``, ``bitcast_fn``, ``float_rounder``.
"""
from __future__ import annotations

import difflib
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from mtlir.ir.dtypes import DType
from mtlir.ir.dtypes import wrap
from mtlir.ir.evaluate import ALU_FUNCS
from mtlir.ir.ops import GroupOp, Ops
from mtlir.program.instructions import (INSTRUCTIONS, Alu, Bitcast, Call, Cast, End, Gep, Index, Load, Range, Store,
                                        Struct)
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.errors import ArgumentError, LinkError, MtlirError

__all__ = ["Executor", "prepare_registers", "ProgramError", "format_instr", "alu_fn", "cast_fn", "bitcast_fn",
           "float_rounder", "check_program", "bind_variables", "range_at"]


class ProgramError(MtlirError, ValueError):
    """A Program that breaks the instruction set's rules (unknown opcode, a register out of range or read before
    anything defines it, unmatched RANGE/END, an op the dtype does not have); the message names the instruction."""


_FLOAT_FMT = {2: "e", 4: "f", 8: "d"}
_UINT_FMT = {1: "B", 2: "H", 4: "I", 8: "Q"}


def float_rounder(dtype: DType) -> Callable[[Any], Any]:
    """float(x) rounded to ``dtype`` (float16/float32 round through their bytes; float64 is Python's float)."""
    if dtype.itemsize == 8:
        return float
    st = struct.Struct("<" + dtype.fmt)

    def rnd(x: Any) -> float:
        x = float(x)
        try:
            return float(st.unpack(st.pack(x))[0])
        except OverflowError:  # out of the float's range: inf with the sign, as a C conversion gives
            return math.copysign(math.inf, x)
    return rnd


def cast_fn(dtype: DType) -> Callable[[Any], Any]:
    """The C conversion to ``dtype``: floats round, integers wrap, float -> int truncates toward zero."""
    if dtype.kind == "bool":
        return bool
    if dtype.is_float:
        return float_rounder(dtype)
    if dtype.is_word:
        def to_int(x: Any) -> Any:
            if isinstance(x, float):
                if not math.isfinite(x):
                    raise ValueError(f"cannot convert {x} to {dtype.name}")
                x = int(x)  # truncates toward zero, as C
            return wrap(dtype, int(x))
        return to_int
    raise ProgramError(f"no conversion to {dtype.name}")


def bitcast_fn(dtype: DType) -> Callable[[Any], Any]:
    """Reinterpret the bits as ``dtype``: ints and pointers keep their bits; int <-> float of the same size go
    through their bytes (the source's size is taken to be the target's)."""
    size = dtype.itemsize
    if size not in _UINT_FMT:
        raise ProgramError(f"no bitcast to {dtype.name}")
    u = struct.Struct("<" + _UINT_FMT[size])
    if dtype.is_float:
        f = struct.Struct("<" + _FLOAT_FMT[size])

        def to_float(x: Any) -> float:
            return float(x) if isinstance(x, float) else f.unpack(u.pack(int(x) & ((1 << (8 * size)) - 1)))[0]
        return to_float
    ff = struct.Struct("<" + _FLOAT_FMT[size]) if size in _FLOAT_FMT else None

    def to_word(x: Any) -> Any:
        if isinstance(x, float):
            if ff is None:
                raise ValueError(f"cannot bitcast a float to the {size}-byte {dtype.name}")
            x = u.unpack(ff.pack(x))[0]
        return wrap(dtype, int(x))
    return to_word


def alu_fn(op: Ops, dtype: DType) -> Callable[..., Any]:
    """``op`` with C semantics, its result wrapped (integers) or rounded (floats) to ``dtype``."""
    fn = ALU_FUNCS.get(op)
    if fn is None:
        raise ProgramError(f"{op!r} is not an ALU op")
    if op in GroupOp.Comparison:
        return fn
    if dtype.is_float:
        if op in (Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR, Ops.AND, Ops.OR, Ops.XOR):
            raise ProgramError(f"{op!r} on {dtype.name}")
        rnd = float_rounder(dtype)
        return lambda *a: rnd(fn(*a))
    if not (dtype.is_word or dtype.kind == "bool"):
        raise ProgramError(f"{op!r} on {dtype.name}")
    return lambda *a: wrap(dtype, fn(*a))


def prepare_registers(program: Program, bridge: Bridge, objects: Mapping[int, Any] | None = None) -> list[Any]:
    """The register file before any run: ``program.consts``, the selectors resolved through
    ``bridge.sel_registerName`` (once per name), and ``objects`` (register -> handle or host address, from
    ``link``). Raises ``LinkError`` when a placeholder register has no object (the Program needs ``link``)."""
    regs: list[Any] = [None] * program.nregs
    for r, v in program.consts.items():
        regs[r] = v
    sels: dict[str, int] = {}
    for r, name in program.selectors.items():
        if name not in sels:
            sels[name] = bridge.sel_registerName(name)
        regs[r] = sels[name]
    objects = objects or {}
    for r, obj in program.objects.items():
        if r not in objects:
            raise LinkError(f"register r{r} holds the placeholder {obj!r} but no object was linked to it: "
                            "link the Program first (mtlir.runtime.link.link)")
        regs[r] = objects[r]
    return regs


def format_instr(program: Program, pc: int) -> str:
    """Instruction ``pc`` as one line of text (for error messages): ``pc: rD = OPCODE operands`` with the operands
    in field order, registers as ``rN`` (``rN(selector)`` for a selector register), jump targets as ``@pc``,
    other fields by ``repr`` (an ALU op by name). An object that is not an instruction record prints by ``repr``."""
    ins = program.instrs[pc]
    if type(ins) not in INSTRUCTIONS:
        return f"{pc}: {ins!r}"

    def reg(r: object) -> str:
        name = program.selectors.get(r) if isinstance(r, int) else None
        return f"r{r}" if name is None else f"r{r}({name})"

    parts: list[str]
    match ins:
        case Alu(op=op, dtype=dtype, srcs=srcs):
            parts = [op.name if isinstance(op, Ops) else repr(op), repr(dtype), *map(reg, srcs)]
        case Cast(dtype=dtype, src=src) | Bitcast(dtype=dtype, src=src) | Load(dtype=dtype, addr=src):
            parts = [repr(dtype), reg(src)]
        case Index(itemsize=itemsize, base=base, index=index):
            parts = [repr(itemsize), reg(base), reg(index)]
        case Store(dtype=dtype, addr=addr, value=value):
            parts = [repr(dtype), reg(addr), reg(value)]
        case Struct(fields=fields):
            parts = [*map(reg, fields)]
        case Gep(field=field, src=src):
            parts = [repr(field), reg(src)]
        case Call(fn=fn, proto=proto, args=args):
            parts = [repr(fn), repr(proto), *map(reg, args)]
        case Range(bound=r, end_pc=target) | End(counter=r, range_pc=target):
            parts = [reg(r), f"@{target}"]
    dst = f"r{ins.dst} = " if isinstance(ins.dst, int) and ins.dst >= 0 else ""
    return f"{pc}: {dst}{ins.opcode} {', '.join(parts)}"


def range_at(program: Program, pc: int) -> Range:
    """The ``Range`` at ``pc`` (an ``End``'s ``range_pc``, checked by ``check_program``)."""
    head = program.instrs[pc]
    if type(head) is not Range:
        raise ProgramError(f"instruction {format_instr(program, pc)} is not a RANGE")
    return head


def check_program(program: Program, static: set[int]) -> dict[int, int]:
    """Validate ``program``; returns RANGE pc -> END pc. ``static``: registers holding values before the run."""
    defined = set(static) | {r for r, _, _ in program.variables.values()}
    loops: dict[int, int] = {}
    stack: list[int] = []
    n = program.nregs
    for pc, ins in enumerate(program.instrs):
        where = f"instruction {format_instr(program, pc)}"
        if type(ins) not in INSTRUCTIONS:
            raise ProgramError(f"{where}: not an instruction (a record of mtlir.program.instructions)")
        for r in ins.reads():
            if not isinstance(r, int) or not 0 <= r < n:
                raise ProgramError(f"{where}: operand {r!r} is not a register (0 <= r < nregs = {n})")
            if r not in defined:
                raise ProgramError(f"{where}: reads r{r}, which no constant, object, selector, variable or earlier "
                                   "instruction defines")
        dst = ins.dst
        if dst != -1 and (not isinstance(dst, int) or not 0 <= dst < n):
            raise ProgramError(f"{where}: destination {dst!r} is not a register")
        if dst in static:
            raise ProgramError(f"{where}: writes r{dst}, which holds a constant, object or selector")
        if dst >= 0:
            defined.add(dst)
        match ins:
            case Range():
                if dst < 0:
                    raise ProgramError(f"{where}: RANGE needs a counter register")
                stack.append(pc)
            case End(counter=counter, range_pc=range_pc):
                if not stack or range_pc != stack[-1]:
                    raise ProgramError(f"{where}: END does not close the innermost open RANGE")
                head = range_at(program, stack.pop())
                if head.end_pc != pc or head.dst != counter:
                    raise ProgramError(f"{where}: RANGE at {range_pc} names end {head.end_pc} and counter "
                                       f"r{head.dst}, not this END")
                loops[range_pc] = pc
            case Call(fn=fn) if not isinstance(fn, str):
                raise ProgramError(f"{where}: CALL needs a function name")
    if stack:
        raise ProgramError(f"instruction {format_instr(program, stack[-1])}: RANGE without END")
    return loops


def bind_variables(program: Program, values: Mapping[str, Any]) -> list[int]:
    """The variables' values in ``program.variables`` order; raises ``ArgumentError`` (a ``ValueError``) naming an
    unknown variable (with the closest known name), a missing or an out-of-bounds one (with its bounds), and
    ``TypeError`` for a value that is not an integer."""
    unknown = sorted(set(values) - set(program.variables))
    if unknown:
        close = [m for u in unknown for m in difflib.get_close_matches(u, program.variables, n=1, cutoff=0.0)
                 if u.lower() == m.lower() or difflib.SequenceMatcher(None, u, m).ratio() >= 0.6]
        hint = f" (did you mean {', '.join(map(repr, dict.fromkeys(close)))}?)" if close else ""
        raise ArgumentError(f"unknown variable(s) {', '.join(map(repr, unknown))}: the Program has "
                            f"{', '.join(map(repr, program.variables)) or 'no variables'}{hint}")
    out: list[int] = []
    for name, (_, lo, hi) in program.variables.items():
        if name not in values:
            raise ArgumentError(f"variable {name!r} has no value (bounds [{lo}, {hi}])")
        v = values[name]
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"variable {name!r} = {v!r} is not an integer (bounds [{lo}, {hi}])")
        v = int(v)
        if not lo <= v <= hi:
            raise ArgumentError(f"variable {name!r} = {v} is outside its bounds [{lo}, {hi}]")
        out.append(v)
    return out


class Executor:
    """Runs one Program through one Bridge on a prepared register file (``prepare_registers``; by default made
    here, which works only for a Program without placeholders). ``run(**values)`` binds the variables by name
    and executes the Program once; it returns the values of the ``results`` registers after the run (a tuple).
    ``run(program, **values)`` is the same call with the Program named (docs/runtime.md): for the executor's own
    Program it is ``run(**values)``; another Program gets an executor of the same kind on the same Bridge, made
    once and kept, whose results are ``program.results`` (its registers come from ``prepare_registers``, so it
    must hold no placeholder; one that does raises ``LinkError``: link it, then build its executor on
    ``Linked.registers_for(program)``).

    Raises ``ProgramError`` at construction for an ill-formed Program; ``ValueError``/``TypeError`` from
    ``run`` for a missing, unknown or out-of-bounds variable; whatever the Bridge raises, with a note naming the
    instruction that was running."""

    name: ClassVar[str] = ""
    run: Callable[..., tuple[Any, ...]]
    """``run(program=None, /, **values)``: run the Program once with ``values`` (variables by name); the
    ``results`` registers after the run. ``program``, when given, names the Program to run (above). An attribute
    of each executor, not a method of its class: ``_run`` by default, a function of its own where the executor
    has one (a class method of the same name would make every ``executor.run`` an unspecialized attribute read:
    about 35 ns per call on CPython 3.11)."""

    def __init__(self, program: Program, bridge: Bridge, registers: Sequence[Any] | None = None, *,
                 results: Sequence[int] = ()) -> None:
        self.run = self._run
        self.program = program
        self.bridge = bridge
        self.registers: list[Any] = (list(registers) if registers is not None
                                     else prepare_registers(program, bridge))
        if len(self.registers) != program.nregs:
            raise ProgramError(f"register file of {len(self.registers)} registers for a Program of {program.nregs}")
        self.static = set(program.consts) | set(program.selectors) | set(program.objects)
        self.loops = check_program(program, self.static)
        self.results = tuple(results)
        for r in self.results:
            if not 0 <= r < program.nregs:
                raise ProgramError(f"result register r{r} is out of range (nregs = {program.nregs})")

    def _run(self, program: Program | None = None, /, **values: Any) -> tuple[Any, ...]:
        """``run`` by default: the executor kind's own (this one only raises ``NotImplementedError``)."""
        raise NotImplementedError

    def _other(self, program: Program) -> Executor:
        """The executor of this kind for another Program on this Bridge, made at first use and kept (at most
        ``_OTHERS`` of them, the oldest dropped first)."""
        others = self.__dict__.setdefault("_others", {})
        key = id(program)
        got = others.get(key)
        if got is None or got.program is not program:
            if len(others) >= _OTHERS:
                others.pop(next(iter(others)))
            got = others[key] = type(self)(program, self.bridge, results=tuple(program.results.values()))
        return got  # type: ignore[no-any-return]


_OTHERS = 8  # executors kept for run(program, ...) of another Program
