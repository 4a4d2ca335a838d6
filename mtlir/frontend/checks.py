"""The checks of a queue graph's commands, made by ``mtlir.frontend.queue.Queue`` as it builds one and again by the
``encode`` pass: an EXEC's layout (``exec_parts``), dispatch sizes and threads against Metal's limits, the values of
``constant int&`` parameters against their types, the sizes of the buffers bound to kernel parameters.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from mtlir.ir.bounds import BoundsError, WrapError, exact_bounds, expr_text, variable_bounds
from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import MTL, Kernel, KernelParam, element_dtype
from mtlir.ir.ops import GroupOp, Ops
from mtlir.ir.spec import value_problem
from mtlir.ir.uop import UOp
from mtlir.frontend.nodes import QueueError, buffer_base, buffer_label, buffer_nbytes, is_buffer, node_text

__all__ = ["ExecParts", "ExecChecks", "exec_parts", "param_dtype", "var_dtype", "int_expression", "check_size",
           "check_threads", "check_var_value", "check_const", "check_elements", "wrap_message", "SIZE_OPS", "MAX_SIZE",
           "MAX_THREADS"]

MAX_SIZE = 2**32 - 1  # the largest grid or threadgroup size (threadgroups or threads per axis) encode accepts
MAX_THREADS = 2**32 - 1  # threads per axis (grid x threadgroup): MSL thread positions are 32-bit uint
SIZE_OPS = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.CAST}) | GroupOp.ALU


def param_dtype(name: str) -> DType:
    """The dtype of a kernel parameter's element type name (``"float32"``, ``"int"``, ``"dtypes.float"``:
    ``mtlir.metal.element_dtype``).

    Raises ``QueueError`` for an unknown name."""
    try:
        return element_dtype(name)
    except ValueError as e:
        raise QueueError(str(e)) from None


class ExecParts(NamedTuple):
    """An EXEC's sources by role: ``kernel`` (Kernel), ``grid`` and ``threadgroup`` (MTLSize STRUCT nodes),
    ``buffers`` and ``vars`` (UOps, one per buffer / variable parameter of the kernel)."""

    kernel: Kernel
    grid: UOp
    threadgroup: UOp
    buffers: tuple[UOp, ...]
    vars: tuple[UOp, ...]


class ExecChecks:
    """What a builder already checked, so each distinct size, dispatch shape, variable value and binding is checked
    once (a queue of 100,000 commands names a few dozen of each): ``sizes`` maps an MTLSize STRUCT that passed
    ``check_size`` on every axis to its axes' ranges ``(lo, hi)``; ``threads`` holds the (grid, threadgroup)
    pairs that passed ``check_threads``; ``values`` the (value, dtype) pairs that passed ``check_var_value``;
    ``elements`` the (parameter, buffer) pairs that passed ``check_elements``; ``variables`` each run-time
    variable's DEFINE_VAR by name (``declared``: one node per name). Only passed checks are kept: a bad
    node raises its error every time it is met. The memo holds its nodes: keep one per queue or per lowering."""

    def __init__(self) -> None:
        self.sizes: dict[UOp, tuple[tuple[int, int], ...]] = {}
        self.threads: set[tuple[UOp, UOp]] = set()
        self.values: set[tuple[UOp, DType]] = set()
        self.elements: set[tuple[KernelParam, UOp]] = set()
        self.variables: dict[str, UOp] = {}  # each run-time variable's one DEFINE_VAR, by name
        self.variables_seen: set[UOp] = set()  # the expressions ``declared`` passed

    def declared(self, expr: UOp, where: str) -> None:
        """Check that each DEFINE_VAR of ``expr`` is the only one of its name met by this memo: two with one name
        and other bounds or dtypes would bind one value to both (the second's bounds unchecked). Raises
        ``QueueError`` naming ``where`` and both declarations."""
        if expr in self.variables_seen:
            return
        for u in expr.toposort():
            if u.op is Ops.DEFINE_VAR:
                first = self.variables.setdefault(u.arg[0], u)
                if first is not u:
                    raise QueueError(f"{where}: variable {u.arg[0]!r} is declared twice: {first.dtype.name} in "
                                     f"[{first.arg[1]}, {first.arg[2]}] and {u.dtype.name} in [{u.arg[1]}, "
                                     f"{u.arg[2]}] (one name is one run-time value: build its UOp.variable once "
                                     "and use that node everywhere)")
        self.variables_seen.add(expr)

    def size(self, node: UOp, label: str, where: str) -> tuple[tuple[int, int], ...]:
        """The ranges of the axes of ``node``, an MTLSize STRUCT (``label``: grid or threadgroup), each checked by
        ``check_size``. Raises ``QueueError`` naming ``where``."""
        got = self.sizes.get(node)
        if got is None:
            if node.op is not Ops.STRUCT or node.dtype is not dtypes.MTLSize or len(node.src) != 3:
                raise QueueError(f"{where}: {label} must be an MTLSize STRUCT, got {node_text(node)}")
            got = tuple(check_size(f, f"{where}: {label}.{axis}") for axis, f in zip("xyz", node.src))
            self.declared(node, f"{where}: {label}")
            self.sizes[node] = got
        return got

    def dispatch(self, grid: UOp, threadgroup: UOp, where: str) -> None:
        """Check both sizes and the threads of a dispatch (``check_size``, ``check_threads``)."""
        if (grid, threadgroup) not in self.threads:
            check_threads(self.size(grid, "grid", where), self.size(threadgroup, "threadgroup", where), grid,
                          threadgroup, where)
            self.threads.add((grid, threadgroup))

    def value(self, v: UOp, dt: DType, where: str) -> None:
        """``check_var_value(v, dt, where)``, once per (v, dt)."""
        if (v, dt) not in self.values:
            check_var_value(v, dt, where)
            self.declared(v, where)
            self.values.add((v, dt))

    def binding(self, p: KernelParam, b: UOp, where: str) -> None:
        """``check_elements(p, b, where)``, once per (p, b); nothing to do for a parameter without ``elements``."""
        if p.elements is not None and (p, b) not in self.elements:
            check_elements(p, b, where)
            self.elements.add((p, b))


def exec_parts(node: UOp, where: str = "EXEC", checks: ExecChecks | None = None) -> ExecParts:
    """Split an EXEC node into its parts, checking the layout of ``mtlir.frontend.nodes``' docstring, its sizes
    and threads against Metal's limits, its buffers' sizes and its variables' values; ``checks`` (an
    ``ExecChecks``) skips what was checked before.

    Raises ``QueueError`` naming ``where`` (e.g. ``"command 3"``) and the bad source."""
    src = node.src
    if node.op is not Ops.EXEC or len(src) < 3 or src[0].op is not Ops.KERNEL or not isinstance(src[0].arg, Kernel):
        raise QueueError(f"{where}: an EXEC's sources are (KERNEL, grid, threadgroup, *buffers, *vars)")
    kernel: Kernel = src[0].arg
    nb, nv = len(kernel.buffer_params), len(kernel.var_params)
    if len(src) != 3 + nb + nv:
        raise QueueError(f"{where}: kernel {kernel.key!r} takes {nb} buffers and {nv} variables, the EXEC has "
                         f"{len(src) - 3} buffer and variable sources")
    parts = ExecParts(kernel, src[1], src[2], src[3:3 + nb], src[3 + nb:])
    memo = checks if checks is not None else ExecChecks()
    memo.dispatch(parts.grid, parts.threadgroup, where)
    for p, b in zip(kernel.buffer_params, parts.buffers):
        base, _ = buffer_base(b)
        if not is_buffer(base):
            raise QueueError(f"{where}: buffer parameter {p.index} of {kernel.key!r} is {node_text(b)}, not a buffer")
        memo.binding(p, b, where)
    for p, v in zip(kernel.var_params, parts.vars):
        if not v.dtype.is_int or v.op not in SIZE_OPS:
            raise QueueError(f"{where}: variable {p.var!r} (parameter {p.index}) of {kernel.key!r} must be an "
                             f"integer constant or an expression of run-time variables, got {node_text(v)}")
        memo.value(v, var_dtype(kernel, p, where), f"{where}: variable {p.var!r} (parameter {p.index})")
    return parts


def int_expression(f: UOp, where: str, what: str) -> tuple[int, int]:
    """The range of an integer expression of CONSTs, DEFINE_VARs, CASTs and ALU ops over its variables' bounds,
    computed without wrapping (``mtlir.ir.bounds.exact_bounds``).

    Raises ``QueueError`` naming ``where`` for another node, a non-integer node (a float variable), a DEFINE_VAR
    whose declared bounds do not fit its own dtype, a node that breaks ``mtlir.ir.spec``'s rules (an ADD with one
    source or of two dtypes, a DEFINE_VAR with min > max: a node built with ``UOp(...)`` by hand), or a node whose
    value can leave its dtype (``m * 65536`` of an int32 ``m`` in ``[1, 65536]``: the kernel would get the wrapped
    value), with the expression, the node, its range without wrapping and the variables' bounds, suggesting a wider
    dtype."""
    for u in f.toposort():
        if u.op not in SIZE_OPS:
            raise QueueError(f"{where}: {what} must be an expression of run-time variables, found {node_text(u)}")
        if u.op is Ops.CONST:
            check_const(u, where)
        if not u.dtype.is_int:
            name = f" {u.arg[0]!r}" if u.op is Ops.DEFINE_VAR else ""
            raise QueueError(f"{where}: {what} must be an integer expression, found {u.op.name}<{u.dtype.name}>"
                             f"{name}")
        if u.op is Ops.DEFINE_VAR and type(u.arg) is tuple and len(u.arg) == 3:  # a bad arg: value_problem's
            name, lo, hi = u.arg
            if type(lo) is type(hi) is int and lo <= hi and (lo < dtypes.min(u.dtype) or hi > dtypes.max(u.dtype)):
                raise QueueError(f"{where}: variable {name!r} has bounds [{lo}, {hi}], which do not fit its dtype "
                                 f"{u.dtype.name} [{dtypes.min(u.dtype)}, {dtypes.max(u.dtype)}]")
        problem = value_problem(u)  # a node built by hand: its sources' number and dtypes, a DEFINE_VAR's arg
        if problem is not None:
            raise QueueError(f"{where}: {what}: {problem}, at {node_text(u)}")
    try:
        return exact_bounds(f)
    except WrapError as e:
        raise QueueError(wrap_message(e, f, where, what)) from None
    except BoundsError as e:
        raise QueueError(f"{where}: {e}") from None


def wrap_message(e: WrapError, f: UOp, where: str, what: str) -> str:
    """The message of a ``WrapError`` met in ``f`` (``what``: "a size", "a variable value", ...) at ``where``."""
    inner = "" if e.node is f else f" {expr_text(f)}"
    return f"{where}: {what}{inner} cannot be computed in its dtype: {e} for {variable_bounds(f)}; {e.hint}"


def _strip_casts(v: UOp, lo: int, hi: int) -> UOp:
    """``v`` without its outer integer CASTs to dtypes that hold ``[lo, hi]``: once the inner value is checked
    against ``[lo, hi]``, those casts cannot wrap it (a narrower cast is left, and checked as a node)."""
    while (v.op is Ops.CAST and v.src[0].dtype.is_int and v.dtype.kind in ("int", "uint")
           and dtypes.min(v.dtype) <= lo and hi <= dtypes.max(v.dtype)):
        v = v.src[0]
    return v


def check_const(c: UOp, where: str) -> None:
    """Check an integer CONST's value is of its kind and fits its dtype, as ``UOp.const`` makes it: a CONST built
    with ``UOp(Ops.CONST, ...)`` skips those checks, and a float there was cut toward zero when written, a bool
    taken as 0 or 1, an int past the dtype refused only at link (a raw struct error). Bool CONSTs are not checked.

    Raises ``QueueError`` naming ``where`` (the command and the size or parameter) and the value."""
    dt, v = c.dtype, c.arg
    if dt.kind not in ("int", "uint"):
        return
    if type(v) is not int:
        raise QueueError(f"{where}: CONST<{dt.name}> {v!r} is a {type(v).__name__}, not an int (UOp.const("
                         f"dtypes.{dt.name}, ...) checks and converts a value)")
    if not dtypes.min(dt) <= v <= dtypes.max(dt):
        raise QueueError(f"{where}: CONST<{dt.name}> {v} does not fit its dtype [{dtypes.min(dt)}, "
                         f"{dtypes.max(dt)}]")


def check_size(f: UOp, where: str) -> tuple[int, int]:
    """Check one dispatch size: an integer constant or an integer expression of run-time variables whose every
    value, over the variables' bounds, lies in ``[1, MAX_SIZE]``, where no node can wrap (``int_expression``; outer
    CASTs to a dtype that holds ``[1, MAX_SIZE]`` are looked through). Returns its range ``(lo, hi)``.

    Raises ``QueueError`` naming ``where`` (the command and axis), with the expression and the variables' bounds."""
    if not f.dtype.is_int:
        raise QueueError(f"{where}: a size must be an integer, got dtype {f.dtype.name}")
    f = _strip_casts(f, 1, MAX_SIZE)
    if f.op is Ops.CONST:
        check_const(f, where)
        if not 1 <= f.arg <= MAX_SIZE:
            raise QueueError(f"{where}: size {f.arg} is {'below 1' if f.arg < 1 else 'above 2**32-1'}")
        return (f.arg, f.arg)
    lo, hi = int_expression(f, where, "a size")
    if lo < 1 or hi > MAX_SIZE:
        what = f"can be {lo}, below 1" if lo < 1 else f"can be {hi}, above 2**32-1"
        fix = f"({expr_text(f)}).maximum(1)" if lo < 1 else f"({expr_text(f)}).minimum(2**32 - 1)"
        raise QueueError(f"{where}: size {expr_text(f)} {what} (for {variable_bounds(f)}); a size must stay in "
                         f"[1, 2**32-1] for every value of its variables: e.g. {fix} (MAX/MIN nodes; Python's "
                         f"max() and min() cannot compare run-time values)")
    return (lo, hi)


