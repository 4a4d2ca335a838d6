"""The queue graph's nodes: the front end's vocabulary, built from Python with ``mtlir.frontend.queue.Queue`` or from
a trace (``mtlir.frontend.trace``), and the placeholders and buffers the queue operations name.

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
| BUFFER_VIEW | id | ``(buffer,)``, or ``(buffer variable, uint64 offset)`` | ``(offset, nbytes)`` in bytes (offset 0: a source) |

``grid`` and ``threadgroup`` are ``STRUCT`` nodes of dtype MTLSize whose three fields are uint64: constants or
expressions of run-time variables (DEFINE_VAR). Grid sizes count threadgroups, threadgroup sizes count threads
(Metal's ``dispatchThreadgroups:threadsPerThreadgroup:``). ``buffers`` are one per buffer parameter of the kernel, in
order: a BUFFER, a BUFFER_VIEW, or a *buffer variable* (a DEFINE_VAR of dtype id: an MTLBuffer handle given per
submit, "a rebound input"). ``vars`` are one per ``constant int&`` parameter, in order: integer constants or
expressions of DEFINE_VARs, of the parameter's dtype.
"""
from __future__ import annotations

from mtlir.errors import InputError
from mtlir.ir.bounds import WrapError, exact_bounds, expr_text, variable_bounds
from mtlir.ir.dtypes import dtypes
from mtlir.metal import Obj
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp

__all__ = ["QueueError", "shared_event", "timeline_name", "buffer", "view", "buffer_variable", "timeline",
           "timeline_value", "buffer_base", "buffer_nbytes", "placeholder_name", "is_buffer", "buffer_label",
           "node_text", "MAX_HANDLE", "MAX_BUFFER_BYTES"]

MAX_HANDLE = 2**64 - 1
# the largest buffer a queue (built by hand or loaded from a trace) may declare: 64 GiB, more than any Apple GPU's
# memory. The device's own limit (MTLDevice.maxBufferLength, smaller) is checked when link creates the buffer.
MAX_BUFFER_BYTES = 2**36

# the ops and dtype of the per-command path as module constants: ``Ops.X`` is a metaclass attribute lookup (~50 ns
# on Python 3.11, against ~5 for a global), paid per command
_BUFFER, _BUFFER_VIEW, _ID = Ops.BUFFER, Ops.BUFFER_VIEW, dtypes.id
_node = UOp.checked  # a node whose fields the caller checked


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


def buffer_base(node: UOp) -> tuple[UOp, int | UOp]:
    """The buffer (BUFFER or buffer variable) under ``node`` and the byte offset of ``node`` into it: an int, or a
    uint64 expression of run-time variables for a view whose offset is bound per submit (``view``)."""
    if node.op is Ops.BUFFER_VIEW:
        return node.src[0], (node.src[1] if len(node.src) == 2 else node.arg[0])
    return node, 0


def buffer_nbytes(node: UOp) -> int | None:
    """The size in bytes of a BUFFER or BUFFER_VIEW; None for a buffer variable (unknown until run time)."""
    if node.op is Ops.BUFFER:
        return int(node.arg[1])
    if node.op is Ops.BUFFER_VIEW:
        return int(node.arg[1])
    return None


