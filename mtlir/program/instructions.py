"""The instruction set of a ``Program``: one typed record per opcode.

A Program is a straight-line list of these records over numbered registers (``mtlir.program.program``). Every
field named ``dst``, ``src``, ``addr``, ``value``, ``base``, ``index``, ``bound``, ``counter``, or a tuple
``srcs``, ``fields``, ``args``, holds register numbers; ``dst`` is -1 when there is no result (``Store`` and
``End`` never have one).

| record | fields | meaning |
|---|---|---|
| ``Alu`` | ``dst, op: Ops, dtype: DType, srcs`` | ``dst = op(*srcs)`` with C semantics, wrapped to ``dtype`` |
| ``Cast`` | ``dst, dtype, src`` | ``dst = convert(src)`` |
| ``Bitcast`` | ``dst, dtype, src`` | ``dst = reinterpret(src)`` (ints and pointers: the same bits) |
| ``Index`` | ``dst, itemsize: int, base, index`` | ``dst = base + index * itemsize`` (a host address) |
| ``Load`` | ``dst, dtype, addr`` | ``dst = *(dtype*)addr`` through the Bridge |
| ``Store`` | ``dtype, addr, value`` | ``*(dtype*)addr = value`` through the Bridge |
| ``Struct`` | ``dst, fields`` | ``dst = (f0, f1, ...)`` (a struct value, e.g. MTLSize by value on x86_64) |
| ``Gep`` | ``dst, field: int, src`` | ``dst = src[field]`` |
| ``Call`` | ``dst, fn: str, proto: Prototype, args`` | a foreign call; for ``objc_msgSend`` ``args`` start with the
  receiver and the SEL register (its selector is ``Program.selectors`` of that register) |
| ``Range`` | ``dst, bound, end_pc: int`` | ``dst = 0``; if ``0 >= bound`` jump past the matching END |
| ``End`` | ``counter, range_pc: int`` | ``counter += 1``; jump back to ``range_pc + 1`` while ``counter < bound`` |

``end_pc`` is the index of the matching ``End`` (so "past the END" is ``end_pc + 1``) and ``range_pc`` the index
of the matching ``Range``; the ``counter`` of an ``End`` is its ``Range``'s ``dst`` and the loop's bound is that
``Range``'s ``bound``. Loops nest. Registers hold Python ints (integers, ids, SELs, host addresses), floats (double)
and tuples (a struct by value). Every register an instruction reads is a constant, object, selector or variable
register, or written by an earlier instruction (in program order).

Records are frozen slotted dataclasses: built once by ``linearize``, read by field (or ``match``) by the executors,
``verify`` and ``link``; two records are equal only when they are the same opcode with equal fields. ``opcode`` is
the name listings and error messages print; ``reads()`` gives the registers an instruction reads, in field order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mtlir.ir.dtypes import DType
from mtlir.ir.ops import Ops
from mtlir.metal import Prototype

__all__ = ["Alu", "Cast", "Bitcast", "Index", "Load", "Store", "Struct", "Gep", "Call", "Range", "End", "Instr",
           "INSTRUCTIONS"]


@dataclass(frozen=True, slots=True)
class Alu:
    """``dst = op(*srcs)`` with C semantics, the result wrapped (integers) or rounded (floats) to ``dtype``."""

    opcode: ClassVar[str] = "ALU"
    dst: int
    op: Ops
    dtype: DType
    srcs: tuple[int, ...]

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``srcs``."""
        return self.srcs


@dataclass(frozen=True, slots=True)
class Cast:
    """``dst = convert(src)`` to ``dtype`` (C conversion: floats round, integers wrap, float -> int truncates)."""

    opcode: ClassVar[str] = "CAST"
    dst: int
    dtype: DType
    src: int

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``(src,)``."""
        return (self.src,)


@dataclass(frozen=True, slots=True)
class Bitcast:
    """``dst = reinterpret(src)`` as ``dtype`` (ints and pointers keep their bits)."""

    opcode: ClassVar[str] = "BITCAST"
    dst: int
    dtype: DType
    src: int

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``(src,)``."""
        return (self.src,)


@dataclass(frozen=True, slots=True)
class Index:
    """``dst = base + index * itemsize``: a host address (``itemsize`` in bytes, a constant)."""

    opcode: ClassVar[str] = "INDEX"
    dst: int
    itemsize: int
    base: int
    index: int

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``(base, index)``."""
        return (self.base, self.index)


@dataclass(frozen=True, slots=True)
class Load:
    """``dst = *(dtype*)addr`` through the Bridge."""

    opcode: ClassVar[str] = "LOAD"
    dst: int
    dtype: DType
    addr: int

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``(addr,)``."""
        return (self.addr,)


@dataclass(frozen=True, slots=True)
class Store:
    """``*(dtype*)addr = value`` through the Bridge; no result (``dst`` is -1)."""

    opcode: ClassVar[str] = "STORE"
    dst: ClassVar[int] = -1
    dtype: DType
    addr: int
    value: int

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``(addr, value)``."""
        return (self.addr, self.value)


@dataclass(frozen=True, slots=True)
class Struct:
    """``dst = (f0, f1, ...)``: a struct value of the ``fields`` registers (an MTLSize by value on x86_64)."""

    opcode: ClassVar[str] = "STRUCT"
    dst: int
    fields: tuple[int, ...]

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``fields``."""
        return self.fields


@dataclass(frozen=True, slots=True)
class Gep:
    """``dst = src[field]``: one field of a struct value (``field`` a constant index)."""

    opcode: ClassVar[str] = "GEP"
    dst: int
    field: int
    src: int

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``(src,)``."""
        return (self.src,)


@dataclass(frozen=True, slots=True)
class Call:
    """A foreign call of the C function ``fn`` with the exact C prototype ``proto`` (after the abi pass) and the
    argument registers ``args``, one per ``proto.args``; for ``objc_msgSend`` ``args[0]`` is the receiver and
    ``args[1]`` the SEL register. ``dst`` receives the return value (-1: void)."""

    opcode: ClassVar[str] = "CALL"
    dst: int
    fn: str
    proto: Prototype
    args: tuple[int, ...]

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``args``."""
        return self.args


@dataclass(frozen=True, slots=True)
class Range:
    """The head of a loop: ``dst = 0`` (the counter); if ``0 >= bound`` jump past the matching ``End`` at
    ``end_pc``."""

    opcode: ClassVar[str] = "RANGE"
    dst: int
    bound: int
    end_pc: int

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``(bound,)``."""
        return (self.bound,)


@dataclass(frozen=True, slots=True)
class End:
    """The end of a loop: ``counter += 1``; jump back to ``range_pc + 1`` while ``counter`` is below the bound of
    the ``Range`` at ``range_pc``. No result (``dst`` is -1)."""

    opcode: ClassVar[str] = "END"
    dst: ClassVar[int] = -1
    counter: int
    range_pc: int

    def reads(self) -> tuple[int, ...]:
        """The registers read: ``(counter,)``."""
        return (self.counter,)


Instr = Alu | Cast | Bitcast | Index | Load | Store | Struct | Gep | Call | Range | End

# every instruction record (an object of another type in ``Program.instrs`` is not an instruction)
INSTRUCTIONS: tuple[type[Instr], ...] = (Alu, Cast, Bitcast, Index, Load, Store, Struct, Gep, Call, Range, End)
