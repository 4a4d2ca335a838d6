"""The queue graph: the front end's vocabulary, built from Python with ``Queue`` or from a trace
(``mtlir.frontend.trace``).

A queue graph is one SUBMIT node whose sources are the queue operations in order (docs/lowering.md, "The queue
graph"). Layouts, all checked by ``Queue`` as they are built and again by the ``encode`` pass:

| node | dtype | src | arg |
|---|---|---|---|
| SUBMIT | void | the queue ops (EXEC, WAIT, SIGNAL, TIMESTAMP, COPY, FILL) in order | ``DeviceSpec`` |
| EXEC | void | ``(KERNEL, grid, threadgroup, *buffers, *vars)`` | None |
| KERNEL | void | () | ``mtlir.metal.Kernel`` |
| WAIT / SIGNAL | void | ``(event, value)``: the event placeholder, a uint64 value | None |
| TIMESTAMP | void | () | the slot (int >= 0) |
| COPY | void | ``(src, src_offset, dst, dst_offset, size)``: buffers (BUFFER or buffer variable), uint64 bytes | None |
| FILL | void | ``(buffer, offset, size)``: a buffer, uint64 bytes | the byte value (0..255) |
| BUFFER | id | () | ``(name, nbytes)``; the placeholder link creates is ``buffer:<name>`` |
| BUFFER_VIEW | id | ``(BUFFER or buffer variable,)`` | ``(offset, nbytes)`` in bytes |

``grid`` and ``threadgroup`` are ``STRUCT`` nodes of dtype MTLSize whose three fields are uint64: constants or
expressions of run-time variables (DEFINE_VAR). Grid sizes count threadgroups, threadgroup sizes count threads
(Metal's ``dispatchThreadgroups:threadsPerThreadgroup:``). ``buffers`` are one per buffer parameter of the kernel, in
order: a BUFFER, a BUFFER_VIEW, or a *buffer variable* (a DEFINE_VAR of dtype id: an MTLBuffer handle given per
submit, "a rebound input"). ``vars`` are one per ``constant int&`` parameter, in order: integer constants or
expressions of DEFINE_VARs, of the parameter's dtype.

Several queues on one device (docs/lowering.md, "Several queues"): each ``Queue(device, name=...)`` has its own
command queue, fence and timeline (placeholders ``queue:<name>``, ``fence:<name>``, ``event:<name>``; the default
queue, ``name=None``, keeps ``queue``, ``fence`` and ``event``), and its SUBMIT carries the name as its tag (None for
the default queue).
``queues(*qs)`` joins them into one queue graph, ``SINK(SUBMIT, SUBMIT, ...)`` (arg: the DeviceSpec), submitted in
that order. ``shared_event(name)`` is an event no queue owns (``event:<name>``, signaled by queues or the host).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from mtlir.ir.bounds import BoundsError, bounds, expr_text, variable_bounds
from mtlir.errors import InputError
from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import MTL, DeviceSpec, Kernel, KernelParam, Obj, element_dtype
from mtlir.ir.ops import GroupOp, Ops
from mtlir.ir.uop import UOp

__all__ = ["Queue", "QueueError", "queues", "shared_event", "timeline_name", "buffer", "view", "buffer_variable",
           "timeline", "timeline_value", "ExecParts", "exec_parts", "buffer_base", "buffer_nbytes", "placeholder_name",
           "param_dtype", "var_dtype",
           "check_size", "check_threads", "check_var_value", "check_elements", "SIZE_OPS", "MAX_SIZE", "MAX_THREADS",
           "MAX_BUFFER_BYTES"]

MAX_HANDLE = 2**64 - 1
MAX_SIZE = 2**32 - 1  # the largest grid or threadgroup size (threadgroups or threads per axis) encode accepts
MAX_THREADS = 2**32 - 1  # threads per axis (grid x threadgroup): MSL thread positions are 32-bit uint
# the largest buffer a queue (built by hand or loaded from a trace) may declare: 64 GiB, more than any Apple GPU's
# memory. The device's own limit (MTLDevice.maxBufferLength, smaller) is checked when link creates the buffer.
MAX_BUFFER_BYTES = 2**36
SIZE_OPS = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.CAST}) | GroupOp.ALU


class QueueError(InputError, ValueError):
    """A queue operation built with bad input; the message names the command (its index in the queue) and the
    argument."""


def timeline(queue: str | None = None) -> UOp:
    """A queue's timeline: its MTLSharedEvent placeholder (dtype id): ``Obj("event", "event")`` for the default
    queue, ``Obj("event", "event:<queue>")`` for a named one."""
    return UOp(Ops.OBJECT, dtypes.id, (), Obj("event", timeline_name(queue)))


def timeline_name(queue: str | None) -> str:
    """The placeholder name of a queue's timeline: ``event`` (default queue) or ``event:<queue>``."""
    return "event" if queue is None else f"event:{queue}"


