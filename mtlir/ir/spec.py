"""The well-formedness rules of value nodes, at any stage: CONST, DEFINE_VAR, CAST and the ALU ops.

``UOp(...)`` checks only the field types (an Ops, a DType, a tuple of UOps): it is called for every node of every
pass, so it does not look at what the fields say. These rules do, once per node, where a graph enters from outside
(``parse``, ``Queue.exec``'s variable values and sizes) and after every pass (``passes/verify.py``'s SPEC):

- an ALU node has its op's number of sources (NEG 1, WHERE 3, the others 2);
- arithmetic (NEG, ADD, SUB, MUL, IDIV, MOD, MAX, MIN, AND, OR, XOR, SHL, SHR) does not mix integers and floats:
  its sources are floats when its dtype is and integers when it is not (integers of two widths do mix, as
  ``UOp.alu`` builds them: the result has the first operand's dtype; a shift amount is any integer);
- a comparison is bool and compares two integers or two floats; WHERE's condition is bool and its branches have
  its dtype;
- a CONST's arg is of its dtype's Python type (int for an integer, not bool; float or int for a float; bool for
  bool) and an integer fits its dtype (a SEL's is its selector's name, an id's or pointer's may be a placeholder;
  ``UOp.const`` converts and wraps as C does, a CONST built with ``UOp(Ops.CONST, ...)`` is taken as written);
- a DEFINE_VAR's arg is ``(name, min, max)``: a non-empty str, two ints, ``min <= max``, inside an integer dtype;
- a CAST has one source.
"""
from __future__ import annotations

from mtlir.ir.dtypes import dtypes
from mtlir.ir.ops import GroupOp, Ops
from mtlir.ir.uop import UOp

__all__ = ["value_problem", "ALU_ARITY"]

ALU_ARITY = {**{op: 1 for op in GroupOp.Unary}, **{op: 2 for op in GroupOp.Binary},
             **{op: 3 for op in GroupOp.Ternary}}


def _alu_problem(x: UOp) -> str | None:
    n = ALU_ARITY[x.op]
    if len(x.src) != n:
        return f"{x.op.name} takes {n} source{'s' if n > 1 else ''}, has {len(x.src)}"
    if x.op in GroupOp.Comparison:
        if x.dtype is not dtypes.bool:
            return f"a comparison is bool, not {x.dtype.name}"
        a, b = x.src
        return None if a.dtype.is_float == b.dtype.is_float else \
            f"{x.op.name} compares a {a.dtype.name} with a {b.dtype.name}: an integer and a float do not mix"
    if x.op is Ops.WHERE:
        if x.src[0].dtype is not dtypes.bool:
            return f"WHERE's condition is bool, not {x.src[0].dtype.name}"
        return None if x.src[1].dtype is x.dtype is x.src[2].dtype else \
            f"WHERE<{x.dtype.name}>'s branches are {x.src[1].dtype.name} and {x.src[2].dtype.name}"
    srcs = x.src[:1] if x.op in (Ops.SHL, Ops.SHR) else x.src  # a shift amount is any integer
    if any(s.dtype.is_float != x.dtype.is_float for s in srcs):
        have = ", ".join(s.dtype.name for s in x.src)
        return (f"{x.op.name}<{x.dtype.name}> of sources {have}: an integer and a float do not mix (convert with "
                f".cast(dtypes.{x.dtype.name}))")
    return None


def _const_problem(c: UOp) -> str | None:
    dt, v = c.dtype, c.arg
    kind = dt.kind
    if kind == "bool":
        return None if type(v) is bool else f"CONST<bool> {v!r} is a {type(v).__name__}, not a bool"
    if kind == "float":
        return None if type(v) in (float, int) else f"CONST<{dt.name}> {v!r} is a {type(v).__name__}, not a float"
    if kind not in ("int", "uint"):
        return None  # a SEL's arg is its selector's name, an id's or pointer's may be a placeholder
    if type(v) is not int:
        return (f"CONST<{dt.name}> {v!r} is a {type(v).__name__}, not an int (UOp.const(dtypes.{dt.name}, ...) "
                f"checks and converts a value)")
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    return None if lo <= v <= hi else f"CONST<{dt.name}> {v} does not fit its dtype [{lo}, {hi}]"


def _var_problem(v: UOp) -> str | None:
    a = v.arg
    if not (isinstance(a, tuple) and len(a) == 3 and type(a[0]) is str and type(a[1]) is int and type(a[2]) is int):
        return f"a DEFINE_VAR's arg is (name, min, max): a str and two ints, not {a!r}"
    name, lo, hi = a
    if not name:
        return "a DEFINE_VAR's name is a non-empty str"
    if lo > hi:
        return f"variable {name!r}: min {lo} > max {hi}"
    if v.dtype.kind in ("int", "uint") and (lo < dtypes.min(v.dtype) or hi > dtypes.max(v.dtype)):
        return (f"variable {name!r}: bounds [{lo}, {hi}] do not fit its dtype {v.dtype.name} "
                f"[{dtypes.min(v.dtype)}, {dtypes.max(v.dtype)}]")
    return None


def value_problem(u: UOp) -> str | None:
    """What is wrong with the value node ``u`` by the rules of the module docstring, as text naming the op, the
    dtypes or the value (None: fine, or not a value node: other ops have their stage's rules)."""
    op = u.op
    if op in ALU_ARITY:
        return _alu_problem(u)
    if op is Ops.CONST:
        return _const_problem(u)
    if op is Ops.DEFINE_VAR:
        return _var_problem(u)
    if op is Ops.CAST and len(u.src) != 1:
        return f"a CAST has one source, has {len(u.src)}"
    return None
