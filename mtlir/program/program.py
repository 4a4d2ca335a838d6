"""Program: the product of the ``linearize`` pass and the input of the executors.

A straight-line list of instructions (``mtlir.program.instructions``: one record per opcode, the instruction set)
over numbered registers; loops as ``Range`` ... ``End``; constants in a pool; placeholders (device objects) and
selectors listed once so ``link`` resolves them once. The same Program replays many submits: only the registers of
``variables`` change between runs.

Each submit runs the whole Program once. Its first instructions, up to the first ``commandBuffer`` message
(``Program.patch_end()``), are the per-submit patches of shared memory (variable values into the variables
buffer, symbolic sizes and rebound inputs on ICB commands): the runtime must not run them while an earlier submit
that reads that memory is still in flight (METAL.md §3 rule 15).

Placeholder payloads (``Program.objects``) that are not plain values are in ``mtlir.program.payloads``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from mtlir.metal import DeviceSpec, Obj, Prototype
from mtlir.program.instructions import (Alu, Bitcast, Call, Cast, End, Gep, Index, Instr, Load, Range, Store,
                                        Struct)

__all__ = ["Program", "CallView"]


class CallView(NamedTuple):
    """One CALL instruction read back: ``pc``, the C function ``fn``, the ``selector`` (None for a C function),
    the ``proto``, the ``dst`` register (-1: none), the ``receiver`` register (-1 for a C function) and the
    argument registers after receiver and SEL."""

    pc: int
    fn: str
    selector: str | None
    proto: Prototype
    dst: int
    receiver: int
    args: tuple[int, ...]


@dataclass
class Program:
    """A linearized submit.

    ``instrs``: the instructions (records of ``mtlir.program.instructions``). ``nregs``: registers used.
    ``consts``: register -> value, filled once before any run. ``objects``: register -> placeholder
    (``mtlir.metal.Obj``), filled by ``link``. ``selectors``: register -> selector name, filled by ``link`` with
    ``sel_registerName``. ``variables``: run-time value name -> (register, min, max), given to
    ``Interpreter.run(program, **values)``. ``target`` is the ABI
    the abi pass produced ("arm64" or "x86_64"); ``device`` the device description it was lowered for.
    ``names``: register -> a readable name for listings (``"queue"``, ``"cmdbuf"``, ``"icb[3]"``).
    ``results``: name -> register whose value after a run is a result of the Program (e.g. ``"timeline"`` of
    ``timeline_read_program``); give ``tuple(results.values())`` to the executor.
    ``timeline_read``: the Program that reads the timeline's value (``signaledValue`` of the ``event``
    placeholder, ``results["timeline"]``) over this Program's placeholders, lowered with it for the same device and
    target (``mtlir.passes.lower`` fills it when the Program uses the event); None for a Program without the event
    or one written by hand.
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
    results: dict[str, int] = field(default_factory=dict)
    timeline_read: Program | None = None

    # ---- reading it back

    def calls(self) -> list[CallView]:
        """Every CALL in program order (a loop body once, not unrolled)."""
        out = []
        for pc, ins in enumerate(self.instrs):
            if type(ins) is not Call:
                continue
            fn, args = ins.fn, ins.args
            if fn == "objc_msgSend":
                out.append(CallView(pc, fn, self.selectors.get(args[1]), ins.proto, ins.dst, args[0], args[2:]))
            else:
                out.append(CallView(pc, fn, None, ins.proto, ins.dst, -1, args))
        return out

    def selector_sequence(self) -> list[str]:
        """The selectors of the objc_msgSend CALLs in program order (a loop body once)."""
        return [c.selector or c.fn for c in self.calls()]

    def patch_end(self) -> int:
        """The index of the first ``commandBuffer`` message: the instructions before it are this submit's patches
        of shared memory (module docstring); ``len(instrs)`` when there is none."""
        for c in self.calls():
            if c.selector == "commandBuffer":
                return c.pc
        return len(self.instrs)

    def operand(self, reg: int) -> str:
        """Register ``reg`` as a listing shows it: its name, a constant's value, a selector, or ``rN``."""
        if reg in self.names:
            return self.names[reg]
        if reg in self.consts:
            v = self.consts[reg]
            return "[" + ", ".join(map(str, v)) + "]" if isinstance(v, tuple) else str(v)
        if reg in self.selectors:
            return f"@selector({self.selectors[reg]})"
        if reg in self.objects:
            return self.objects[reg].name
        return f"r{reg}"

    def format(self, pc: int) -> str:
        """Instruction ``pc`` as one listing line (without indentation). Messages read
        ``r12 = [queue commandBuffer]`` and ``[encoder executeCommandsInBuffer:withRange: icb, 0, 5]``."""
        ins = self.instrs[pc]
        o = self.operand
        lhs = f"{o(ins.dst)} = " if ins.dst >= 0 else ""
        match ins:
            case Call(fn="objc_msgSend", args=args):
                sel = self.selectors.get(args[1], "?")
                rest = ", ".join(o(a) for a in args[2:])
                return f"{lhs}[{o(args[0])} {sel}{' ' + rest if rest else ''}]"
            case Call(fn=fn, args=args):
                return f"{lhs}{fn}({', '.join(o(a) for a in args)})"
            case Alu(op=op, dtype=dtype, srcs=srcs):
                return f"{lhs}{op.name.lower()}.{dtype.name} {', '.join(o(a) for a in srcs)}"
            case Cast(dtype=dtype, src=src) | Bitcast(dtype=dtype, src=src):
                return f"{lhs}{ins.opcode.lower()}.{dtype.name} {o(src)}"
            case Index(itemsize=itemsize, base=base, index=index):
                return f"{lhs}{o(base)} + {o(index)} * {itemsize}"
            case Load(dtype=dtype, addr=addr):
                return f"{lhs}load.{dtype.name} [{o(addr)}]"
            case Store(dtype=dtype, addr=addr, value=value):
                return f"store.{dtype.name} [{o(addr)}] = {o(value)}"
            case Struct(fields=fields):
                return f"{lhs}struct {{{', '.join(o(a) for a in fields)}}}"
            case Gep(field=index, src=src):
                return f"{lhs}{o(src)}.{index}"
            case Range(dst=counter, bound=bound):
                return f"for {o(counter)} in 0 ..< {o(bound)}:"
            case End(counter=counter):
                return f"end {o(counter)}"
        raise TypeError(f"instruction {pc} is a {type(ins).__name__}, not an instruction (mtlir.program.instructions)")

    def listing(self, header: bool = True) -> str:
        """The Program as text, one instruction per line (loop bodies indented); with ``header``, first the
        placeholders, variables and results as comments."""
        lines = []
        if header:
            dev = self.device
            lines.append(f"; {dev.family}, {'residency set' if dev.residency_set else 'no residency set'}, "
                         f"{'ICB' if dev.icb else 'no ICB'}, {self.target}: {len(self.instrs)} instructions, "
                         f"{self.nregs} registers")
            if self.objects:
                lines.append("; objects: " + ", ".join(o.name for o in self.objects.values()))
            for name, (r, lo, hi) in self.variables.items():
                lines.append(f"; variable {name} in [{lo}, {hi}]" + ("" if self.names.get(r) == name else f" (r{r})"))
            for name, r in self.results.items():
                lines.append(f"; result {name} = {self.operand(r)}")
        depth = 0
        for pc, ins in enumerate(self.instrs):
            if type(ins) is End:
                depth -= 1
            lines.append(f"{pc:5d}  {'  ' * depth}{self.format(pc)}")
            if type(ins) is Range:
                depth += 1
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.listing()

