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

from dataclasses import dataclass

from mtlir.dtypes import DType, PtrDType, dtypes
from mtlir.metal import SELECTORS, TARGETS, AbiError, Obj, Prototype, abi_prototype
from mtlir.ops import Ops
from mtlir.passes.pipeline import Pass, PassContext, register
from mtlir.program import Program
from mtlir.rewrite import graph_rewrite
from mtlir.upat import PatternMatcher, UPat
from mtlir.uop import UOp

__all__ = ["Abi", "AbiError", "sel", "lower_msg"]


def sel(selector: str) -> UOp:
    """The SEL of ``selector``: a CONST of dtype SEL whose arg is the name (linearize puts it in
    ``Program.selectors``; link resolves it once with ``sel_registerName``)."""
    return UOp(Ops.CONST, dtypes.SEL, (), selector)


@dataclass
class _AbiCtx:
    target: str
    pass_ctx: PassContext
    scratch: dict[UOp, UOp]


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


def lower_msg(ctx: _AbiCtx, m: UOp) -> UOp:
    """One MSG -> CALL of objc_msgSend (module docstring). Raises ``AbiError`` naming selector and argument."""
    selector = m.arg
    sig = SELECTORS.get(selector)
    if sig is None:
        raise AbiError(f"selector {selector!r} is not in the selector table (mtlir.metal.SELECTORS)")
    recv, args = m.src[0], m.src[1:]
    if len(args) != len(sig.args):
        raise AbiError(f"{selector}: takes {len(sig.args)} arguments "
                       f"({', '.join(a.name for a in sig.args) or 'none'}), got {len(args)}")
    if recv.dtype is not dtypes.id:
        raise AbiError(f"{selector}: the receiver must be an object (id), got a {recv.dtype.name}")
    if m.dtype is not sig.ret:
        raise AbiError(f"{selector}: the MSG is typed {m.dtype.name} but the selector returns {sig.ret.name}")
    proto: Prototype = abi_prototype(selector, ctx.target)
    out: list[UOp] = [recv, sel(selector)]
    for i, (a, want) in enumerate(zip(args, sig.args)):
        a = _fit(selector, i, a, want)
        if want is dtypes.NSRange:
            out += _fields(a, 2)
        elif want is dtypes.MTLSize:
            out.append(_mtlsize_arm64(a, ctx) if ctx.target == "arm64" else
                       UOp.struct(dtypes.MTLSize, *_fields(a, 3)))
        else:
            out.append(a)
    return UOp(Ops.CALL, proto.ret, tuple(out), ("objc_msgSend", selector, proto), m.tag)


# every MSG becomes a CALL of objc_msgSend with the selector's exact prototype for the target
ABI = PatternMatcher([(UPat(Ops.MSG, name="m"), lower_msg)])


@register
@dataclass(frozen=True)
class Abi(Pass):
    """MSG -> CALL of objc_msgSend for ``target`` (``arm64`` or ``x86_64``; required). Raises ``AbiError`` for a
    selector missing from the table or arguments that do not fit its signature (count, dtype)."""

    name = "abi"
    target: str

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}: expected one of {', '.join(TARGETS)}")

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        ctx.target = self.target
        return graph_rewrite(graph, ABI, ctx=_AbiCtx(self.target, ctx, {}), name=f"abi{{target={self.target}}}")

    def verify(self, result: UOp | Program) -> None:
        super().verify(result)
        if self.target == "arm64" and isinstance(result, UOp):
            from mtlir.passes.verify import VerifyError
            for u in result.toposort():
                if u.op is Ops.CALL and any(s.dtype is dtypes.MTLSize for s in u.src):
                    raise VerifyError(self.name, u, f"{u.arg[1]!r} passes an MTLSize by value, which arm64 passes "
                                                    "by pointer")
