"""Value ranges: the smallest and largest value an integer expression can take over its variables' bounds.

``bounds(node)`` walks an expression of CONST, DEFINE_VAR, CAST, BITCAST, AFTER and ALU nodes once and returns
``(vmin, vmax)``, inclusive, with the C semantics of ``mtlir.ir.evaluate``: integers wrap to the node's dtype (a result
interval that does not fit the dtype becomes the dtype's whole range, which is where a wrap can land), IDIV and MOD
truncate toward zero, comparisons and bool are 0/1. The range is sound (every value the expression takes at any
variable values inside their bounds lies in it) but not always tight: variables are treated as independent, so
``n - n`` gives ``[lo - hi, hi - lo]``, not ``[0, 0]``.

``exact_bounds(node)`` is the strict form the queue builder uses: the same ranges computed without wrapping, and a
``WrapError`` naming the first node (innermost) whose range leaves its dtype (``m * 65536`` of an int32 ``m`` in
``[1, 65536]`` can be 2**32), a CAST whose source's range does not fit its dtype, or a shift whose count can leave
``[0, bits)`` (undefined in C). Such an expression would wrap silently in the kernel or the command; computed in
int64 and cast back, it is checked where it is cast. BITCAST (a reinterpretation) and bool results keep C semantics.

``expr_text(node)`` prints such an expression in infix form for error messages (``(n + 31) // 32``).
``single_value(node)`` is the one value an expression takes for every value of its variables, when the bounds (or,
without variables, the evaluation) show there is one: what ``bool()``, ``int()`` and ``range()`` of a UOp return.

Used by the queue builder and ``encode`` to refuse dispatch sizes that can fall below 1 or exceed 2**32-1
(``mtlir.frontend.checks.check_size``); reusable by simplification rules (``UOp.vmin`` / ``UOp.vmax``).
"""
from __future__ import annotations

from typing import Any

from mtlir.ir.dtypes import DType, dtypes
from mtlir.errors import InputError
from mtlir.ir.evaluate import c_idiv, evaluate
from mtlir.ir.ops import GroupOp, Ops
from mtlir.ir.uop import UOp

__all__ = ["bounds", "exact_bounds", "single_value", "expr_text", "variable_bounds", "BoundsError", "WrapError",
           "VALUE_OPS"]

# the ops of a value known while the graph is built: constants, run-time variables and arithmetic on them
VALUE_OPS = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.CAST, Ops.BITCAST, Ops.AFTER}) | GroupOp.ALU


class BoundsError(InputError, ValueError):
    """An expression whose range cannot be computed (a node that is not integer arithmetic); names the node."""


class WrapError(BoundsError):
    """An integer expression whose value, computed without wrapping over its variables' bounds, can leave the dtype
    of one of its nodes (``exact_bounds``): ``node`` is that node (the innermost), ``lo`` and ``hi`` its range
    without wrapping (None for a shift whose count can leave ``[0, bits)``, which C leaves undefined); ``hint``
    says what to write instead (a wider dtype)."""

    def __init__(self, message: str, node: UOp, lo: int | None, hi: int | None, hint: str) -> None:
        super().__init__(message)
        self.node, self.lo, self.hi, self.hint = node, lo, hi, hint


def _full(dt: DType) -> tuple[int, int]:
    return (0, 1) if dt.kind == "bool" else (dtypes.min(dt), dtypes.max(dt))


def _fit(dt: DType, lo: int, hi: int) -> tuple[int, int]:
    """``[lo, hi]`` as the dtype holds it: unchanged when it fits, else the whole range (a wrap can land anywhere)."""
    if dt.kind == "bool":
        if lo > 0 or hi < 0:
            return (1, 1)
        return (0, 0) if lo == hi == 0 else (0, 1)
    mn, mx = _full(dt)
    return (lo, hi) if mn <= lo and hi <= mx else (mn, mx)


