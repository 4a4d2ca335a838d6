"""``symbolic``: constant folding and simplification of index and size arithmetic.

Integer arithmetic has C semantics wrapped to the node's dtype (``mtlir.ir.evaluate``): integers form a ring modulo
2**bits, so re-associating constant adds and multiplies keeps every value. Only integer (and bool) nodes are
folded; division or shift by a constant that C leaves undefined (by 0, negative shifts) is left alone.

Before / after::

    ADD(ADD(DEFINE_VAR n, CONST 3), CONST 5)       ->  ADD(DEFINE_VAR n, CONST 8)
    SUB(ADD(DEFINE_VAR n, CONST 64), CONST 1)      ->  ADD(DEFINE_VAR n, CONST 63)
    MUL(CONST 4, CONST 8)                          ->  CONST 32
    STRUCT<MTLSize>(CAST(MUL(n, CONST 1)), 1, 1)   ->  STRUCT<MTLSize>(CAST(n), 1, 1)
    GEP(STRUCT(a, b), 1)                           ->  b

``encode`` simplifies every value it reads with these rules (sizes, variable values, signal values) and builds
nothing they fold, so after encode this pass has no work: the default pipeline runs it only on a graph built by
other means where ``simplifiable(graph)`` (``mtlir.passes.default_pipeline``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtlir.ir.dtypes import DType, PtrDType
from mtlir.ir.dtypes import wrap
from mtlir.ir.evaluate import ALU_FUNCS
from mtlir.ir.ops import GroupOp, Ops
from mtlir.passes.pipeline import Pass, PassContext, register
from mtlir.ir.rewrite import graph_rewrite
from mtlir.ir.upat import PatternMatcher, UPat
from mtlir.ir.uop import UOp

__all__ = ["Symbolic", "SYMBOLIC", "simplify", "simplifiable", "fold"]


def _ints(*nodes: UOp) -> bool:
    return all(n.dtype.is_int and not isinstance(n.dtype, PtrDType) for n in nodes)


def fold(op: Ops, dtype: DType, values: tuple[Any, ...]) -> Any | None:
    """``op(*values)`` with C semantics wrapped to ``dtype``; None where C leaves it undefined (division by zero,
    a negative or too wide shift)."""
    if op in (Ops.SHL, Ops.SHR) and not 0 <= values[1] < max(dtype.bits, 1):
        return None
    try:
        out = ALU_FUNCS[op](*values)
    except (ZeroDivisionError, ValueError, OverflowError):
        return None
    return bool(out) if op in GroupOp.Comparison else wrap(dtype, out)


# ---- constant folding: an ALU or CAST of constants becomes one constant


def fold_alu(x: UOp) -> UOp | None:
    """An integer ALU of constants -> its value."""
    if not _ints(x, *x.src):
        return None
    val = fold(x.op, x.src[0].dtype if x.op in GroupOp.Comparison else x.dtype, tuple(s.arg for s in x.src))
    return None if val is None else UOp.const(x.dtype, val)


def fold_cast(x: UOp, c: UOp) -> UOp | None:
    """A CAST of an integer constant -> the constant wrapped to the new type."""
    if not _ints(x, c):
        return None
    return UOp.const(x.dtype, wrap(x.dtype, int(c.arg)))


def fold_where(c: UOp, a: UOp, b: UOp) -> UOp:
    """WHERE of a constant condition -> the branch it picks."""
    return a if c.arg else b


# ---- identities: x+0, x-0, x*1, x//1, x|0, x^0, x<<0, x>>0 -> x; x*0, x&0, x%1 -> 0; max(x,x), min(x,x) -> x


def same_dtype(node: UOp, x: UOp) -> UOp | None:
    """``node`` -> ``x`` when they have the same dtype (identities such as x+0)."""
    return x if x.dtype is node.dtype else None


def to_zero(node: UOp, x: UOp) -> UOp | None:
    """``node`` -> 0 for integers (x*0, x&0, x%1)."""
    return UOp.const(node.dtype, 0) if _ints(node, x) else None


def self_zero(node: UOp, x: UOp) -> UOp | None:
    """x-x, x^x -> 0 for integers."""
    return UOp.const(node.dtype, 0) if _ints(node) and x.dtype is node.dtype else None


# ---- re-association: (x + c1) + c2 -> x + (c1 + c2), (x * c1) * c2 -> x * (c1 * c2)


def reassociate(outer: UOp, inner: UOp, x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    """(x+c1)+c2 -> x+(c1+c2) and (x*c1)*c2 -> x*(c1*c2), wrapped."""
    if outer.op is not inner.op or not _ints(outer, inner, x) or not inner.dtype is outer.dtype is x.dtype:
        return None
    val = fold(outer.op, outer.dtype, (c1.arg, c2.arg))
    return None if val is None else x.alu(outer.op, UOp.const(outer.dtype, val))


def fold_add_sub(outer: UOp, inner: UOp, x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    """(x ± c1) ± c2 -> x + k, or x - k for a negative k of a signed type (k = ±c1 ± c2, wrapped)."""
    if inner.op is outer.op is Ops.ADD or not _ints(outer, inner, x) or not inner.dtype is outer.dtype is x.dtype:
        return None  # ADD over ADD is the plain re-association rule
    dt = outer.dtype
    k = wrap(dt, (c1.arg if inner.op is Ops.ADD else -c1.arg) + (c2.arg if outer.op is Ops.ADD else -c2.arg))
    if k == 0:
        return x
    return x - UOp.const(dt, -k) if k < 0 and dt.kind == "int" and k != dtypes_min(dt) else x + UOp.const(dt, k)


def dtypes_min(dt: DType) -> int:
    """The smallest value of a signed integer dtype."""
    return -(1 << (dt.bits - 1))


def fold_gep(s: UOp, g: UOp) -> UOp | None:
    """Field i of a STRUCT -> its i-th source."""
    return s.src[g.arg] if 0 <= g.arg < len(s.src) and s.src[g.arg].dtype is g.dtype else None


def index_zero(p: UOp, i: UOp) -> UOp | None:
    """INDEX(p, 0) -> p."""
    return p if i.arg == 0 else None


_x, _c, _c2 = UPat.var("x"), UPat.cvar("c"), UPat.cvar("c2")
_zero, _one = UPat.const(None, 0), UPat.const(None, 1)

SYMBOLIC = PatternMatcher([
    # constant folding
    (UPat(GroupOp.ALU - {Ops.WHERE}, src=UPat(Ops.CONST), name="x"), fold_alu),
    (UPat(Ops.CAST, src=(UPat(Ops.CONST, name="c"),), name="x"), fold_cast),
    (UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), UPat.var("a"), UPat.var("b"))), fold_where),
    (UPat(Ops.WHERE, src=(UPat.var(), _x, _x), name="node"), same_dtype),
    # identities
    (UPat((Ops.ADD, Ops.OR, Ops.XOR), src=(_x, _zero), name="node"), same_dtype),
    (UPat((Ops.SUB, Ops.SHL, Ops.SHR), src=(_x, _zero), name="node"), same_dtype),
    (UPat(Ops.MUL, src=(_x, _one), name="node"), same_dtype),
    (UPat(Ops.IDIV, src=(_x, _one), name="node"), same_dtype),
    (UPat((Ops.MUL, Ops.AND), src=(_x, _zero), name="node"), to_zero),
    (UPat(Ops.MOD, src=(_x, _one), name="node"), to_zero),
    (UPat((Ops.SUB, Ops.XOR), src=(_x, _x), name="node"), self_zero),
    (UPat((Ops.MAX, Ops.MIN), src=(_x, _x), name="node"), same_dtype),
    (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(_x,)),), name="node"), same_dtype),
    # re-association of constant adds and multiplies
    (UPat((Ops.ADD, Ops.MUL), src=(UPat((Ops.ADD, Ops.MUL), src=(_x, UPat.cvar("c1")), name="inner"), _c2),
          name="outer"), reassociate),
    (UPat((Ops.ADD, Ops.SUB), src=(UPat((Ops.ADD, Ops.SUB), src=(_x, UPat.cvar("c1")), name="inner"), _c2),
          name="outer"), fold_add_sub),
    # struct fields and addresses
    (UPat(Ops.GEP, src=(UPat(Ops.STRUCT, name="s"),), name="g"), fold_gep),
    (UPat(Ops.INDEX, src=(UPat.var("p"), UPat.cvar("i"))), index_zero),
])


def simplify(node: UOp) -> UOp:
    """``node`` simplified with the symbolic rules (to a fixed point)."""
    if not node.src and SYMBOLIC.rewrite(node) is None:  # a constant or a variable: no walk (encode meets many)
        return node
    return graph_rewrite(node, SYMBOLIC, name="symbolic")


def simplifiable(graph: UOp) -> bool:
    """Whether a rule of ``SYMBOLIC`` rewrites some node of ``graph``, at the cost of one look at each node. When
    it is False, ``simplify(graph) is graph``: the rewrite goes bottom-up, and a graph none of whose nodes a rule
    rewrites comes back as it is."""
    rewrite = SYMBOLIC.rewrite
    return any(rewrite(u) is not None for u in graph.toposort())


@register
@dataclass(frozen=True)
class Symbolic(Pass):
    """Constant folding and simplification of integer arithmetic everywhere in the graph (module docstring)."""

    name = "symbolic"
    takes = ("messages", "calls")

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        """``graph`` with its integer arithmetic folded and simplified (``SYMBOLIC``, to a fixed point)."""
        return graph_rewrite(graph, SYMBOLIC, name="symbolic")
