"""A batch of tinygrad kernel dispatches as one mtlir queue: the Kernel of a tinygrad Metal program, and the queue
graph (lowered once, replayed per call) of one eager call or one TinyJit batch.

What is fixed in the Program and what is given per submit:

- a buffer argument is either a context buffer known when the batch is built (``Arg.handle``: a BUFFER placeholder
  that link adopts from the ``DeviceContext``, bound once on the ICB command) or a *buffer variable*
  (``Arg.slot``: rebound per submit, what an eager call and a JIT input are); a buffer variable's byte offset is an
  int or the name of a run-time variable (bound per submit with it: one Program serves every offset), a fixed
  buffer's is an int; the view's size is fixed (``Batch.key`` says what a Program depends on);
- a ``constant int&`` parameter, a grid size and a threadgroup size are an int or the name of a run-time variable
  with its bounds (``Batch.bounds``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from mtlir.frontend.nodes import QueueError, buffer, buffer_variable, timeline_value, view
from mtlir.frontend.queue import Queue
from mtlir.ir.dtypes import DType, dtypes
from mtlir.ir.uop import UOp
from mtlir.metal import DeviceSpec, Kernel, KernelParam, element_dtype
from mtlir.msl import kernel_signature
from mtlir.passes import lower
from mtlir.program.program import Program

__all__ = ["Arg", "Dispatch", "Batch", "kernel_of", "variable_bounds", "Size", "MAX_OFFSET"]

Size = int | str  # a constant size or value, or the name of a run-time variable
MAX_OFFSET = 0xFFFFFFFF  # a variable byte offset's upper bound: what an ICB command holds (METAL.md §3 rule 8)


def kernel_of(function: str, msl: str) -> Kernel:
    """The mtlir ``Kernel`` of a tinygrad-rendered Metal program: its parameters read from the MSL
    (``mtlir.msl.kernel_signature``: ``device T*`` buffers, then ``constant int&`` variables). The key is the
    function name and a hash of the source (two programs of one name may differ). Raises
    ``mtlir.msl.KernelSignatureError`` for a source without that kernel or an element type mtlir has no dtype for."""
    params = tuple(KernelParam(p.name if p.reference else None, p.index, p.dtype.name)
                   for p in kernel_signature(msl, function))
    digest = hashlib.sha1(msl.encode()).hexdigest()[:8]
    return Kernel(f"{function}_{digest}", function, msl, params)


@dataclass(frozen=True)
class Arg:
    """One buffer argument: ``slot`` (the name of a buffer variable, rebound per submit) or ``handle`` (a
    ``DeviceContext`` buffer of ``base_nbytes`` bytes, fixed); the view: ``offset`` and ``nbytes`` in bytes.
    ``offset`` of a buffer variable may be the name of a run-time variable (bytes, in [0, 0xFFFFFFFF]: an ICB
    command holds 32 bits, METAL.md §3 rule 8), given to each submit."""

    slot: str | None
    handle: int
    base_nbytes: int
    offset: Size
    nbytes: int


@dataclass(frozen=True)
class Dispatch:
    """One kernel dispatch: its ``kernel``, ``args`` (one per buffer parameter), ``vars`` (one per ``constant``
    parameter), ``grid`` (threadgroups) and ``threadgroup`` (threads), each entry an int or a variable's name."""

    kernel: Kernel
    args: tuple[Arg, ...]
    vars: tuple[Size, ...]
    grid: tuple[Size, Size, Size]
    threadgroup: tuple[Size, Size, Size]


