"""``linearize``: the graph becomes a ``Program`` (mtlir.program): a straight-line list of instructions.

Order: a topological order of the graph in which every node that depends on a RANGE sits between that RANGE and
its END, and nothing else does (a loop-invariant node is never repeated): nodes are scheduled scope by scope, a
loop opens only when nothing of the enclosing scope is ready, and its END closes it when its body is done.
Ties go to the earlier node of ``toposort()``, so the order is deterministic and follows the order sources were
written in (the AFTER chains of encode).

Values: CONSTs go to the constant pool (a constant STRUCT as a tuple), CONSTs of dtype SEL to ``selectors``,
OBJECTs to ``objects``, DEFINE_VARs to ``variables``; AFTER and SINK emit nothing (an AFTER is its first
source's register). Every other node is one instruction from the table ``EMIT`` (op -> emitter; this pass turns a
graph into a list, not into a graph, so its table yields instructions rather than rewritten nodes). The root
SINK's non-void sources are the Program's ``results``, named by their tag (else ``result<i>``).

Before / after::

    SINK(CALL 'commit' (AFTER(CALL 'commandBuffer' (OBJECT queue, SEL), ...), SEL))
        r2 = [queue commandBuffer]
        ...
        [r2 commit]
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from mtlir.ir.dtypes import PtrDType, dtypes
from mtlir.errors import LoweringError
from mtlir.metal import DeviceSpec
from mtlir.ir.ops import GroupOp, Ops
from mtlir.passes.pipeline import Pass, PassContext, register
from mtlir.program.instructions import (Alu, Bitcast, Call, Cast, End, Gep, Index, Instr, Load, Range, Store,
                                        Struct)
from mtlir.program.program import Program
from mtlir.ir.uop import UOp

__all__ = ["Linearize", "LinearizeError", "linearize", "schedule"]

# readable names of the registers some messages return (listings; names repeat with a number)
_RESULT_NAMES = {"commandBuffer": "cmdbuf", "computeCommandEncoder": "encoder", "blitCommandEncoder": "blit",
                 "signaledValue": "value", "indirectComputeCommandAtIndex:": "icbcmd", "contents": "contents"}


class LinearizeError(LoweringError):
    """A graph linearize cannot turn into a Program (an op left for an earlier pass, loops that do not nest, a
    variable declared twice with different bounds); the message names the node."""


def _scopes(order: list[UOp]) -> dict[UOp, tuple[UOp, ...]]:
    """For each node, the RANGEs it is inside (outermost first): the union of its sources' scopes, plus itself for
    a RANGE, minus the closed one for an END. Raises ``LinearizeError`` for loops that do not nest."""
    scope: dict[UOp, tuple[UOp, ...]] = {}
    for u in order:
        if not u.src:
            scope[u] = ()
            continue
        best: tuple[UOp, ...] = ()
        for s in u.src:
            ss = scope[s]
            longer, shorter = (ss, best) if len(ss) > len(best) else (best, ss)
            if longer[:len(shorter)] != shorter:
                raise LinearizeError(f"{u.op.name} uses values of two loops that do not nest")
            best = longer
        if u.op is Ops.RANGE:
            best = (*best, u)
        elif u.op is Ops.END:
            if not best or best[-1] is not u.src[0]:
                raise LinearizeError("an END closes a RANGE while a loop inside it is still open")
            best = best[:-1]
        scope[u] = best
    return scope


def schedule(root: UOp) -> list[UOp]:
    """Every node of ``root`` in execution order (module docstring). Raises ``LinearizeError`` when the loops
    cannot be scheduled (a loop body needing a value computed after an enclosing END, two ENDs of one RANGE)."""
    order = root.toposort()
    if not any(u.op is Ops.RANGE for u in order):
        return order
    index = {u: i for i, u in enumerate(order)}
    scope = _scopes(order)
    users: dict[UOp, list[UOp]] = {u: [] for u in order}
    missing: dict[UOp, int] = {}
    for u in order:
        srcs = set(u.src)
        missing[u] = len(srcs)
        for s in srcs:
            users[s].append(u)
    ready: dict[tuple[UOp, ...], list[tuple[int, UOp]]] = {}
    ready_loops: dict[tuple[UOp, ...], list[tuple[int, UOp]]] = {}

    def push(u: UOp) -> None:
        sc = scope[u]
        if u.op is Ops.RANGE:
            heapq.heappush(ready_loops.setdefault(sc[:-1], []), (index[u], u))
        else:
            heapq.heappush(ready.setdefault(sc, []), (index[u], u))

    for u in order:
        if missing[u] == 0:
            push(u)
    out: list[UOp] = []
    stack: list[UOp] = []

    def emit(u: UOp) -> None:
        out.append(u)
        for v in users[u]:
            missing[v] -= 1
            if missing[v] == 0:
                push(v)

    while True:
        key = tuple(stack)
        if h := ready.get(key):
            emit(heapq.heappop(h)[1])
        elif h := ready_loops.get(key):
            r = heapq.heappop(h)[1]
            stack.append(r)
            emit(r)
        elif stack:
            outer = ready.get(key[:-1])
            if not outer or outer[0][1].op is not Ops.END or outer[0][1].src[0] is not stack[-1]:
                raise LinearizeError("a loop body cannot finish: it needs a value computed after its END")
            emit(heapq.heappop(outer)[1])
            stack.pop()
        else:
            break
    if len(out) != len(order):
        raise LinearizeError(f"{len(order) - len(out)} nodes could not be scheduled (a cycle through AFTER?)")
    return out


@dataclass
class _Builder:
    device: DeviceSpec
    target: str
    instrs: list[Instr] = field(default_factory=list)
    reg: dict[UOp, int] = field(default_factory=dict)
    nregs: int = 0
    program: Program | None = None
    name_counts: dict[str, int] = field(default_factory=dict)
    open_ranges: dict[UOp, int] = field(default_factory=dict)

    def new(self, u: UOp) -> int:
        r = self.reg[u] = self.nregs
        self.nregs += 1
        return r

    def name(self, r: int, base: str) -> None:
        assert self.program is not None
        n = self.name_counts.get(base, 0) + 1
        self.name_counts[base] = n
        self.program.names[r] = base if n == 1 else f"{base}{n}"

    def r(self, u: UOp) -> int:
        return self.reg[u]


def _emit_const(b: _Builder, u: UOp) -> None:
    p = b.program
    assert p is not None
    r = b.new(u)
    if u.dtype is dtypes.SEL:
        p.selectors[r] = u.arg
    else:
        p.consts[r] = u.arg


def _emit_object(b: _Builder, u: UOp) -> None:
    assert b.program is not None
    r = b.new(u)
    b.program.objects[r] = u.arg
    b.program.names[r] = u.arg.name


def _emit_var(b: _Builder, u: UOp) -> None:
    assert b.program is not None
    name, lo, hi = u.arg
    if name in b.program.variables:
        prev = next(v for v in b.reg if v.op is Ops.DEFINE_VAR and v.arg[0] == name)  # the error path only
        raise LinearizeError(f"variable {name!r} is declared twice: {_var_text(prev)} and {_var_text(u)} (one name "
                             "is one run-time value: one DEFINE_VAR node for it)")
    r = b.new(u)
    b.program.variables[name] = (r, lo, hi)
    b.program.names[r] = name


def _var_text(v: UOp) -> str:
    return f"{v.dtype.name} in [{v.arg[1]}, {v.arg[2]}]"


def _emit_alias(b: _Builder, u: UOp) -> None:
    b.reg[u] = b.reg[u.src[0]]


def _emit_nothing(b: _Builder, u: UOp) -> None:
    return None


def _emit_alu(b: _Builder, u: UOp) -> None:
    srcs = tuple([b.r(s) for s in u.src])
    b.instrs.append(Alu(b.new(u), u.op, u.dtype, srcs))


def _emit_cast(b: _Builder, u: UOp) -> None:
    src = b.r(u.src[0])
    b.instrs.append((Cast if u.op is Ops.CAST else Bitcast)(b.new(u), u.dtype, src))


def _emit_index(b: _Builder, u: UOp) -> None:
    base = u.src[0].dtype
    size = base.base.itemsize if isinstance(base, PtrDType) else 1
    rb, ri = b.r(u.src[0]), b.r(u.src[1])
    b.instrs.append(Index(b.new(u), max(size, 1), rb, ri))


def _emit_load(b: _Builder, u: UOp) -> None:
    ra = b.r(u.src[0])
    b.instrs.append(Load(b.new(u), u.dtype, ra))


def _emit_store(b: _Builder, u: UOp) -> None:
    ptr = u.src[0].dtype
    dtype = ptr.base if isinstance(ptr, PtrDType) and ptr.base is not dtypes.void else u.src[1].dtype
    b.instrs.append(Store(dtype, b.r(u.src[0]), b.r(u.src[1])))


def _emit_struct(b: _Builder, u: UOp) -> None:
    assert b.program is not None
    if all(s.op is Ops.CONST for s in u.src):
        b.program.consts[b.new(u)] = tuple(int(s.arg) for s in u.src)
        return
    fields = tuple([b.r(s) for s in u.src])
    b.instrs.append(Struct(b.new(u), fields))


def _emit_gep(b: _Builder, u: UOp) -> None:
    src = b.r(u.src[0])
    b.instrs.append(Gep(b.new(u), u.arg, src))


def _emit_call(b: _Builder, u: UOp) -> None:
    fn, selector, proto = u.arg
    args = tuple([b.r(s) for s in u.src])
    dst = b.new(u) if u.dtype is not dtypes.void else -1
    b.instrs.append(Call(dst, fn, proto, args))
    if dst >= 0:
        if selector == "retain" and args[0] in (b.program.names if b.program else {}):
            assert b.program is not None
            b.program.names[dst] = b.program.names[args[0]]
        elif selector in _RESULT_NAMES:
            b.name(dst, _RESULT_NAMES[selector])


def _emit_calls(b: _Builder, u: UOp) -> None:
    """One void CALL per entry of the CallList. abi shares the entry object of a repeated call, so a repeated entry
    is one record (instructions are immutable): on the direct path most messages repeat (a pipeline, a grid), and
    building each record once keeps linearize at the cost of the distinct calls."""
    regs = [b.reg[s] for s in u.src]
    made: dict[int, Call] = {}  # id of a CallList entry (alive in u.arg) -> its instruction
    out: list[Instr] = []
    for entry in u.arg:
        ins = made.get(id(entry))
        if ins is None:
            fn, _, proto, refs = entry
            ins = made[id(entry)] = Call(-1, fn, proto, tuple([regs[i] for i in refs]))
        out.append(ins)
    b.instrs += out


def _emit_range(b: _Builder, u: UOp) -> None:
    bound = b.r(u.src[0])
    dst = b.new(u)
    b.name(dst, "i")
    b.open_ranges[u] = len(b.instrs)
    b.instrs.append(Range(dst, bound, -1))  # end_pc: set when its END is emitted


def _emit_end(b: _Builder, u: UOp) -> None:
    rng = u.src[0]
    start = b.open_ranges.pop(rng)
    pc = len(b.instrs)
    head = b.instrs[start]
    assert type(head) is Range
    b.instrs[start] = Range(head.dst, head.bound, pc)
    b.instrs.append(End(b.r(rng), start))


# op -> what it emits (module docstring)
EMIT: dict[Ops, Callable[[_Builder, UOp], None]] = {
    Ops.CONST: _emit_const, Ops.OBJECT: _emit_object, Ops.DEFINE_VAR: _emit_var,
    Ops.AFTER: _emit_alias, Ops.SINK: _emit_nothing, Ops.NOOP: _emit_nothing,
    **{op: _emit_alu for op in GroupOp.ALU},
    Ops.CAST: _emit_cast, Ops.BITCAST: _emit_cast, Ops.INDEX: _emit_index, Ops.LOAD: _emit_load,
    Ops.STORE: _emit_store, Ops.STRUCT: _emit_struct, Ops.GEP: _emit_gep, Ops.CALL: _emit_call,
    Ops.CALLS: _emit_calls,
    Ops.RANGE: _emit_range, Ops.END: _emit_end,
}


def linearize(root: UOp, target: str = "") -> Program:
    """The Program of ``root`` (a SINK whose arg is the DeviceSpec; after ``abi``). ``target``: the ABI the abi
    pass used (read from the CALLs' prototypes when empty). Raises ``LinearizeError`` naming a node linearize
    cannot emit (a MSG: run abi first; a queue op: run encode first)."""
    if root.op is not Ops.SINK:
        raise LinearizeError(f"linearize takes a SINK (the graph after encode), got {root.op.name}")
    device = root.arg if isinstance(root.arg, DeviceSpec) else DeviceSpec()
    b = _Builder(device, target)
    b.program = Program([], 0, device=device, target=target or "arm64")
    for u in schedule(root):
        fn = EMIT.get(u.op)
        if fn is None:
            hint = "run abi first" if u.op in (Ops.MSG, Ops.MSGS) else "run encode first" if u.op in GroupOp.Queue | {
                Ops.SUBMIT, Ops.KERNEL, Ops.BUFFER, Ops.BUFFER_VIEW} else "no instruction does that"
            raise LinearizeError(f"linearize cannot emit {u.op.name}<{u.dtype.name}> {str(u.arg)[:60]}: {hint}")
        fn(b, u)
    p = b.program
    p.instrs, p.nregs = b.instrs, b.nregs
    for i, s in enumerate(root.src):
        if s.dtype is not dtypes.void:
            p.results[s.tag if isinstance(s.tag, str) else f"result{i}"] = b.r(s)
    return p


def _target_of(root: UOp) -> str:
    """The ABI the abi pass used, read from the prototypes: an MTLSize by value means x86_64."""
    for u in root.toposort():
        if u.op is Ops.CALL and any(a is dtypes.MTLSize for a in u.arg[2].args):
            return "x86_64"
        if u.op is Ops.CALL and any(isinstance(a, PtrDType) and a.base is dtypes.MTLSize for a in u.arg[2].args):
            return "arm64"
    return ""


@register
@dataclass(frozen=True)
class Linearize(Pass):
    """Graph -> Program (module docstring). ``Program.target`` is the target of the abi pass that ran before it
    in the pipeline (else read from the prototypes; arm64 when nothing says)."""

    name = "linearize"
    takes = ("calls",)
    produces = "program"

    def apply(self, graph: UOp, ctx: PassContext) -> Program:
        """The Program of ``graph`` for the abi pass's target. Raises ``LinearizeError`` naming the node."""
        return linearize(graph, ctx.target or _target_of(graph))

    def verify(self, result: UOp | Program) -> None:
        """The Program against the instruction set (``verify_program``). Raises ``VerifyError``."""
        from mtlir.passes.verify import verify_program
        if not isinstance(result, Program):
            raise LinearizeError(f"linearize produced a {type(result).__name__}, not a Program")
        verify_program(result, self.name)