def shared_event(name: str) -> UOp:
    """An MTLSharedEvent no queue owns (placeholder ``event:<name>``): queues wait for it and signal it, the host
    signals it (``Session.signal_event``). Raises ``QueueError`` for a name that is not a Python identifier."""
    if not isinstance(name, str) or not name.isidentifier():
        raise QueueError(f"shared_event: the name must be an identifier (letters, digits, _), got {name!r}")
    return UOp(Ops.OBJECT, dtypes.id, (), Obj("event", f"event:{name}"))


def timeline_value(name: str = "timeline") -> UOp:
    """The run-time value a submit signals (uint64 in ``[1, 2**63-1]``), so one Program replays many submits."""
    return UOp.variable(name, 1, 2**63 - 1, dtypes.uint64)


def buffer(name: str, nbytes: int, tag: object = None) -> UOp:
    """A device buffer placeholder of ``nbytes`` bytes (BUFFER, dtype id); link creates ``buffer:<name>``.

    Raises ``QueueError`` for an empty name, a size below 1 byte or above ``MAX_BUFFER_BYTES`` (2**36, 64 GiB: the
    trace loader's limit too)."""
    if not isinstance(name, str) or not name:
        raise QueueError(f"buffer: the name must be a non-empty string, got {name!r}")
    if type(nbytes) is not int or nbytes < 1:
        raise QueueError(f"buffer {name!r}: nbytes must be an int >= 1, got {nbytes!r}")
    if nbytes > MAX_BUFFER_BYTES:
        raise QueueError(f"buffer {name!r}: {nbytes} bytes is above 2**36 (64 GiB), more than any Apple GPU has: "
                         "it cannot be created")
    return UOp(Ops.BUFFER, dtypes.id, (), (name, nbytes), tag)


def buffer_variable(name: str) -> UOp:
    """A buffer bound per submit: its MTLBuffer handle is a run-time value (DEFINE_VAR of dtype id) named
    ``name``, given to each run like any variable. Every ICB command that binds it is rebound per submit."""
    return UOp.variable(name, 1, MAX_HANDLE, dtypes.id)


def buffer_base(node: UOp) -> tuple[UOp, int]:
    """The buffer (BUFFER or buffer variable) under ``node`` and the byte offset of ``node`` into it."""
    if node.op is Ops.BUFFER_VIEW:
        return node.src[0], node.arg[0]
    return node, 0


def buffer_nbytes(node: UOp) -> int | None:
    """The size in bytes of a BUFFER or BUFFER_VIEW; None for a buffer variable (unknown until run time)."""
    if node.op is Ops.BUFFER:
        return int(node.arg[1])
    if node.op is Ops.BUFFER_VIEW:
        return int(node.arg[1])
    return None


def view(buf: UOp, offset: int, nbytes: int) -> UOp:
    """``nbytes`` bytes of ``buf`` from byte ``offset`` (BUFFER_VIEW). A view of a view is a view of its buffer.

    Raises ``QueueError`` when ``buf`` is not a buffer, the offset is negative, the size is below 1, or the view
    runs past the end of the buffer."""
    base, off0 = buffer_base(buf)
    if not _is_buffer(base):
        raise QueueError(f"view: {_short(buf)} is not a buffer (BUFFER, BUFFER_VIEW or buffer_variable)")
    if type(offset) is not int or offset < 0:
        raise QueueError(f"view of {_bufname(base)}: offset must be an int >= 0, got {offset!r}")
    if type(nbytes) is not int or nbytes < 1:
        raise QueueError(f"view of {_bufname(base)}: nbytes must be an int >= 1, got {nbytes!r}")
    limit = buffer_nbytes(buf)
    if limit is not None and offset + nbytes > limit:
        raise QueueError(f"view of {_bufname(base)}: bytes [{offset}, {offset + nbytes}) run past the end of the "
                         f"{limit}-byte {'view' if buf.op is Ops.BUFFER_VIEW else 'buffer'}")
    return UOp(Ops.BUFFER_VIEW, dtypes.id, (base,), (off0 + offset, nbytes))


