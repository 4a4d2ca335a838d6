"""``abi{target=arm64|x86_64}``: every typed MSG becomes a CALL of ``objc_msgSend`` with the selector's exact C
prototype (``mtlir.metal.abi_prototype``, one table for every selector of METAL.md §2).

How arguments travel (METAL.md §2): self and _cmd first; NSRange as two words on both targets; MTLSize (24 bytes)
on arm64 as a pointer to a copy in host memory (AAPCS64: composites over 16 bytes go by reference) — a constant
size is a link-time placeholder ``Obj("struct", "mtlsize[w,h,d]", (w, h, d))`` filled once, a run-time size a
``scratch`` placeholder written by STOREs before the call — and on x86_64 by value (System V class MEMORY: the
STRUCT node itself). Integer arguments of another width are CAST to the declared type (never an untyped 64-bit
value: ctypes without argtypes cuts integers to 32 bits).

Before / after (arm64)::

    MSG<void> 'dispatchThreadgroups:threadsPerThreadgroup:' (enc, STRUCT<MTLSize>(0, 0, 0), STRUCT<MTLSize>(0, 0, 0))
    CALL<void> ('objc_msgSend', 'dispatchThreadgroups:threadsPerThreadgroup:', void(id, SEL, MTLSize*, MTLSize*))
        (enc, CONST<SEL> 'dispatchThreadgroups:threadsPerThreadgroup:', OBJECT mtlsize[0,0,0], OBJECT mtlsize[0,0,0])
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mtlir.ir.dtypes import DType, PtrDType, dtypes
from mtlir.metal import SELECTORS, TARGETS, AbiError, Obj, Prototype, Signature, abi_prototype
from mtlir.ir.ops import Ops
from mtlir.passes.pipeline import Pass, PassContext, register
from mtlir.program.payloads import CallList
from mtlir.program.program import Program
from mtlir.ir.rewrite import graph_rewrite
from mtlir.ir.upat import PatternMatcher, UPat
from mtlir.ir.uop import UOp

__all__ = ["Abi", "sel", "lower_msg", "lower_msgs"]


def sel(selector: str) -> UOp:
    """The SEL of ``selector``: a CONST of dtype SEL whose arg is the name (linearize puts it in
    ``Program.selectors``; link resolves it once with ``sel_registerName``)."""
    return UOp(Ops.CONST, dtypes.SEL, (), selector)


@dataclass
class _AbiCtx:
    target: str
    pass_ctx: PassContext
    scratch: dict[UOp, UOp]
    protos: dict[str, tuple[Signature, Prototype, UOp]] = field(default_factory=dict)  # void selectors of MSGS
    converted: dict[tuple[UOp, DType], tuple[UOp, ...]] = field(default_factory=dict)  # MSGS operands as passed


def _fields(v: UOp, n: int) -> tuple[UOp, ...]:
    """The words of a struct value: a STRUCT's sources, else GEPs of it; each a uint64."""
    words = v.src if v.op is Ops.STRUCT else tuple(v.gep(i) for i in range(n))
    return tuple(w.cast(dtypes.uint64) for w in words)


def _mtlsize_arm64(v: UOp, ctx: _AbiCtx) -> UOp:
    """An MTLSize value as arm64 passes it: the address of a 24-byte copy."""
    words = _fields(v, 3)
    if all(w.op is Ops.CONST for w in words):
        w, h, d = (int(x.arg) for x in words)
        return UOp(Ops.OBJECT, PtrDType(dtypes.MTLSize), (), Obj("struct", f"mtlsize[{w},{h},{d}]", (w, h, d)))
    got = ctx.scratch.get(v)
    if got is None:
        n = ctx.pass_ctx.fresh("scratch")
        buf = UOp(Ops.OBJECT, dtypes.uint64.ptr(), (), Obj("scratch", f"scratch:{n}", (24,)))
        stores = tuple((buf.index(UOp.const(dtypes.int64, i)) if i else buf).store(w) for i, w in enumerate(words))
        got = ctx.scratch[v] = UOp(Ops.BITCAST, PtrDType(dtypes.MTLSize), (buf,)).after(*stores)
    return got


