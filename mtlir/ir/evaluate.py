"""Evaluation of ALU expressions over constants and variables, with C semantics for integers."""
from __future__ import annotations

import operator
import struct
from collections.abc import Callable
from typing import Any

from mtlir.ir.dtypes import DType, wrap
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp

__all__ = ["evaluate", "c_idiv", "c_mod", "bitcast", "ALU_FUNCS"]


def c_idiv(a: int, b: int) -> int:
    """Integer division truncating toward zero (C). Raises ``ZeroDivisionError``."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def c_mod(a: int, b: int) -> int:
    """Remainder with the sign of the dividend (C). Raises ``ZeroDivisionError``."""
    return a - b * c_idiv(a, b)


def bitcast(src: DType, dst: DType, value: Any) -> Any:
    """``value`` of dtype ``src`` reinterpreted as ``dst`` (the same bytes, little-endian); word types of one
    size (integers, pointers, ids) keep their bits. Raises ``ValueError`` when the sizes differ."""
    if src.itemsize != dst.itemsize or not src.fmt or not dst.fmt:
        raise ValueError(f"cannot bitcast {src.name} ({src.itemsize} bytes) to {dst.name} ({dst.itemsize} bytes)")
    if src.is_word and dst.is_word:
        return wrap(dst, value)
    return struct.unpack("<" + dst.fmt, struct.pack("<" + src.fmt, wrap(src, value) if src.is_word else value))[0]


ALU_FUNCS: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: operator.neg, Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul,
    Ops.IDIV: c_idiv, Ops.MOD: c_mod, Ops.MAX: max, Ops.MIN: min, Ops.SHL: operator.lshift,
    Ops.SHR: operator.rshift, Ops.AND: operator.and_, Ops.OR: operator.or_, Ops.XOR: operator.xor,
    Ops.CMPLT: operator.lt, Ops.CMPLE: operator.le, Ops.CMPEQ: operator.eq, Ops.CMPNE: operator.ne,
    Ops.WHERE: lambda c, a, b: a if c else b,
}


def evaluate(root: UOp, values: dict[str, int]) -> Any:
    """The value of ``root``, an expression of CONST, DEFINE_VAR, CAST, BITCAST, AFTER and ALU nodes.

    ``values`` binds DEFINE_VARs by name. Integers wrap to their dtype (two's complement); IDIV and MOD truncate
    toward zero (C). Raises ``KeyError`` naming an unbound variable, ``ValueError`` for a variable value outside
    its bounds or a node that is not arithmetic, ``ZeroDivisionError`` for a division by zero."""
    memo: dict[UOp, Any] = {}
    for u in root.toposort():
        if u.op is Ops.CONST:
            memo[u] = wrap(u.dtype, u.arg)  # a CONST built with UOp(...) directly may hold an unwrapped value
        elif u.op is Ops.DEFINE_VAR:
            name, lo, hi = u.arg
            if name not in values:
                raise KeyError(f"variable {name!r} has no value")
            v = int(values[name])
            if not lo <= v <= hi:
                raise ValueError(f"variable {name!r} = {v} is outside its bounds [{lo}, {hi}]")
            memo[u] = v
        elif u.op in ALU_FUNCS:
            memo[u] = wrap(u.dtype, ALU_FUNCS[u.op](*(memo[s] for s in u.src)))
        elif u.op is Ops.CAST:
            v = memo[u.src[0]]
            memo[u] = float(v) if u.dtype.is_float else wrap(u.dtype, int(v))
        elif u.op is Ops.BITCAST:
            memo[u] = bitcast(u.src[0].dtype, u.dtype, memo[u.src[0]])
        elif u.op in (Ops.AFTER,):
            memo[u] = memo[u.src[0]]
        else:
            raise ValueError(f"cannot evaluate {u.op!r} (only constants, variables and arithmetic)")
    return memo[root]