def placeholder_name(buf: UOp) -> str:
    """The name of the placeholder link makes for a BUFFER (``buffer:<name>``) or a buffer variable
    (``input:<name>``)."""
    return f"buffer:{buf.arg[0]}" if buf.op is Ops.BUFFER else f"input:{buf.arg[0]}"


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


def exec_parts(node: UOp, where: str = "EXEC") -> ExecParts:
    """Split an EXEC node into its parts, checking the layout of the module docstring.

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
    ranges = []
    for label, size in (("grid", parts.grid), ("threadgroup", parts.threadgroup)):
        if size.op is not Ops.STRUCT or size.dtype is not dtypes.MTLSize or len(size.src) != 3:
            raise QueueError(f"{where}: {label} must be an MTLSize STRUCT, got {_short(size)}")
        ranges.append(tuple(check_size(f, f"{where}: {label}.{axis}") for axis, f in zip("xyz", size.src)))
    check_threads(ranges[0], ranges[1], parts.grid, parts.threadgroup, where)
    for p, b in zip(kernel.buffer_params, parts.buffers):
        base, _ = buffer_base(b)
        if not _is_buffer(base):
            raise QueueError(f"{where}: buffer parameter {p.index} of {kernel.key!r} is {_short(b)}, not a buffer")
        check_elements(p, b, where)
    for p, v in zip(kernel.var_params, parts.vars):
        if not v.dtype.is_int or v.op not in SIZE_OPS:
            raise QueueError(f"{where}: variable {p.var!r} (parameter {p.index}) of {kernel.key!r} must be an "
                             f"integer constant or an expression of run-time variables, got {_short(v)}")
        check_var_value(v, var_dtype(kernel, p, where), f"{where}: variable {p.var!r} (parameter {p.index})")
    return parts


def _int_expression(f: UOp, where: str, what: str) -> tuple[int, int]:
    """The range of an integer expression of CONSTs, DEFINE_VARs, CASTs and ALU ops over its variables' bounds.

    Raises ``QueueError`` naming ``where`` for another node, a non-integer node (a float variable), or a
    DEFINE_VAR whose declared bounds do not fit its own dtype."""
    for u in f.toposort():
        if u.op not in SIZE_OPS:
            raise QueueError(f"{where}: {what} must be an expression of run-time variables, found {_short(u)}")
        if not u.dtype.is_int:
            name = f" {u.arg[0]!r}" if u.op is Ops.DEFINE_VAR else ""
            raise QueueError(f"{where}: {what} must be an integer expression, found {u.op.name}<{u.dtype.name}>"
                             f"{name}")
        if u.op is Ops.DEFINE_VAR:
            name, lo, hi = u.arg
            if lo < dtypes.min(u.dtype) or hi > dtypes.max(u.dtype):
                raise QueueError(f"{where}: variable {name!r} has bounds [{lo}, {hi}], which do not fit its dtype "
                                 f"{u.dtype.name} [{dtypes.min(u.dtype)}, {dtypes.max(u.dtype)}]")
    try:
        return bounds(f)
    except BoundsError as e:
        raise QueueError(f"{where}: {e}") from None


def check_size(f: UOp, where: str) -> tuple[int, int]:
    """Check one dispatch size: an integer constant or an integer expression of run-time variables whose every
    value, over the variables' bounds, lies in ``[1, MAX_SIZE]`` (``mtlir.ir.bounds``: C semantics, so an expression
    that can wrap around is refused too). Returns its range ``(lo, hi)``.

    Raises ``QueueError`` naming ``where`` (the command and axis), with the expression and the variables' bounds."""
    if not f.dtype.is_int:
        raise QueueError(f"{where}: a size must be an integer, got dtype {f.dtype.name}")
    if f.op is Ops.CONST:
        if not 1 <= f.arg <= MAX_SIZE:
            raise QueueError(f"{where}: size {f.arg} is {'below 1' if f.arg < 1 else 'above 2**32-1'}")
        return (f.arg, f.arg)
    lo, hi = _int_expression(f, where, "a size")
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
    cut when the value is written into the parameter's slot.

    Raises ``QueueError`` naming ``where`` (the command and the parameter) with the value's range."""
    while v.op is Ops.CAST and v.src[0].dtype.is_int:  # a CAST to the parameter's type must not wrap the value
        v = v.src[0]
    lo, hi = _int_expression(v, where, "a variable value")
    mn, mx = dtypes.min(dt), dtypes.max(dt)
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
        what = f"view of {_bufname(b.src[0])}" if b.op is Ops.BUFFER_VIEW else f"buffer {_bufname(b)}"
        raise QueueError(f"{where}: buffer parameter {p.index} takes {p.elements} elements of {p.dtype} ({need} "
                         f"bytes), but the {what} bound to it holds {have} bytes")