def _fit(selector: str, i: int, a: UOp, want: DType) -> UOp:
    """Argument ``a`` converted to the declared Metal type ``want``; raises ``AbiError`` when it cannot fit."""
    have = a.dtype
    if have is want:
        return a
    if want is dtypes.id:
        raise AbiError(f"{selector}: argument {i} must be an object (id), got a {have.name}")
    if isinstance(want, PtrDType):
        if isinstance(have, PtrDType):
            return a
        raise AbiError(f"{selector}: argument {i} must be a pointer ({want.name}), got a {have.name}")
    if want.kind == "struct":
        raise AbiError(f"{selector}: argument {i} must be an {want.name}, got a {have.name}")
    if want.is_int and have.is_int:
        return a.cast(want)
    raise AbiError(f"{selector}: argument {i} must be a {want.name}, got a {have.name}")


def _lower_arg(ctx: _AbiCtx, selector: str, i: int, a: UOp, want: DType) -> tuple[UOp, ...]:
    """Argument ``i`` of ``selector`` (``a``, declared ``want`` in Metal's terms) as the target passes it: NSRange
    as two words, MTLSize as a pointer (arm64) or a STRUCT by value (x86_64), integers cast to the declared type.
    Raises ``AbiError`` when it cannot fit."""
    a = _fit(selector, i, a, want)
    if want is dtypes.NSRange:
        return _fields(a, 2)
    if want is dtypes.MTLSize:
        return ((_mtlsize_arm64(a, ctx),) if ctx.target == "arm64" else (UOp.struct(dtypes.MTLSize, *_fields(a, 3)),))
    return (a,)


def _signature(selector: str, nargs: int) -> Signature:
    sig = SELECTORS.get(selector)
    if sig is None:
        raise AbiError(f"selector {selector!r} is not in the selector table (mtlir.metal.SELECTORS)")
    if nargs != len(sig.args):
        raise AbiError(f"{selector}: takes {len(sig.args)} arguments "
                       f"({', '.join(a.name for a in sig.args) or 'none'}), got {nargs}")
    return sig


def lower_msg(ctx: _AbiCtx, m: UOp) -> UOp:
    """One MSG -> CALL of objc_msgSend (module docstring). Raises ``AbiError`` naming selector and argument."""
    selector = m.arg
    recv, args = m.src[0], m.src[1:]
    sig = _signature(selector, len(args))
    if recv.dtype is not dtypes.id:
        raise AbiError(f"{selector}: the receiver must be an object (id), got a {recv.dtype.name}")
    if m.dtype is not sig.ret:
        raise AbiError(f"{selector}: the MSG is typed {m.dtype.name} but the selector returns {sig.ret.name}")
    proto: Prototype = abi_prototype(selector, ctx.target)
    out: list[UOp] = [recv, sel(selector)]
    for i, (a, want) in enumerate(zip(args, sig.args)):
        out += _lower_arg(ctx, selector, i, a, want)
    return UOp(Ops.CALL, proto.ret, tuple(out), ("objc_msgSend", selector, proto), m.tag)