def _size_text(size: UOp) -> str:
    return "(" + ", ".join(expr_text(f) for f in size.src) + ")"


def check_threads(grid: Sequence[tuple[int, int]], threadgroup: Sequence[tuple[int, int]], grid_node: UOp,
                  tg_node: UOp, where: str) -> None:
    """Check the threads of one dispatch, given the range ``(lo, hi)`` of each axis of its grid (threadgroups) and
    threadgroup (threads): at most ``MTL.MAX_THREADS_PER_THREADGROUP`` (1024, every Apple GPU family) threads in a
    threadgroup, and at most ``MAX_THREADS`` (2**32-1) threads per axis in the grid (MSL thread positions are
    32-bit uint), for every value of the variables.

    Raises ``QueueError`` naming ``where`` (the command) with the sizes and the variables' bounds."""
    total = threadgroup[0][1] * threadgroup[1][1] * threadgroup[2][1]
    limit = MTL.MAX_THREADS_PER_THREADGROUP
    if total > limit:
        at = "" if tg_node.op is Ops.STRUCT and all(f.op is Ops.CONST for f in tg_node.src) else \
            f" (for {variable_bounds(tg_node)})"
        raise QueueError(f"{where}: threadgroup {_size_text(tg_node)} can have {total} threads{at}, above Metal's "
                         f"maximum of {limit} threads per threadgroup (every Apple GPU family)")
    for axis, (_, g), (_, t), gf, tf in zip("xyz", grid, threadgroup, grid_node.src, tg_node.src):
        if g * t > MAX_THREADS:
            at = "" if gf.op is Ops.CONST and tf.op is Ops.CONST else \
                f" (for {variable_bounds(UOp.sink(gf, tf))})"
            raise QueueError(f"{where}: grid.{axis} x threadgroup.{axis} = {expr_text(gf)} x {expr_text(tf)} can be "
                             f"{g * t} threads{at}, above 2**32-1: MSL thread positions are 32-bit uint")


