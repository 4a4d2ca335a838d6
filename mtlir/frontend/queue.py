"""The Queue builder: the queue graph of one submit built from Python, each operation checked as it is appended
(``mtlir.frontend.checks``); the nodes and their layouts are in ``mtlir.frontend.nodes``.

Several queues on one device (docs/lowering.md, "Several queues"): each ``Queue(device, name=...)`` has its own
command queue, fence and timeline (placeholders ``queue:<name>``, ``fence:<name>``, ``event:<name>``; the default
queue, ``name=None``, keeps ``queue``, ``fence`` and ``event``), and its SUBMIT carries the name as its tag (None for
the default queue).
``queues(*qs)`` joins them into one queue graph, ``SINK(SUBMIT, SUBMIT, ...)`` (arg: the DeviceSpec), submitted in
that order. ``shared_event(name)`` is an event no queue owns (``event:<name>``, signaled by queues or the host).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtlir.ir.bounds import bounds, expr_text, variable_bounds
from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj
from mtlir.ir.ops import Ops
from mtlir.ir.interning import NONE_KEY
from mtlir.ir.uop import UOp
from mtlir.frontend.nodes import (MAX_HANDLE, QueueError, buffer_base, buffer_label, buffer_nbytes, is_buffer,
                                  timeline)
from mtlir.frontend.checks import (MAX_SIZE, ExecChecks, check_size, check_var_value, int_expression,
                                   var_dtype)

__all__ = ["Queue", "queues"]

# per-command constants (``Ops.X`` is a metaclass attribute lookup: ~50 ns on Python 3.11, a global ~5)
_BUFFER, _BUFFER_VIEW, _DEFINE_VAR, _EXEC = Ops.BUFFER, Ops.BUFFER_VIEW, Ops.DEFINE_VAR, Ops.EXEC
_TIMESTAMP, _OBJECT, _SIGNAL, _WAIT = Ops.TIMESTAMP, Ops.OBJECT, Ops.SIGNAL, Ops.WAIT
_ID, _VOID, _U64, _CONST = dtypes.id, dtypes.void, dtypes.uint64, Ops.CONST
_node = UOp.checked  # a node whose fields exec, timestamp and the event ops checked (arg None's key: NONE_KEY)


def _size(v: UOp | int, where: str) -> UOp:
    if isinstance(v, bool) or not isinstance(v, (int, UOp)):
        raise QueueError(f"{where}: a size must be an int or an expression of run-time variables, got {v!r}")
    if isinstance(v, int):
        if not 1 <= v <= MAX_SIZE:
            raise QueueError(f"{where}: size {v} is {'below 1' if v < 1 else 'above 2**32-1'}")
        return UOp.const(dtypes.uint64, v)
    check_size(v, where)
    return v.cast(dtypes.uint64)


def _mtlsize(sizes: Sequence[UOp | int] | UOp | int, where: str) -> UOp:
    if isinstance(sizes, (int, UOp)):
        sizes = (sizes,)
    if not isinstance(sizes, (tuple, list)) or not 1 <= len(sizes) <= 3:
        raise QueueError(f"{where}: expected 1 to 3 sizes (x, y, z), got {sizes!r}")
    full = (*sizes, *(1,) * (3 - len(sizes)))
    return UOp.struct(dtypes.MTLSize, *(_size(v, f"{where}.{a}") for v, a in zip(full, "xyz")))


def _refuse_overlap(s_off: UOp, d_off: UOp, n: UOp, where: str) -> None:
    """Refuse a copy within one buffer when ``[s_off, s_off + n)`` and ``[d_off, d_off + n)`` (bytes, uint64 nodes)
    can overlap: the offsets' distance can be below ``n`` over the variables' bounds (taken independently, so
    ``k`` and ``k + 512`` are refused too). Raises ``QueueError`` naming ``where`` and both ranges."""
    dist = d_off.cast(dtypes.int64) - s_off.cast(dtypes.int64)
    lo, hi = bounds(dist)
    gap = 0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
    n_hi = bounds(n)[1]
    if gap >= n_hi:
        return
    free = dist.variables() or n.variables()
    if free:
        ranges = f"source bytes [{expr_text(s_off)}, {expr_text(s_off + n)}) and destination bytes " \
                 f"[{expr_text(d_off)}, {expr_text(d_off + n)})"
    else:
        s, d = bounds(s_off)[0], bounds(d_off)[0]
        ranges = f"source bytes [{s}, {s + n_hi}) and destination bytes [{d}, {d + n_hi})"
    how = f"can overlap (for {variable_bounds(UOp.sink(dist, n))})" if free else "overlap"
    raise QueueError(f"{where}: {ranges} {how}: Metal leaves a copy between overlapping ranges of one buffer undefined "
                     f"(copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:); copy through a second buffer")


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
        self._by_id: dict[int, tuple[Kernel, Any]] = {}  # id(kernel) -> (kernel, _kernel_info(kernel))
        self._dispatches: dict[object, tuple[UOp, UOp]] = {}  # (grid, threadgroup as given, their types) -> STRUCTs
        self._checks = ExecChecks()  # what exec checked already, so each distinct part is checked once
        self._sizes: dict[object, UOp] = {}  # grid / threadgroup sizes as given (with their types) -> STRUCT
        self._values: dict[object, UOp] = {}  # (a variable value's type, the value, dtype) -> its node
        self._events: set[UOp] = set()  # event placeholders checked (signal, wait)
        self._stamped: set[int] = set()  # timestamp slots taken (a set: ~50 bytes less per timestamp than a dict)
        self.ncommands = 0

    def exec(self, kernel: Kernel, buffers: Sequence[UOp], vars: Sequence[UOp | int] = (),
             grid: Sequence[UOp | int] = (1, 1, 1), threadgroup: Sequence[UOp | int] = (1, 1, 1)) -> Queue:
        """Dispatch ``kernel`` over ``grid`` threadgroups of ``threadgroup`` threads.

        ``buffers``: one per buffer parameter (BUFFER, BUFFER_VIEW or buffer_variable). ``vars``: one per
        ``constant int&`` parameter (an int or an integer expression of run-time variables). ``grid`` /
        ``threadgroup``: 1 to 3 sizes (missing ones are 1), each an int >= 1 or an expression of variables.

        Each distinct kernel, buffer, size tuple and variable value is checked once per queue (``ExecChecks``):
        the checks are those of ``exec_parts``, and a bad argument raises ``QueueError`` every time."""
        seen = self._by_id.get(id(kernel))  # by identity first: a Kernel's dataclass hash walks its parameters
        if seen is None or seen[0] is not kernel:
            seen = self._kernel_seen(kernel)
        knode, bparams, vparams, vdts, elements = seen[1]
        buffers, vars = tuple(buffers), tuple(vars)
        if len(buffers) != len(bparams):
            raise QueueError(f"{self._where(kernel)}: kernel takes {len(bparams)} buffers, got {len(buffers)}")
        if len(vars) != len(vparams):
            raise QueueError(f"{self._where(kernel)}: kernel takes {len(vparams)} variables "
                             f"({', '.join(str(p.var) for p in vparams) or 'none'}), got {len(vars)}")
        for b in buffers:  # a buffer, a view of one or a buffer variable (the checks of exec_parts, inline)
            if type(b) is UOp:
                base = b.src[0] if b.op is _BUFFER_VIEW else b
                if type(base) is UOp and (base.op is _BUFFER or (base.op is _DEFINE_VAR and base.dtype is _ID)):
                    continue
            p = bparams[next(j for j, x in enumerate(buffers) if x is b)]
            raise QueueError(f"{self._where(kernel)}: buffer parameter {p.index} must be a buffer or a view, got "
                             f"{b!r}")
        if elements:
            for p, b in zip(bparams, buffers):
                if p.elements is not None:
                    self._checks.binding(p, b, self._where(kernel))
        vnodes: list[UOp] = []
        if vars:
            values = self._values
            for p, dt, v in zip(vparams, vdts, vars):
                try:
                    vnode = values.get((type(v), v, dt))
                except TypeError:  # an unhashable value: the check below names it
                    vnode = None
                if vnode is None:
                    vnode = values[(type(v), v, dt)] = self._var_node(kernel, p, dt, v)
                vnodes.append(vnode)
        # both sizes as given, with their types (True must not find the node of 1): checked once per distinct pair
        sizes = None
        if type(grid) is tuple and type(threadgroup) is tuple:
            try:
                key: object = (grid, threadgroup, *map(type, grid), *map(type, threadgroup))
                sizes = self._dispatches.get(key)
            except TypeError:  # an unhashable size: _struct names it
                key = None
            if sizes is None:
                sizes = self._dispatch(kernel, grid, threadgroup)
                if key is not None:
                    self._dispatches[key] = sizes
        else:
            sizes = self._dispatch(kernel, grid, threadgroup)
        # every source a UOp; built in one tuple (not the arguments' tuple first)
        self.ops.append(_node(_EXEC, _VOID, (knode, *sizes, *buffers, *vnodes), None, NONE_KEY))
        self.ncommands += 1
        return self

    def _kernel_seen(self, kernel: Kernel) -> tuple[Kernel, tuple[UOp, tuple[KernelParam, ...],
                                                             tuple[KernelParam, ...], tuple[DType, ...], bool]]:
        """``kernel`` (checked to be a Kernel) with what ``_kernel_info`` read of it, remembered by identity. (Not
        by value as well: a Kernel's dataclass hash walks its parameters, two hashes per kernel per queue, and an
        equal Kernel of another identity reads the same info, the same KERNEL node.)"""
        if not isinstance(kernel, Kernel):
            raise QueueError(f"{self._where(kernel)}: kernel must be an mtlir.metal.Kernel, got "
                             f"{type(kernel).__name__}")
        seen = self._by_id[id(kernel)] = (kernel, self._kernel_info(kernel))  # the tuple keeps the kernel alive
        return seen

    def _dispatch(self, kernel: Kernel, grid: Sequence[UOp | int], threadgroup: Sequence[UOp | int]) -> tuple[UOp, UOp]:
        """The grid and threadgroup STRUCTs of a dispatch, each checked, and the pair's threads checked."""
        gnode = self._struct(grid, kernel, "grid")
        tnode = self._struct(threadgroup, kernel, "threadgroup")
        if (gnode, tnode) not in self._checks.threads:
            self._checks.dispatch(gnode, tnode, self._where(kernel))
        return gnode, tnode

    def _where(self, kernel: object) -> str:
        """How errors name the command being appended (and its queue, when named)."""
        return f"command {self.ncommands}{self._of()} ({getattr(kernel, 'key', '?')})"

    def _of(self) -> str:
        """`` of queue 'copy'`` for a named queue (several queues: encode's errors name it so too), else ""."""
        return "" if self.name is None else f" of queue {self.name!r}"

    def _kernel_info(self, kernel: Kernel) -> tuple[UOp, tuple[KernelParam, ...], tuple[KernelParam, ...],
                                                    tuple[DType, ...], bool]:
        """A kernel's KERNEL node, buffer and variable parameters, the variables' dtypes and whether a buffer
        parameter declares ``elements``, read once per queue."""
        vparams = tuple(kernel.var_params)
        vdts = tuple(var_dtype(kernel, p, self._where(kernel)) for p in vparams)
        bparams = tuple(kernel.buffer_params)
        return (UOp(Ops.KERNEL, dtypes.void, (), kernel), bparams, vparams, vdts,
                any(p.elements is not None for p in bparams))

    def _var_node(self, kernel: Kernel, p: KernelParam, dt: DType, v: object) -> UOp:
        """The value of ``constant int&`` parameter ``p`` (dtype ``dt``) as a node, checked to fit ``dt``."""
        where = self._where(kernel)
        if isinstance(v, bool) or not isinstance(v, (int, UOp)):
            raise QueueError(f"{where}: variable {p.var!r} must be an int or a UOp, got {v!r}")
        if isinstance(v, int):
            if not dtypes.min(dt) <= v <= dtypes.max(dt):
                raise QueueError(f"{where}: variable {p.var!r} (parameter {p.index}): value {v} does not fit the "
                                 f"parameter's type {dt.name} [{dtypes.min(dt)}, {dtypes.max(dt)}]")
            return UOp.const(dt, v)
        if not v.dtype.is_int:
            raise QueueError(f"{where}: variable {p.var!r} must be an integer, got dtype {v.dtype.name}")
        check_var_value(v, dt, f"{where}: variable {p.var!r} (parameter {p.index})")
        self._checks.declared(v, f"{where}: variable {p.var!r} (parameter {p.index})")
        return v.cast(dt)

    def _struct(self, sizes: Sequence[UOp | int] | UOp | int, kernel: Kernel, label: str) -> UOp:
        """The MTLSize STRUCT of a grid or threadgroup (``label``), built and checked once per distinct sizes."""
        if type(sizes) is tuple or type(sizes) is list:
            try:  # the sizes' types first in the key: True must not find the node of 1, nor a UOp meet an int
                key: object = (*map(type, sizes), *sizes)
                got = self._sizes.get(key)
            except TypeError:  # an unhashable size: _mtlsize names it
                key, got = None, None
        elif type(sizes) is int or type(sizes) is UOp:  # one size: the same key as the 1-tuple, the same meaning
            key = (type(sizes), sizes)
            got = self._sizes.get(key)
        else:
            key, got = None, None
        if got is None:
            where = f"{self._where(kernel)}: {label}"
            got = _mtlsize(sizes, where)
            self._checks.size(got, label, self._where(kernel))
            if key is not None:
                self._sizes[key] = got
        return got

    def _event_op(self, op: Ops, event: UOp, value: UOp | int, what: str) -> Queue:
        if type(event) is not UOp or event not in self._events:
            if type(event) is not UOp or event.op is not _OBJECT or not isinstance(event.arg, Obj) \
                    or event.arg.kind != "event":
                raise QueueError(f"{what} after command {self.ncommands}{self._of()}: the event must be an event "
                                 f"placeholder (a queue's timeline or a shared_event), got {event!r}")
            self._events.add(event)
        if type(value) is int and 0 <= value <= MAX_HANDLE:  # the usual case: a constant value
            val = _node(_CONST, _U64, (), value, value)
        else:
            val = self._event_value(value, f"{what} after command {self.ncommands}{self._of()}")
        self.ops.append(_node(op, _VOID, (event, val), None, NONE_KEY))
        return self

    @staticmethod
    def _event_value(value: UOp | int, where: str) -> UOp:
        """The value of a signal or wait as a uint64 node; raises ``QueueError`` naming ``where``."""
        if isinstance(value, bool) or not isinstance(value, (int, UOp)):
            raise QueueError(f"{where}: the value must be an int or a uint64 UOp, got {value!r}")
        if isinstance(value, int):
            if not 0 <= value <= MAX_HANDLE:
                raise QueueError(f"{where}: value {value} does not fit a uint64")
            return UOp.const(dtypes.uint64, value)
        if not value.dtype.is_int:
            raise QueueError(f"{where}: the value must be an integer, got dtype {value.dtype.name}")
        return value.cast(dtypes.uint64)

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
        rng = (v, v) if isinstance(v, int) else int_expression(v, where, "a byte count")
        if rng[0] < lo:
            raise QueueError(f"{where}: {expr_text(node)} can be {rng[0]}, below {lo}")
        if isinstance(v, int) and v % 4:
            raise QueueError(f"{where}: {v} is not a multiple of 4, which blits need on macOS")
        return node.cast(dtypes.uint64), rng

    def _blit_target(self, buf: UOp, offset: UOp | int, size: UOp | int | None, where: str) -> tuple[UOp, UOp, UOp]:
        """(buffer, offset, size) of a blit operand: a view's offset added; the bytes inside the buffer for every
        value of the variables."""
        if not isinstance(buf, UOp) or not is_buffer(buffer_base(buf)[0]):
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
                             f"{'view' if buf.op is Ops.BUFFER_VIEW else 'buffer'} {buffer_label(base)}")
        if off0 % 4:
            raise QueueError(f"{where}: the view's offset {off0} is not a multiple of 4, which blits need on macOS")
        return base, (off + off0) if off0 else off, n

    def copy(self, src: UOp, dst: UOp, nbytes: UOp | int | None = None, src_offset: UOp | int = 0,
             dst_offset: UOp | int = 0) -> Queue:
        """Copy ``nbytes`` bytes (default: what ``src`` holds) from ``src`` at ``src_offset`` to ``dst`` at
        ``dst_offset`` (buffers or views; offsets and size ints or expressions of run-time variables, multiples of 4
        on macOS) with a blit encoder's ``copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:``, in queue
        order with the commands around it. Raises ``QueueError`` for bytes outside a buffer for some variable value,
        and for a copy within one buffer whose source and destination ranges overlap (for some value of the variables,
        their bounds taken independently): Metal leaves its result undefined (Metal Programming Guide, "Copying Data
        Between Two Buffers")."""
        where = f"copy after command {self.ncommands}{self._of()}"
        s_buf, s_off, n = self._blit_target(src, src_offset, nbytes, f"{where}: source")
        d_buf, d_off, _ = self._blit_target(dst, dst_offset, nbytes if nbytes is not None else n,
                                            f"{where}: destination")
        if s_buf is d_buf:
            _refuse_overlap(s_off, d_off, n, f"{where} ({buffer_label(s_buf)} to itself)")
        self.ops.append(UOp(Ops.COPY, dtypes.void, (s_buf, s_off, d_buf, d_off, n)))
        return self

    def fill(self, buf: UOp, value: int, nbytes: UOp | int | None = None, offset: UOp | int = 0) -> Queue:
        """Set ``nbytes`` bytes (default: the rest of ``buf``) of ``buf`` from ``offset`` to the byte ``value``
        (0..255) with a blit encoder's ``fillBuffer:range:value:`` (multiples of 4 on macOS)."""
        where = f"fill after command {self.ncommands}{self._of()}"
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
            raise QueueError(f"timestamp after command {self.ncommands}{self._of()}: slot must be an int >= 0, got "
                             f"{slot!r}")
        if slot in self._stamped:
            raise QueueError(f"timestamp after command {self.ncommands}{self._of()}: slot {slot} is already taken by "
                             f"the timestamp after command {self._stamped_after(slot)}; each slot records one time per "
                             f"submit (the first would be lost): give this one another slot")
        self._stamped.add(slot)
        self.ops.append(_node(_TIMESTAMP, _VOID, (), slot, slot))  # an int arg is its own key
        return self

    def _stamped_after(self, slot: int) -> int:
        """The number of commands before the timestamp of ``slot`` (for the error of a slot taken twice)."""
        n = 0
        for op in self.ops:
            if op.op is _EXEC:
                n += 1
            elif op.op is _TIMESTAMP and op.arg == slot:
                break
        return n

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