def lower_msgs(ctx: _AbiCtx, m: UOp) -> UOp:
    """An MSGS (void messages as data) -> a CALLS of objc_msgSend, each message as ``lower_msg`` makes it; each
    distinct (operand, declared type) is converted once, a repeated message once. The CALLS's sources are the
    receiver, then every operand a call uses in first-use order (an MTLSize STRUCT that arm64 passes as its copy is
    not one). Raises ``AbiError`` naming selector and argument."""
    recv, msrc = m.src[0], m.src
    if recv.dtype is not dtypes.id:
        raise AbiError(f"MSGS: the receiver must be an object (id), got a {recv.dtype.name}")
    src: list[UOp] = [recv]
    index: dict[UOp, int] = {recv: 0}
    protos, converted = ctx.protos, ctx.converted
    calls: list[tuple[str, str, Prototype, tuple[int, ...]]] = []
    done: dict[tuple[str, tuple[int, ...]], tuple[str, str, Prototype, tuple[int, ...]]] = {}
    for entry in m.arg:
        call = done.get(entry)
        if call is None:  # a message not met before in this batch (a repeated pipeline, binding or size is reused)
            selector, refs = entry
            got = protos.get(selector)
            if got is None:
                sig = _signature(selector, len(refs))
                if sig.ret is not dtypes.void:
                    raise AbiError(f"{selector}: returns {sig.ret.name}; an MSGS holds void messages only")
                got = protos[selector] = (sig, abi_prototype(selector, ctx.target), sel(selector))
            sig, proto, sel_node = got
            if len(refs) != len(sig.args):
                _signature(selector, len(refs))
            words: list[UOp] = [sel_node]
            for i, (r, want) in enumerate(zip(refs, sig.args)):
                a = msrc[r]
                got_words = converted.get((a, want))
                if got_words is None:
                    got_words = converted[(a, want)] = _lower_arg(ctx, selector, i, a, want)
                words += got_words
            args = [0]
            for w in words:
                j = index.get(w)
                if j is None:
                    j = index[w] = len(src)
                    src.append(w)
                args.append(j)
            call = done[entry] = ("objc_msgSend", selector, proto, tuple(args))
        calls.append(call)
    return UOp(Ops.CALLS, dtypes.void, tuple(src), CallList(calls), m.tag)


# every MSG becomes a CALL of objc_msgSend with the selector's exact prototype for the target
ABI = PatternMatcher([(UPat(Ops.MSG, name="m"), lower_msg), (UPat(Ops.MSGS, name="m"), lower_msgs)])


@register
@dataclass(frozen=True)
class Abi(Pass):
    """MSG -> CALL of objc_msgSend for ``target`` (``arm64`` or ``x86_64``; required). Raises ``AbiError`` for a
    selector missing from the table or arguments that do not fit its signature (count, dtype)."""

    name = "abi"
    takes = ("messages",)
    produces = "calls"
    target: str

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}: expected one of {', '.join(TARGETS)}")

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        """Every MSG (and MSGS) of ``graph`` as CALLs of objc_msgSend for ``target``; records the target in
        ``ctx`` for linearize. Raises ``AbiError`` naming the selector and the argument."""
        ctx.target = self.target
        return graph_rewrite(graph, ABI, ctx=_AbiCtx(self.target, ctx, {}), name=f"abi{{target={self.target}}}",
                             results_final=True)

    def verify(self, result: UOp | Program) -> None:
        """The common checks, and on arm64 no MTLSize passed by value, in one walk. Raises ``VerifyError``."""
        from mtlir.passes.pipeline import PipelineError
        from mtlir.passes.verify import verify_graph
        if not isinstance(result, UOp):
            raise PipelineError(f"pass {self.name!r} produced a {type(result).__name__}, not a graph")
        verify_graph(result, self.name, _no_mtlsize_by_value if self.target == "arm64" else None,
                     frozenset({Ops.CALL, Ops.CALLS}))


def _no_mtlsize_by_value(u: UOp, root: UOp) -> str | None:
    """arm64 passes an MTLSize by pointer (AAPCS64: composites over 16 bytes go by reference)."""
    if u.op is Ops.CALL and any(s.dtype is dtypes.MTLSize for s in u.src):
        return f"{u.arg[1]!r} passes an MTLSize by value, which arm64 passes by pointer"
    if u.op is Ops.CALLS and any(s.dtype is dtypes.MTLSize for s in u.src):
        return "a call of the CALLS passes an MTLSize by value, which arm64 passes by pointer"
    return None