def check_var_value(v: UOp, dt: DType, where: str) -> None:
    """Check the value of a ``constant int&`` parameter of dtype ``dt``: an integer constant or integer expression
    of run-time variables (each with bounds that fit its own dtype) whose every value fits ``dt``, so nothing is
    cut when the value is written into the parameter's slot, and where no node wraps (``int_expression``: int32
    ``m * 65536`` is refused; ``(m.cast(dtypes.int64) * 65536).cast(dtypes.int32)`` is checked against int32).

    Raises ``QueueError`` naming ``where`` (the command and the parameter) with the value's range."""
    mn, mx = dtypes.min(dt), dtypes.max(dt)
    v = _strip_casts(v, mn, mx)  # a CAST to the parameter's type: the value inside must fit it
    lo, hi = int_expression(v, where, "a variable value")
    if lo < mn or hi > mx:
        text = str(v.arg) if v.op is Ops.CONST else f"{expr_text(v)} in [{lo}, {hi}] (for {variable_bounds(v)})"
        raise QueueError(f"{where}: value {text} does not fit the parameter's type {dt.name} [{mn}, {mx}]")


def check_elements(p: KernelParam, b: UOp, where: str) -> None:
    """Check a buffer or view bound to buffer parameter ``p`` holds ``p.elements`` elements (when given): a view's
    size, a buffer's size, at least ``elements * itemsize`` bytes. A buffer variable is not checked (its size is
    known at run time only). Raises ``QueueError`` naming ``where``, the parameter and both sizes."""
    if p.elements is None:
        return
    have = buffer_nbytes(b)
    need = p.elements * (param_dtype(p.dtype).itemsize or 1)
    if have is not None and have < need:
        what = f"view of {buffer_label(b.src[0])}" if b.op is Ops.BUFFER_VIEW else f"buffer {buffer_label(b)}"
        raise QueueError(f"{where}: buffer parameter {p.index} takes {p.elements} elements of {p.dtype} ({need} "
                         f"bytes), but the {what} bound to it holds {have} bytes")


def var_dtype(kernel: Kernel, p: KernelParam, where: str) -> DType:
    """The integer dtype of a ``constant int&`` parameter. Raises ``QueueError`` for a non-integer type."""
    dt = param_dtype(p.dtype)
    if not dt.is_int or dt.kind == "bool":
        raise QueueError(f"{where}: variable parameter {p.var!r} (index {p.index}) of {kernel.key!r} has element "
                         f"type {p.dtype!r}; constant int& variables are integers (KernelParam(..., dtype='int32'))")
    return dt