def var_dtype(kernel: Kernel, p: KernelParam, where: str) -> DType:
    """The integer dtype of a ``constant int&`` parameter. Raises ``QueueError`` for a non-integer type."""
    dt = param_dtype(p.dtype)
    if not dt.is_int or dt.kind == "bool":
        raise QueueError(f"{where}: variable parameter {p.var!r} (index {p.index}) of {kernel.key!r} has element "
                         f"type {p.dtype!r}; constant int& variables are integers (KernelParam(..., dtype='int32'))")
    return dt


def _is_buffer(node: UOp) -> bool:
    return node.op is Ops.BUFFER or (node.op is Ops.DEFINE_VAR and node.dtype is dtypes.id)


def _bufname(node: UOp) -> str:
    return repr(node.arg[0]) if node.op in (Ops.BUFFER, Ops.DEFINE_VAR) else node.op.name


def _short(node: UOp) -> str:
    """A one-line description of a node that needs no printer (dtype, op, a short arg)."""
    arg = "" if node.arg is None else f" {str(node.arg)[:60]}"
    return f"{node.op.name}<{node.dtype.name}>{arg}"


def _size(v: UOp | int, where: str) -> UOp:
    if isinstance(v, bool) or not isinstance(v, (int, UOp)):
        raise QueueError(f"{where}: a size must be an int or an expression of run-time variables, got {v!r}")
    if isinstance(v, int):
        if not 1 <= v <= MAX_SIZE:
            raise QueueError(f"{where}: size {v} is {'below 1' if v < 1 else 'above 2**32-1'}")
        return UOp.const(dtypes.uint64, v)
    check_size(v, where)
    return v.cast(dtypes.uint64)


def _mtlsize(sizes: Sequence[UOp | int], where: str) -> UOp:
    if isinstance(sizes, (int, UOp)):
        sizes = (sizes,)
    if not isinstance(sizes, (tuple, list)) or not 1 <= len(sizes) <= 3:
        raise QueueError(f"{where}: expected 1 to 3 sizes (x, y, z), got {sizes!r}")
    full = (*sizes, *(1,) * (3 - len(sizes)))
    return UOp.struct(dtypes.MTLSize, *(_size(v, f"{where}.{a}") for v, a in zip(full, "xyz")))


