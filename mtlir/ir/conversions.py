"""What Python's conversions and operators of a UOp may answer, and the errors that say why not: ``bool()``,
``int()``, ``float()``, ``operator.index`` and ``==`` against a number of an expression without one value
(``conversion_message``, ``compare_message``), and ``//`` / ``%`` where Python's floor and the graph's C
truncation differ (``division``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mtlir.ir.ops import Ops

if TYPE_CHECKING:
    from mtlir.ir.uop import UOp

__all__ = ["division", "describe", "conversion_message", "compare_message"]


def division(op: Ops, a: UOp, b: UOp) -> UOp:
    """``a // b`` or ``a % b`` as the graph's IDIV/MOD, which are C's (truncating toward zero). Python's
    operators floor instead; the two agree when dividend and divisor have one sign (or the divisor is 1 or -1),
    as for sizes (a dividend >= 0, a divisor >= 1), so where the
    operands' ranges (over their variables' bounds) show that they may not, this raises ``TypeError`` naming the
    expression rather than give C's answer to Python's question (``-(-n // 128)`` would be n // 128, not the
    ceiling). A divisor that can be 0 raises too (``ZeroDivisionError`` for a constant 0, as Python does).
    ``a.alu(Ops.IDIV, b)`` asks for C's division explicitly. Operands whose range cannot be computed (a loaded
    value) and floats are not checked."""
    node = a.alu(op, b)
    if node.dtype.is_float or not node.dtype.is_word or node.dtype.kind == "bool":
        return node
    from mtlir.errors import InputError
    from mtlir.ir.bounds import bounds, expr_text, variable_bounds
    try:
        (alo, ahi), (blo, bhi) = bounds(a), bounds(b)
    except InputError:  # a range that cannot be computed (a LOAD): nothing to prove
        return node
    if (alo >= 0 and blo >= 1) or (ahi <= 0 and bhi <= -1) or (blo == bhi and abs(blo) == 1):
        return node  # both results have one sign (or the divisor is +-1): floor and truncation agree
    sym = "//" if op is Ops.IDIV else "%"
    from mtlir.ir.bounds import WrapError, exact_bounds
    for side_node in (a, b):  # a range widened by a wrap: say so rather than blame the signs
        try:
            exact_bounds(side_node)
        except WrapError as e:
            raise TypeError(f"{expr_text(node)}: {e} for {variable_bounds(side_node)}; {e.hint}") from None
    if blo == bhi == 0:
        raise ZeroDivisionError(f"{expr_text(node)}: division by zero")
    if blo <= 0 <= bhi:
        raise TypeError(f"{expr_text(node)}: the divisor can be 0 for {variable_bounds(b)} (C "
                        f"leaves a division by zero undefined): keep it >= 1, e.g. ({expr_text(b)}).maximum(1)")
    def side(name: str, u: UOp, lo: int, hi: int) -> str:
        text = expr_text(u)
        return f"the {name} is {lo}" if text == str(lo) == str(hi) else \
            f"the {name} {text} " + (f"is {lo}" if lo == hi else f"can be {lo}..{hi}")
    dividend, divisor = side("dividend", a, alo, ahi), side("divisor", b, blo, bhi)
    why = f"{dividend} and {divisor}"
    raise TypeError(f"{expr_text(node)}: Python's {sym} floors, the graph's {op.name} truncates "
                    f"toward zero (C); they differ here, {why}. Write a.alu(Ops.{op.name}, b) for C's division, "
                    f"or keep the dividend >= 0 and the divisor >= 1 (a ceiling: (n + 127) // 128, not "
                    f"-(-n // 128))")


# what to write instead of Python's control flow over a symbolic value, in the messages of the conversions
_GRAPH_HINT = ("keep the choice in the graph: x.maximum(y) for max(x, y), x.minimum(y) for min(x, y), "
               "cond.where(a, b) for `a if cond else b`")
_HINTS = {
    "bool": ("Python's if, and/or/not, max(), min() and sorted() would take one branch for every value of its "
             "variables; " + _GRAPH_HINT),
    "int": "pass the expression itself (sizes and kernel variables take UOps), or x.evaluate({...}) for one binding",
    "index": "pass the expression itself (sizes and kernel variables take UOps), or x.evaluate({...}) for one binding",
    "float": "x.evaluate({...}) gives its value for one binding of its variables",
}


def describe(u: UOp) -> str:
    """``u`` for a message: an arithmetic expression in infix form with its dtype, another node as OP<dtype>."""
    from mtlir.ir.bounds import VALUE_OPS, expr_text
    if all(x.op in VALUE_OPS for x in u.toposort()):
        return f"the {u.dtype.name} expression {expr_text(u)}"
    return f"the {u.op.name}<{u.dtype.name}> node"


def conversion_message(u: UOp, what: str) -> str:
    """Why ``what()`` of ``u`` (bool, int, index, float) has no single answer, and what to write instead."""
    from mtlir.ir.bounds import VALUE_OPS, BoundsError, bounds, variable_bounds
    nodes = u.toposort()
    if any(x.op not in VALUE_OPS for x in nodes):
        other = next(x for x in reversed(nodes) if x.op not in VALUE_OPS)
        at = "it" if other is u else f"it depends on the {other.op.name}<{other.dtype.name}> node, which"
        return (f"{what}() of {describe(u)}: {at} is not a value known while the graph is built (only constants and "
                f"arithmetic on run-time variables are); to test for a node write `node is not None`")
    try:
        lo, hi = bounds(u)
        values = "it can be " + ("True or False" if u.dtype.kind == "bool" else f"a value in [{lo}, {hi}]") + " for"
    except BoundsError:  # a float expression of variables
        values = "its value depends on"
    return (f"{what}() of {describe(u)}: {values} {variable_bounds(u)}, so it has no single value; {_HINTS[what]}")


def compare_message(u: UOp, op: str, other: object, method: str) -> str:
    """Why ``u op other`` (``==`` or ``!=`` against a number) is refused, and the node ``x.method(other)`` to build."""
    return (f"{describe(u)} {op} {other!r}: {op} on a UOp compares nodes, so against a number it would be "
            f"{op == '!='} for every value; the comparison node is x.{method}({other!r}), a constant's value "
            f"int(x) {op} {other!r}")