@dataclass
class Batch:
    """Dispatches run in order, each after the one before (one ICB command each, with a barrier), as one submit.
    ``bounds``: variable name -> (min, max), for every name used in ``Dispatch.vars``, grids and threadgroups."""

    dispatches: list[Dispatch] = field(default_factory=list)
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)

    def key(self) -> tuple[object, ...]:
        """What the lowered Program depends on: two batches of equal keys replay one Program."""
        return tuple((d.kernel.key, d.args if any(a.slot is None for a in d.args) else
                      tuple((a.slot, a.offset, a.nbytes) for a in d.args), d.vars, d.grid, d.threadgroup)
                     for d in self.dispatches) + tuple(sorted(self.bounds.items()))

    def shared_buffers(self) -> dict[str, int]:
        """The placeholder name -> handle of each fixed buffer (link's ``shared``)."""
        return {f"buffer:{_buffer_name(a)}": a.handle for d in self.dispatches for a in d.args if a.slot is None}

    def queue(self, spec: DeviceSpec) -> UOp:
        """The queue graph: a wait for the previous submit's timeline value (lowered to nothing: the fence orders
        the queue), the dispatches, a signal of the timeline. Raises ``QueueError`` for a bad dispatch."""
        q = Queue(spec)
        variables: dict[str, UOp] = {}

        def value(v: Size) -> UOp | int:
            if isinstance(v, int):
                return v
            if v not in variables:
                lo, hi = self.bounds[v]
                variables[v] = UOp.variable(v, lo, hi, _variable_dtype(lo, hi))
            return variables[v]

        bufs: dict[str, UOp] = {}
        offsets: dict[str, UOp] = {}
        step = timeline_value()
        q.wait(q.timeline, step - 1)
        for d in self.dispatches:
            nodes = []
            for a in d.args:
                name = a.slot if a.slot is not None else _buffer_name(a)
                if name not in bufs:
                    bufs[name] = buffer_variable(name) if a.slot is not None else buffer(name, a.base_nbytes)
                base = bufs[name]
                whole = a.slot is None and a.offset == 0 and a.nbytes == a.base_nbytes
                if isinstance(a.offset, str):
                    if a.slot is None:
                        raise QueueError(f"{d.kernel.key}: a fixed buffer's offset is an int, got {a.offset!r}")
                    if a.offset not in offsets:
                        offsets[a.offset] = UOp.variable(a.offset, 0, MAX_OFFSET, dtypes.uint32)
                    nodes.append(view(base, offsets[a.offset], a.nbytes))
                    continue
                nodes.append(base if whole else view(base, a.offset, a.nbytes))
            q.exec(d.kernel, nodes, [value(v) for v in d.vars], grid=tuple(value(g) for g in d.grid),
                   threadgroup=tuple(value(t) for t in d.threadgroup))
        q.signal(q.timeline, step)
        return q.submit()

    def lower(self, spec: DeviceSpec, target: str) -> Program:
        """The Program of this batch for ``spec`` on ``target`` (``mtlir.passes.lower``)."""
        return lower(self.queue(spec), target=target).program


def _buffer_name(a: Arg) -> str:
    return f"h{a.handle:x}"


def _variable_dtype(lo: int, hi: int) -> DType:
    """The narrowest of int32, uint32, int64, uint64 holding every value in [lo, hi]: a run-time variable's dtype
    (cast to each parameter's type where it is used; a ``constant long&`` takes values beyond 32 bits)."""
    for dt in (dtypes.int32, dtypes.uint32, dtypes.int64):
        if dtypes.min(dt) <= lo and hi <= dtypes.max(dt):
            return dt
    return dtypes.uint64


def variable_bounds(kernel: Kernel) -> tuple[tuple[int, int], ...]:
    """The bounds of each ``constant`` parameter of ``kernel`` (in order): its type's range (``constant int&``: the
    int32 range, ``constant long&``: int64's, ...). tinygrad's Metal runtime gives each value in its parameter's
    width (``setBytes`` of the dtype's itemsize), so a ``long`` variable holds 64-bit values."""
    out = []
    for p in kernel.params:
        if p.var is not None:
            dt = element_dtype(p.dtype)
            out.append((dtypes.min(dt), dtypes.max(dt)))
    return tuple(out)