class Queue:
    """Builds the queue graph of one submit for ``device`` (a ``DeviceSpec``: GPU family, residency set, ICB).

    ``q.exec(kernel, buffers, vars, grid, threadgroup)``, ``q.wait(event, value)``, ``q.signal(event, value)``,
    ``q.timestamp(slot)`` append queue operations (each returns the queue, so calls chain); ``q.submit()`` returns
    the SUBMIT node. ``q.timeline`` is the event placeholder every signal and wait of this queue names; a wait on
    it lowers to nothing (the fence orders the queue, METAL.md §1). Every method raises ``QueueError`` naming the
    command index and the argument at fault.

    >>> q = Queue(DeviceSpec("Apple9"))
    >>> q.exec(saxpy, [x, y], [n], grid=((n + 31) // 32,), threadgroup=(32,)).signal(q.timeline, timeline_value())
    """

    def __init__(self, device: DeviceSpec | None = None, name: str | None = None) -> None:
        if device is not None and not isinstance(device, DeviceSpec):
            raise QueueError(f"Queue: device must be a DeviceSpec, got {device!r}")
        if name is not None and (not isinstance(name, str) or not name.isidentifier()):
            raise QueueError(f"Queue: the name must be an identifier (letters, digits, _) or None, got {name!r}")
        self.device = device or DeviceSpec()
        self.name = name
        self.timeline = timeline(name)
        self.ops: list[UOp] = []
        self._kernels: dict[Kernel, UOp] = {}
        self._stamped: dict[int, int] = {}  # timestamp slot -> the number of commands before it
        self.ncommands = 0

    def exec(self, kernel: Kernel, buffers: Sequence[UOp], vars: Sequence[UOp | int] = (),
             grid: Sequence[UOp | int] = (1, 1, 1), threadgroup: Sequence[UOp | int] = (1, 1, 1)) -> Queue:
        """Dispatch ``kernel`` over ``grid`` threadgroups of ``threadgroup`` threads.

        ``buffers``: one per buffer parameter (BUFFER, BUFFER_VIEW or buffer_variable). ``vars``: one per
        ``constant int&`` parameter (an int or an integer expression of run-time variables). ``grid`` /
        ``threadgroup``: 1 to 3 sizes (missing ones are 1), each an int >= 1 or an expression of variables."""
        where = f"command {self.ncommands} ({getattr(kernel, 'key', '?')})"
        if not isinstance(kernel, Kernel):
            raise QueueError(f"{where}: kernel must be an mtlir.metal.Kernel, got {type(kernel).__name__}")
        knode = self._kernels.get(kernel)
        if knode is None:
            knode = self._kernels[kernel] = UOp(Ops.KERNEL, dtypes.void, (), kernel)
        bparams, vparams = kernel.buffer_params, kernel.var_params
        buffers, vars = tuple(buffers), tuple(vars)
        if len(buffers) != len(bparams):
            raise QueueError(f"{where}: kernel takes {len(bparams)} buffers, got {len(buffers)}")
        if len(vars) != len(vparams):
            raise QueueError(f"{where}: kernel takes {len(vparams)} variables "
                             f"({', '.join(str(p.var) for p in vparams) or 'none'}), got {len(vars)}")
        for p, b in zip(bparams, buffers):
            if not isinstance(b, UOp) or not _is_buffer(buffer_base(b)[0]):
                raise QueueError(f"{where}: buffer parameter {p.index} must be a buffer or a view, got {b!r}")
        vnodes = []
        for p, v in zip(vparams, vars):
            dt = var_dtype(kernel, p, where)
            if isinstance(v, bool) or not isinstance(v, (int, UOp)):
                raise QueueError(f"{where}: variable {p.var!r} must be an int or a UOp, got {v!r}")
            if isinstance(v, int):
                if not dtypes.min(dt) <= v <= dtypes.max(dt):
                    raise QueueError(f"{where}: variable {p.var!r} (parameter {p.index}): value {v} does not fit the "
                                     f"parameter's type {dt.name} [{dtypes.min(dt)}, {dtypes.max(dt)}]")
                vnodes.append(UOp.const(dt, v))
                continue
            if not v.dtype.is_int:
                raise QueueError(f"{where}: variable {p.var!r} must be an integer, got dtype {v.dtype.name}")
            check_var_value(v, dt, f"{where}: variable {p.var!r} (parameter {p.index})")
            vnodes.append(v.cast(dt))
        node = UOp(Ops.EXEC, dtypes.void, (knode, _mtlsize(grid, f"{where}: grid"),
                                           _mtlsize(threadgroup, f"{where}: threadgroup"), *buffers, *vnodes))
        exec_parts(node, where)
        self.ops.append(node)
        self.ncommands += 1
        return self

    def _event_op(self, op: Ops, event: UOp, value: UOp | int, what: str) -> Queue:
        where = f"{what} after command {self.ncommands}"
        if not isinstance(event, UOp) or event.op is not Ops.OBJECT or not isinstance(event.arg, Obj) \
                or event.arg.kind != "event":
            raise QueueError(f"{where}: the event must be an event placeholder (a queue's timeline or a "
                             f"shared_event), got {event!r}")
        if isinstance(value, bool) or not isinstance(value, (int, UOp)):
            raise QueueError(f"{where}: the value must be an int or a uint64 UOp, got {value!r}")
        if isinstance(value, int):
            if not 0 <= value <= MAX_HANDLE:
                raise QueueError(f"{where}: value {value} does not fit a uint64")
            val = UOp.const(dtypes.uint64, value)
        elif not value.dtype.is_int:
            raise QueueError(f"{where}: the value must be an integer, got dtype {value.dtype.name}")
        else:
            val = value.cast(dtypes.uint64)
        self.ops.append(UOp(op, dtypes.void, (event, val)))
        return self

    def wait(self, signal: UOp, value: UOp | int) -> Queue:
        """Wait until ``signal`` (an event placeholder) reaches ``value``. On the queue's own timeline this lowers
        to nothing (the fence orders the queue); on another queue's timeline or a ``shared_event`` it is
        ``encodeWaitForEvent:value:`` on the command buffer of the commands after it, before its encoder."""
        return self._event_op(Ops.WAIT, signal, value, "wait")

    def signal(self, signal: UOp, value: UOp | int) -> Queue:
        """Set ``signal`` (any event placeholder: usually the queue's timeline) to ``value`` once the work before it
        is done (``encodeSignalEvent:value:``); usually ``value`` is a run-time variable such as
        ``timeline_value()``."""
        return self._event_op(Ops.SIGNAL, signal, value, "signal")

    def _bytes(self, v: UOp | int, where: str, lo: int) -> tuple[UOp, tuple[int, int]]:
        """A byte offset or size (an int or an integer expression of run-time variables) as uint64 with its range;
        macOS needs multiples of 4 for blits (Apple's documentation of the MTLBlitCommandEncoder methods)."""
        if isinstance(v, bool) or not isinstance(v, (int, UOp)):
            raise QueueError(f"{where}: expected an int or an integer expression of run-time variables, got {v!r}")
        node = UOp.const(dtypes.uint64, v) if isinstance(v, int) else v
        if not node.dtype.is_int:
            raise QueueError(f"{where}: expected an integer, got dtype {node.dtype.name}")
        rng = (v, v) if isinstance(v, int) else _int_expression(v, where, "a byte count")
        if rng[0] < lo:
            raise QueueError(f"{where}: {expr_text(node)} can be {rng[0]}, below {lo}")
        if isinstance(v, int) and v % 4:
            raise QueueError(f"{where}: {v} is not a multiple of 4, which blits need on macOS")
        return node.cast(dtypes.uint64), rng

    def _blit_target(self, buf: UOp, offset: UOp | int, size: UOp | int | None, where: str) -> tuple[UOp, UOp, UOp]:
        """(buffer, offset, size) of a blit operand: a view's offset added; the bytes inside the buffer for every
        value of the variables."""
        if not isinstance(buf, UOp) or not _is_buffer(buffer_base(buf)[0]):
            raise QueueError(f"{where}: {buf!r} is not a buffer (BUFFER, BUFFER_VIEW or buffer_variable)")
        base, off0 = buffer_base(buf)
        limit = buffer_nbytes(buf)
        if size is None:
            if limit is None:
                raise QueueError(f"{where}: a buffer variable has no known size: give nbytes")
            size = limit - (offset if isinstance(offset, int) else 0)
        off, (_, off_hi) = self._bytes(offset, f"{where}: offset", 0)
        n, (_, n_hi) = self._bytes(size, f"{where}: nbytes", 1)
        if limit is not None and off_hi + n_hi > limit:
            raise QueueError(f"{where}: bytes up to {off_hi + n_hi} run past the end of the {limit}-byte "
                             f"{'view' if buf.op is Ops.BUFFER_VIEW else 'buffer'} {_bufname(base)}")
        if off0 % 4:
            raise QueueError(f"{where}: the view's offset {off0} is not a multiple of 4, which blits need on macOS")
        return base, (off + off0) if off0 else off, n

    def copy(self, src: UOp, dst: UOp, nbytes: UOp | int | None = None, src_offset: UOp | int = 0,
             dst_offset: UOp | int = 0) -> Queue:
        """Copy ``nbytes`` bytes (default: what ``src`` holds) from ``src`` at ``src_offset`` to ``dst`` at
        ``dst_offset`` (buffers or views; offsets and size ints or expressions of run-time variables, multiples of 4
        on macOS) with a blit encoder's ``copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:``, in queue
        order with the commands around it. Raises ``QueueError`` for bytes outside a buffer for some variable value."""
        where = f"copy after command {self.ncommands}"
        s_buf, s_off, n = self._blit_target(src, src_offset, nbytes, f"{where}: source")
        d_buf, d_off, _ = self._blit_target(dst, dst_offset, nbytes if nbytes is not None else n,
                                            f"{where}: destination")
        self.ops.append(UOp(Ops.COPY, dtypes.void, (s_buf, s_off, d_buf, d_off, n)))
        return self

    def fill(self, buf: UOp, value: int, nbytes: UOp | int | None = None, offset: UOp | int = 0) -> Queue:
        """Set ``nbytes`` bytes (default: the rest of ``buf``) of ``buf`` from ``offset`` to the byte ``value``
        (0..255) with a blit encoder's ``fillBuffer:range:value:`` (multiples of 4 on macOS)."""
        where = f"fill after command {self.ncommands}"
        if type(value) is not int or not 0 <= value <= 255:
            raise QueueError(f"{where}: the value is a byte (an int in [0, 255]), got {value!r}")
        base, off, n = self._blit_target(buf, offset, nbytes, where)
        self.ops.append(UOp(Ops.FILL, dtypes.void, (base, off, n), value))
        return self

    def timestamp(self, slot: int) -> Queue:
        """Record a GPU time into timestamp ``slot`` (an int >= 0). A submit with timestamps is profiled: one
        command buffer per command, and the slot gets the GPUEndTime of the command just before it, or else the
        GPUStartTime of the next command (seconds, read by the runtime after completion). A slot is recorded once
        per queue: a second ``timestamp`` with the same slot raises ``QueueError`` naming both (the first time
        would be lost)."""
        if type(slot) is not int or slot < 0:
            raise QueueError(f"timestamp after command {self.ncommands}: slot must be an int >= 0, got {slot!r}")
        if slot in self._stamped:
            raise QueueError(f"timestamp after command {self.ncommands}: slot {slot} is already taken by the "
                             f"timestamp after command {self._stamped[slot]}; each slot records one time per submit "
                             f"(the first would be lost): give this one another slot")
        self._stamped[slot] = self.ncommands
        self.ops.append(UOp(Ops.TIMESTAMP, dtypes.void, (), slot))
        return self

    def submit(self) -> UOp:
        """The queue graph: ``SUBMIT(*ops, arg=device)``. Raises ``QueueError`` for an empty queue."""
        if not self.ops:
            raise QueueError(f"submit: the queue{'' if self.name is None else f' {self.name!r}'} is empty")
        return UOp(Ops.SUBMIT, dtypes.void, tuple(self.ops), self.device, self.name)


def queues(*qs: Queue) -> UOp:
    """The queue graph of several queues of one device: ``SINK(q.submit() for q in qs)``, arg the DeviceSpec. One
    submit of the lowered Program submits to each queue in this order. Raises ``QueueError`` for no queue, queues
    of different devices or two queues of one name."""
    if not qs or not all(isinstance(q, Queue) for q in qs):
        raise QueueError(f"queues: expected one or more Queue, got {qs!r}")
    if len({q.device for q in qs}) != 1:
        raise QueueError("queues: the queues are for different devices: " + ", ".join(str(q.device) for q in qs))
    names = [q.name for q in qs]
    dup = next((n for n in names if names.count(n) > 1), "?")
    if dup != "?":
        raise QueueError(f"queues: two queues are named {dup!r}" if dup else "queues: two default queues")
    return UOp(Ops.SINK, dtypes.void, tuple(q.submit() for q in qs), qs[0].device)