def _corners(fn: Any, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    vals = [fn(x, y) for x in a for y in b]
    return min(vals), max(vals)


def _idiv(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    """C division over a divisor range; a divisor of 0 is undefined (left out); None when only 0 is possible."""
    parts = [p for p in ((b[0], min(b[1], -1)), (max(b[0], 1), b[1])) if p[0] <= p[1]]
    if not parts:
        return None
    # truncating division is monotonic in each argument on a divisor range of one sign: the corners bound it
    ranges = [_corners(c_idiv, a, p) for p in parts]
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def _mod(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    """C remainder: the dividend's sign, magnitude below the divisor's."""
    m = max(abs(b[0]), abs(b[1])) - 1
    if m < 0:
        return None  # only a divisor of 0: undefined
    if b[0] == b[1] and a[0] >= 0 and a[1] - a[0] < b[0] and a[0] % b[0] <= a[1] % b[0]:
        return a[0] % b[0], a[1] % b[0]  # a positive constant divisor and no wrap-around inside the range
    return (0 if a[0] >= 0 else max(a[0], -m)), (0 if a[1] <= 0 else min(a[1], m))


def _bitwise(op: Ops, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    if a[0] < 0 or b[0] < 0:
        return None
    if op is Ops.AND:
        return 0, min(a[1], b[1])
    return 0, (1 << max(a[1], b[1]).bit_length()) - 1


def _compare(op: Ops, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    if op is Ops.CMPLT:
        sure, never = a[1] < b[0], a[0] >= b[1]
    elif op is Ops.CMPLE:
        sure, never = a[1] <= b[0], a[0] > b[1]
    else:
        same = a[0] == a[1] == b[0] == b[1]
        disjoint = a[1] < b[0] or b[1] < a[0]
        sure, never = (same, disjoint) if op is Ops.CMPEQ else (disjoint, same)
    return (1, 1) if sure else (0, 0) if never else (0, 1)


def _alu(u: UOp, r: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The exact interval of ``u``'s operation on its sources' intervals (before fitting), or None where C leaves
    the result undefined (a shift count outside ``[0, bits)``, a divisor that can only be 0)."""
    op = u.op
    if op is Ops.NEG:
        return -r[0][1], -r[0][0]
    if op is Ops.WHERE:
        c, a, b = r
        return a if c[0] >= 1 else b if c[1] <= 0 else (min(a[0], b[0]), max(a[1], b[1]))
    a, b = r
    if op is Ops.ADD:
        return a[0] + b[0], a[1] + b[1]
    if op is Ops.SUB:
        return a[0] - b[1], a[1] - b[0]
    if op is Ops.MUL:
        return _corners(lambda x, y: x * y, a, b)
    if op is Ops.IDIV:
        return _idiv(a, b)
    if op is Ops.MOD:
        return _mod(a, b)
    if op is Ops.MAX:
        return max(a[0], b[0]), max(a[1], b[1])
    if op is Ops.MIN:
        return min(a[0], b[0]), min(a[1], b[1])
    if op in (Ops.SHL, Ops.SHR):
        if b[0] < 0 or b[1] >= max(u.dtype.bits, 1):
            return None  # C leaves the shift undefined
        return _corners((lambda x, y: x << y) if op is Ops.SHL else (lambda x, y: x >> y), a, b)
    if op in (Ops.AND, Ops.OR, Ops.XOR):
        return _bitwise(op, a, b) or _full(u.dtype)  # a negative operand: any value of the dtype, not a wrap
    return _compare(op, a, b)


def _rounds_down(u: UOp, memo: dict[UOp, tuple[int, int]]) -> bool:
    """Whether ``u`` is ``x - x % c`` with ``x >= 0`` and ``c >= 1`` (rounding down to a multiple of ``c``), whose
    value is at least 0; the corner rule alone, which treats the two ``x`` as independent, would allow below 0."""
    x, m = u.src
    return m.op is Ops.MOD and m.src[0] is x and memo[x][0] >= 0 and memo[m.src[1]][0] >= 1


def bounds(node: UOp) -> tuple[int, int]:
    """``(vmin, vmax)`` of the integer expression ``node`` over the bounds of its DEFINE_VARs (module docstring).

    Bool results are 0/1. Raises ``BoundsError`` naming the node for anything that is not integer arithmetic
    (a float, a LOAD, a buffer)."""
    return _ranges(node, exact=False)


def exact_bounds(node: UOp) -> tuple[int, int]:
    """``(vmin, vmax)`` of the integer expression ``node`` as ``bounds`` gives it, where no node can wrap: raises
    ``WrapError`` (a ``BoundsError``) naming the innermost node whose range, computed without wrapping, leaves its
    dtype (``n * 65536`` of an int32 ``n`` in ``[1, 65536]``), a narrowing CAST of a value that does not fit, or a
    shift whose count can leave ``[0, bits)``; ``BoundsError`` for anything that is not integer arithmetic. What the
    queue builder checks every size, byte count and variable value with (docs/lowering.md "Refused")."""
    return _ranges(node, exact=True)


def _wrap_error(u: UOp, lo: int, hi: int) -> WrapError:
    dt = u.dtype
    mn, mx = _full(dt)
    at = f"can be {hi}, above {dt.name}'s largest value {mx}" if hi > mx else \
        f"can be {lo}, below {dt.name}'s smallest value {mn}"
    if u.op is Ops.CAST:
        what = f"the cast of {expr_text(u.src[0])} to {dt.name}"
        hint = f"the cast would wrap silently: narrow the variables' bounds, or keep the value in a dtype that holds it"
    else:
        what = expr_text(u)
        wide = "int64" if dt.kind == "int" or lo < 0 else "uint64"
        var = next(iter(u.variables()), None)
        first = f"{var.arg[0]}.cast(dtypes.{wide})" if var is not None else f"the operands cast to {wide}"
        hint = f"no integer dtype is wider than {dt.name}: narrow the variables' bounds" if dt.bits >= 64 else \
            (f"{dt.name} arithmetic would wrap silently: compute it in {wide} ({first} first) and cast the "
             f"result to {dt.name} where one is needed (that cast is checked)")
    return WrapError(f"{what} {at} (its range without wrapping is [{lo}, {hi}])", u, lo, hi, hint)


def _ranges(node: UOp, exact: bool) -> tuple[int, int]:
    memo: dict[UOp, tuple[int, int]] = {}
    for u in node.toposort():
        dt = u.dtype
        if not dt.is_word:
            raise BoundsError(f"the range of {u.op.name}<{dt.name}> cannot be computed: only integer arithmetic")
        op = u.op
        if op is Ops.CONST:
            v = int(u.arg) if not isinstance(u.arg, str) else None
            if v is None:
                raise BoundsError(f"the range of CONST<{dt.name}> {u.arg!r} cannot be computed")
            got: tuple[int, int] | None = (v, v)
        elif op is Ops.DEFINE_VAR:
            got = (int(u.arg[1]), int(u.arg[2]))
        elif op in (Ops.CAST, Ops.BITCAST, Ops.AFTER):
            if not u.src or not u.src[0].dtype.is_word:
                raise BoundsError(f"the range of {op.name}<{dt.name}> of a non-integer cannot be computed")
            got = memo[u.src[0]]
        elif op in GroupOp.ALU:
            got = _alu(u, [memo[s] for s in u.src])
            if got is not None and op is Ops.SUB and _rounds_down(u, memo):
                got = (max(got[0], 0), got[1])  # x - x % c, x >= 0, c >= 1: a multiple of c, never below 0
        else:
            raise BoundsError(f"the range of {op.name}<{dt.name}> cannot be computed: only integer arithmetic")
        if got is None:
            if exact and op in (Ops.SHL, Ops.SHR):
                b = memo[u.src[1]]
                count = b[0] if b[0] < 0 else b[1]
                raise WrapError(f"{expr_text(u)}: the shift count {expr_text(u.src[1])} can be {count}, outside "
                                f"[0, {dt.bits}) (undefined in C)", u, None, None, f"keep the count in [0, {dt.bits})")
            memo[u] = _full(dt)
            continue
        fit = _fit(dt, *got)
        if exact and fit != got and dt.kind != "bool" and op is not Ops.BITCAST:
            raise _wrap_error(u, *got)
        memo[u] = fit
    return memo[node]


def single_value(node: UOp) -> tuple[bool, Any]:
    """``(True, v)`` when the expression ``node`` takes the one value ``v`` for every value of its variables, else
    ``(False, None)``: a constant, an expression without variables (evaluated, C semantics), or an integer
    expression whose range ``bounds`` is one value (``n >= 1`` for ``n`` in ``[1, 8]`` is True). A node that is not
    arithmetic (a LOAD, a buffer, a queue op) has no value. Bool results are ``bool``; integers ``int``. This is
    what ``bool()``, ``int()``, ``float()`` and ``operator.index`` of a UOp return (``UOp.__bool__``).

    Raises ``ZeroDivisionError`` for an expression without variables that divides by zero."""
    nodes = node.toposort()
    if any(u.op not in VALUE_OPS for u in nodes):
        return False, None
    if not any(u.op is Ops.DEFINE_VAR for u in nodes):
        return True, evaluate(node, {})
    if node.dtype.is_word:
        try:
            lo, hi = bounds(node)
        except BoundsError:
            return False, None
        if lo == hi:
            return True, (bool(lo) if node.dtype.kind == "bool" else lo)
    return False, None


def variable_bounds(node: UOp) -> str:
    """The variables of ``node`` with their bounds, for messages: ``n in [1, 32], m in [0, 7]``."""
    return ", ".join(f"{v.arg[0]} in [{v.arg[1]}, {v.arg[2]}]" for v in node.variables())


_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.SHL: "<<", Ops.SHR: ">>",
          Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.CMPLT: "<", Ops.CMPLE: "<=", Ops.CMPEQ: "==", Ops.CMPNE: "!="}


def expr_text(node: UOp) -> str:
    """An expression in infix form (``(n + 31) // 32``): variables by name, casts left out, other ops by name.

    Iterative, so a deep expression cannot exhaust the recursion limit."""
    text: dict[UOp, str] = {}
    for u in node.toposort():
        s = [text[x] for x in u.src]
        if u.op is Ops.CONST:
            text[u] = str(u.arg)
        elif u.op is Ops.DEFINE_VAR:
            text[u] = str(u.arg[0])
        elif u.op in (Ops.CAST, Ops.BITCAST, Ops.AFTER) and s:
            text[u] = s[0]
        elif u.op in _INFIX and len(s) == 2:
            text[u] = f"({s[0]} {_INFIX[u.op]} {s[1]})"
        elif u.op is Ops.NEG and s:
            text[u] = f"-{s[0]}"
        elif u.op is Ops.WHERE and len(s) == 3:
            text[u] = f"({s[0]} ? {s[1]} : {s[2]})"
        else:
            text[u] = f"{u.op.name.lower()}({', '.join(s)})"
    root = node
    while root.op in (Ops.CAST, Ops.BITCAST, Ops.AFTER) and root.src:
        root = root.src[0]
    out = text[node]
    return out[1:-1] if root.op in _INFIX or root.op is Ops.WHERE else out