def view(buf: UOp, offset: int | UOp, nbytes: int) -> UOp:
    """``nbytes`` bytes of ``buf`` from byte ``offset`` (BUFFER_VIEW). A view of a view is a view of its buffer.

    ``offset`` is an int, or an integer expression of run-time variables (``UOp.variable``) on a buffer variable:
    the view's offset is then bound by each submit (``setKernelBuffer:offset:atIndex:`` patched per submit on the
    ICB path, ``setBuffer:offset:atIndex:`` on the direct path), so one lowering serves every offset. The run-time
    value must be a multiple of the parameter's element size and below the bound buffer's length: the device
    refuses it at the submit otherwise (METAL.md §1, §3 rule 8).

    Raises ``QueueError`` when ``buf`` is not a buffer, the offset is negative (or a variable one can be, or can
    wrap in its dtype: ``mtlir.ir.bounds.exact_bounds``), the size is below 1, the view runs past the end of the
    buffer, or a variable offset is not on a buffer variable."""
    if type(buf) is UOp and buf.op is _BUFFER and type(offset) is int and type(nbytes) is int and offset >= 0 \
            and nbytes >= 1 and type(limit := buf.arg[1]) is int and offset + nbytes <= limit:
        # the usual case, its checks inline (one per command); a tuple of two ints is its own key (the same
        # object: a second tuple would be 56 bytes more per view)
        arg = (offset, nbytes)
        return _node(_BUFFER_VIEW, _ID, (buf,), arg, arg)
    base, off0 = buffer_base(buf)
    if not is_buffer(base):
        raise QueueError(f"view: {node_text(buf)} is not a buffer (BUFFER, BUFFER_VIEW or buffer_variable)")
    if type(nbytes) is not int or nbytes < 1:
        raise QueueError(f"view of {buffer_label(base)}: nbytes must be an int >= 1, got {nbytes!r}")
    if isinstance(offset, UOp):
        return _variable_view(buf, base, off0, offset, nbytes)
    if type(offset) is not int or offset < 0:
        raise QueueError(f"view of {buffer_label(base)}: offset must be an int >= 0, got {offset!r}")
    limit = buffer_nbytes(buf)
    if limit is not None and offset + nbytes > limit:
        raise QueueError(f"view of {buffer_label(base)}: bytes [{offset}, {offset + nbytes}) run past the end of the "
                         f"{limit}-byte {'view' if buf.op is Ops.BUFFER_VIEW else 'buffer'}")
    if isinstance(off0, UOp):
        return _variable_view(buf, base, off0, UOp.const(dtypes.uint64, 0), nbytes, offset)
    return UOp(Ops.BUFFER_VIEW, dtypes.id, (base,), (off0 + offset, nbytes))


def _variable_view(buf: UOp, base: UOp, off0: int | UOp, offset: UOp, nbytes: int, extra: int = 0) -> UOp:
    """A BUFFER_VIEW whose offset is the source ``off0 + offset + extra`` (uint64), checked >= 0."""
    if base.op is not Ops.DEFINE_VAR:
        raise QueueError(f"view of {buffer_label(base)}: a variable offset needs a buffer variable (buffer_variable: "
                         "its binding is patched per submit); a BUFFER's views have int offsets")
    if not offset.dtype.is_int:
        raise QueueError(f"view of {buffer_label(base)}: offset {node_text(offset)} is not an integer expression")
    total = offset.cast(dtypes.uint64)
    if isinstance(off0, UOp) or off0:
        total = total + off0
    if extra:
        total = total + extra
    try:
        lo, hi = exact_bounds(offset)
    except WrapError as e:
        raise QueueError(f"view of {buffer_label(base)}: offset {expr_text(offset)} cannot be computed in its dtype: "
                         f"{e} for {variable_bounds(offset)}; {e.hint}") from None
    if lo < 0:
        raise QueueError(f"view of {buffer_label(base)}: offset {node_text(offset)} can be {lo}, below 0")
    return UOp(Ops.BUFFER_VIEW, dtypes.id, (base, total), (0, nbytes))
def placeholder_name(buf: UOp) -> str:
    """The name of the placeholder link makes for a BUFFER (``buffer:<name>``) or a buffer variable
    (``input:<name>``)."""
    return f"buffer:{buf.arg[0]}" if buf.op is Ops.BUFFER else f"input:{buf.arg[0]}"


def is_buffer(node: UOp) -> bool:
    """True for a BUFFER or a buffer variable (a DEFINE_VAR of dtype id)."""
    return node.op is Ops.BUFFER or (node.op is Ops.DEFINE_VAR and node.dtype is dtypes.id)


def buffer_label(node: UOp) -> str:
    """A buffer's name as messages quote it (``'x'``), else the node's op name."""
    return repr(node.arg[0]) if node.op in (Ops.BUFFER, Ops.DEFINE_VAR) else node.op.name


def node_text(node: UOp) -> str:
    """A one-line description of a node that needs no printer (dtype, op, a short arg)."""
    arg = "" if node.arg is None else f" {str(node.arg)[:60]}"
    return f"{node.op.name}<{node.dtype.name}>{arg}"
