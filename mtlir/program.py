"""Program: the product of the ``linearize`` pass and the input of the Interpreter.

A straight-line list of instructions over numbered registers; loops as RANGE ... END; constants in a pool;
placeholders (device objects) and selectors listed once so ``link`` resolves them once. The same Program replays
many submits: only the registers of ``variables`` change between runs.

Instruction set (each instruction is a tuple ``(opcode, dst, *operands)``; ``dst`` is -1 when there is no result;
every operand named ``r…`` is a register number):

| opcode | operands | meaning |
|---|---|---|
| ``"ALU"`` | ``op: Ops, dtype: DType, ra[, rb[, rc]]`` | ``dst = op(ra, rb, rc)`` with C semantics, wrapped to ``dtype`` |
| ``"CAST"`` | ``dtype, ra`` | ``dst = convert(ra)`` |
| ``"BITCAST"`` | ``dtype, ra`` | ``dst = reinterpret(ra)`` (ints and pointers: the same bits) |
| ``"INDEX"`` | ``itemsize: int, rbase, ridx`` | ``dst = rbase + ridx * itemsize`` (a host address) |
| ``"LOAD"`` | ``dtype, raddr`` | ``dst = *(dtype*)raddr`` through the Bridge |
| ``"STORE"`` | ``dtype, raddr, rval`` | ``*(dtype*)raddr = rval`` through the Bridge |
| ``"STRUCT"`` | ``rfield...`` | ``dst = (f0, f1, ...)`` (a struct value, e.g. MTLSize by value on x86_64) |
| ``"GEP"`` | ``i: int, rstruct`` | ``dst = rstruct[i]`` |
| ``"CALL"`` | ``fn: str, proto: Prototype, rarg...`` | a foreign call; for ``objc_msgSend`` the first two args are the
  receiver and the SEL register; ``selector`` is known from ``Program.selectors`` of that register |
| ``"RANGE"`` | ``rend, end_pc: int`` | ``dst = 0``; if ``0 >= rend`` jump past the matching END |
| ``"END"`` | ``rcounter, range_pc: int`` | ``rcounter += 1``; jump back to ``range_pc + 1`` while ``rcounter < rend`` |
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mtlir.metal import DeviceSpec, Obj

__all__ = ["Program", "Instr"]

Instr = tuple[Any, ...]


@dataclass
class Program:
    """A linearized submit.

    ``instrs``: the instructions (module docstring). ``nregs``: registers used. ``consts``: register -> value,
    filled once before any run. ``objects``: register -> placeholder (``mtlir.metal.Obj``), filled by ``link``.
    ``selectors``: register -> selector name, filled by ``link`` with ``sel_registerName``. ``variables``: run-time
    value name -> (register, min, max), given to ``Interpreter.run(program, **values)``. ``target`` is the ABI
    the abi pass produced ("arm64" or "x86_64"); ``device`` the device description it was lowered for.
    ``names``: register -> a readable name for listings (``"queue"``, ``"cmdbuf"``, ``"icb[3]"``).
    """

    instrs: list[Instr]
    nregs: int
    consts: dict[int, Any] = field(default_factory=dict)
    objects: dict[int, Obj] = field(default_factory=dict)
    selectors: dict[int, str] = field(default_factory=dict)
    variables: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    target: str = "arm64"
    device: DeviceSpec = field(default_factory=DeviceSpec)
    names: dict[int, str] = field(default_factory=dict)
