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

``end_pc`` is the index of the matching END instruction (so "past the END" is ``end_pc + 1``) and ``range_pc`` the
index of the matching RANGE; ``rend`` of the END is the RANGE's ``rend``. Loops nest; the counter of a RANGE is its
``dst``. Registers hold Python ints (integers, ids, SELs, host addresses), floats (double) and tuples (a struct by
value). Every register an instruction reads is a constant, object, selector or variable register, or written by an
earlier instruction (in program order).

Each submit runs the whole Program once. Its first instructions, up to the first ``commandBuffer`` message
(``Program.patch_end()``), are the per-submit patches of shared memory (variable values into the variables
buffer, symbolic sizes and rebound inputs on ICB commands): the runtime must not run them while an earlier submit
that reads that memory is still in flight (METAL.md §3 rule 15).

Placeholder payloads (``Program.objects``, docs/internals.md "Placeholders") that are not plain values are defined
here: ``IcbSpec`` (kind ``icb``: the command list link builds once), ``IcbCommand`` and ``Stamp`` (kind
``cbslots``: which command buffer's GPU time goes into which timestamp slot).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from mtlir.metal import DeviceSpec, Obj, Prototype

__all__ = ["Program", "Instr", "IcbSpec", "IcbCommand", "CommandList", "Stamp", "CallView", "MessageList",
           "CallList", "TableEntries"]

Instr = tuple[Any, ...]


class IcbCommand(NamedTuple):
    """One command of the ICB, as link builds it once (METAL.md §1): ``setComputePipelineState:`` with the
    pipeline placeholder named ``pipeline``; ``setKernelBuffer:offset:atIndex:`` per entry of ``bindings``
    ``(placeholder name, byte offset, buffer index)`` — the buffer parameters, then the variables buffer slot of
    each ``constant int&`` parameter; ``concurrentDispatchThreadgroups:threadsPerThreadgroup:`` with ``grid``
    (threadgroups) and ``threadgroup`` (threads), where an entry set per submit is 0 (``symbolic`` is then True:
    the Program sends this run's sizes); ``setBarrier`` when ``barrier``. ``variables`` names the variable of each
    variables-buffer binding ``(name, buffer index)``; ``rebound`` lists the buffer indices a submit binds
    (buffer variables), which link leaves unbound.

    A NamedTuple rather than a dataclass: a queue of 100,000 commands hashes its command list as plain tuples."""

    pipeline: str
    bindings: tuple[tuple[str, int, int], ...]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    barrier: bool = True
    symbolic: bool = False
    variables: tuple[tuple[str, int], ...] = ()
    rebound: tuple[int, ...] = ()


class CommandList(tuple):  # type: ignore[type-arg]
    """A tuple of ``IcbCommand`` keyed as one value by ``argkey`` (hash-consing does not descend into it: keying
    100,000 frozen dataclasses one by one costs ~34 µs per command, hashing this tuple ~0.1 µs)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"CommandList(<{len(self)} commands>)"


class _Payload(tuple):  # type: ignore[type-arg]
    """A tuple keyed as one value by ``argkey`` whose hash is computed once (tuples do not cache theirs): a node
    holding thousands of entries is rebuilt by several passes, and each build hashes its key."""

    def __hash__(self) -> int:
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is type(self) and tuple.__eq__(self, other))

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (tuple(self),))


class MessageList(_Payload):
    """The arg of an MSGS node: void Objective-C messages to the node's receiver (``src[0]``), in order, as data.
    Each entry is ``(selector, refs)``: ``refs`` are the indices in ``src`` of the arguments, one per argument of
    the selector's Metal signature (``mtlir.metal.SELECTORS``), typed as for a MSG (structs as STRUCT values)."""

    def __repr__(self) -> str:
        return f"MessageList(<{len(self)} messages>)"


class CallList(_Payload):
    """The arg of a CALLS node (an MSGS after ``abi``): void foreign calls, in order, as data. Each entry is
    ``(function, selector, Prototype, refs)``; ``refs`` are the indices in ``src`` of every argument of the
    prototype (for ``objc_msgSend``: the receiver ``0``, the SEL, then the arguments as the target passes them)."""

    def __repr__(self) -> str:
        return f"CallList(<{len(self)} calls>)"


class TableEntries(_Payload):
    """The payload of a ``table`` placeholder (docs/internals.md): one entry per iteration of a profiled loop, an
    int or a placeholder (``Obj``); keyed as one value, so a table of 100,000 placeholders hashes once."""

    def __repr__(self) -> str:
        return f"TableEntries(<{len(self)} entries>)"


@dataclass(frozen=True)
class IcbSpec:
    """The payload of the ICB placeholder: ``commands`` (a ``CommandList`` of ``IcbCommand``, in ICB order),
    ``pipelines`` and ``buffers`` (the placeholders the commands name, each once, in first-use order, so link
    finds every object it must make), ``max_bind_count`` (``setMaxKernelBufferBindCount:``: the largest buffer
    index bound + 1, at most 31)."""

    commands: CommandList
    pipelines: tuple[Obj, ...]
    buffers: tuple[Obj, ...]
    max_bind_count: int

    def __repr__(self) -> str:
        return f"IcbSpec({len(self.commands)} commands, {len(self.pipelines)} pipelines, {len(self.buffers)} buffers)"


class Stamp(NamedTuple):
    """A timestamp slot of a profiled submit: slot ``slot`` gets ``which`` (``"GPUStartTime"`` or
    ``"GPUEndTime"``, seconds) of the command buffer in ``cbslots[cb]``."""

    slot: int
    cb: int
    which: str


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

    ``instrs``: the instructions (module docstring). ``nregs``: registers used. ``consts``: register -> value,
    filled once before any run. ``objects``: register -> placeholder (``mtlir.metal.Obj``), filled by ``link``.
    ``selectors``: register -> selector name, filled by ``link`` with ``sel_registerName``. ``variables``: run-time
    value name -> (register, min, max), given to ``Interpreter.run(program, **values)``. ``target`` is the ABI
    the abi pass produced ("arm64" or "x86_64"); ``device`` the device description it was lowered for.
    ``names``: register -> a readable name for listings (``"queue"``, ``"cmdbuf"``, ``"icb[3]"``).
    ``results``: name -> register whose value after a run is a result of the Program (e.g. ``"timeline"`` of
    ``timeline_read_program``); give ``tuple(results.values())`` to the executor.
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

    # ---- reading it back

    def calls(self) -> list[CallView]:
        """Every CALL in program order (a loop body once, not unrolled)."""
        out = []
        for pc, ins in enumerate(self.instrs):
            if ins[0] != "CALL":
                continue
            fn, proto, args = ins[2], ins[3], tuple(ins[4:])
            if fn == "objc_msgSend":
                out.append(CallView(pc, fn, self.selectors.get(args[1]), proto, ins[1], args[0], args[2:]))
            else:
                out.append(CallView(pc, fn, None, proto, ins[1], -1, args))
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
        op, dst = ins[0], ins[1]
        o = self.operand
        lhs = f"{o(dst)} = " if dst >= 0 else ""
        if op == "CALL":
            fn, args = ins[2], ins[4:]
            if fn == "objc_msgSend":
                sel = self.selectors.get(args[1], "?")
                rest = ", ".join(o(a) for a in args[2:])
                return f"{lhs}[{o(args[0])} {sel}{' ' + rest if rest else ''}]"
            return f"{lhs}{fn}({', '.join(o(a) for a in args)})"
        if op == "ALU":
            return f"{lhs}{ins[2].name.lower()}.{ins[3].name} {', '.join(o(a) for a in ins[4:])}"
        if op in ("CAST", "BITCAST"):
            return f"{lhs}{op.lower()}.{ins[2].name} {o(ins[3])}"
        if op == "INDEX":
            return f"{lhs}{o(ins[3])} + {o(ins[4])} * {ins[2]}"
        if op == "LOAD":
            return f"{lhs}load.{ins[2].name} [{o(ins[3])}]"
        if op == "STORE":
            return f"store.{ins[2].name} [{o(ins[3])}] = {o(ins[4])}"
        if op == "STRUCT":
            return f"{lhs}struct {{{', '.join(o(a) for a in ins[2:])}}}"
        if op == "GEP":
            return f"{lhs}{o(ins[3])}.{ins[2]}"
        if op == "RANGE":
            return f"for {o(dst)} in 0 ..< {o(ins[2])}:"
        if op == "END":
            return f"end {o(ins[2])}"
        return f"{lhs}{op} {', '.join(map(str, ins[2:]))}"

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
            if ins[0] == "END":
                depth -= 1
            lines.append(f"{pc:5d}  {'  ' * depth}{self.format(pc)}")
            if ins[0] == "RANGE":
                depth += 1
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.listing()


def _register_arg_types() -> None:
    """Make the payload types printable by ``mtlir.ir.render`` (its hook takes frozen dataclasses; the tuple types
    register once it accepts them)."""
    try:
        from mtlir.ir.render import register_arg_type
    except ImportError:
        return
    for cls in (IcbSpec, IcbCommand, CommandList, Stamp, MessageList, CallList, TableEntries):
        try:
            register_arg_type(cls)
        except (TypeError, ValueError):
            pass


_register_arg_types()
