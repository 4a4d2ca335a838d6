"""A random queue as plain data (``QueueSpec``, JSON-able: failing ones are saved as regressions), built into an
mtlir queue graph and run on the simulated Metal device.

A spec names buffers by index (``buffer:b0`` ...), views by (buffer, first element, elements), and per dispatch a
kernel of ``msl_library.LIBRARY``, its output view, its input views and its element count ``n``: an int, or the name of
a run-time variable (then the grid is the expression ``(n + 31) // 32``). Blits copy or fill views, their offsets
and sizes constants or expressions of run-time variables. Besides dispatches and blits a queue holds signals of shared
events and later waits on them, waits on its timeline, and timestamps. A spec may spread its operations over several
command queues (``Op.queue``), submitted in ``QueueSpec.order``; a queue then waits for another's shared event or
timeline where the other's work must come first; ``schedule`` gives an order the GPU may run the commands in.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from msl_library import GROUP, LIBRARY, LibKernel

KERNELS: dict[str, LibKernel] = {k.kernel.key: k for k in LIBRARY}
COMMANDS = ("exec", "copy", "fill")  # the operations that are commands (the rest orders them)


@dataclass(frozen=True)
class View:
    """``elems`` int32 elements of buffer ``buffer`` from element ``first``."""

    buffer: int
    first: int
    elems: int


@dataclass(frozen=True)
class Op:
    """One queue operation, on command queue ``queue``. ``kind``: ``exec`` (``kernel``, ``out``, ``ins``, ``n``),
    ``copy`` (blit: ``ins[0]``'s elements into ``out``, as many), ``fill`` (blit: every byte of ``out`` set to
    ``slot``), ``wait`` (on the queue's timeline, value ``timeline - 1``: lowers to nothing), ``signal`` /
    ``event-wait`` (shared event ``e<slot>`` at value ``timeline``: an event is signaled once per submit, a value it
    already has would be refused), ``queue-wait`` (on the timeline of queue ``slot``, value ``timeline``: that
    queue's whole submit), ``timestamp`` (``slot``). A blit's offsets and size may be run-time: ``shift`` (the
    destination's, or the fill's) and ``src_shift`` (a copy's source) name a variable added to the view's first
    element; ``count`` names the variable that is its element count (``out.elems`` is then that variable's
    maximum)."""

    kind: str
    kernel: str = ""
    out: View | None = None
    ins: tuple[View, ...] = ()
    n: int | str = 0
    slot: int = 0
    queue: int = 0
    shift: str = ""
    src_shift: str = ""
    count: str = ""

    def blit(self, values: dict[str, int]) -> tuple[int, int, int]:
        """(first element of the destination, of the source (0 for a fill), elements) of a blit at one submit's
        ``values``."""
        assert self.out is not None
        src = self.ins[0].first + (values[self.src_shift] if self.src_shift else 0) if self.ins else 0
        return (self.out.first + (values[self.shift] if self.shift else 0), src,
                values[self.count] if self.count else self.out.elems)


@dataclass(frozen=True)
class Target:
    """Where the queue is lowered for and how it runs: GPU family, residency set, ICB, ABI; ``strict``: the
    simulated device refuses misuse at the call (else faithful: what Metal does without its validation layer);
    ``executor``: the Session's (``compiled`` or ``interpreter``)."""

    family: str = "Apple9"
    residency_set: bool = True
    icb: bool = True
    target: str = "x86_64"
    strict: bool = True
    executor: str = "compiled"


@dataclass(frozen=True)
class QueueSpec:
    """Buffers (elements each) and their initial data (from ``seed``); run-time variables ``name -> (min, max)``;
    the operations; one dict of variable values per submit; the target; the buffers that are buffer variables
    (``inputs``); ``order``: the command queues in the order a submit commits them (empty: one queue)."""

    buffers: tuple[int, ...]
    seed: int
    variables: dict[str, tuple[int, int]]
    ops: tuple[Op, ...]
    submits: tuple[dict[str, int], ...]
    target: Target = field(default_factory=Target)
    inputs: tuple[int, ...] = ()
    order: tuple[int, ...] = ()

    def queues(self) -> tuple[int, ...]:
        """The command queues in commit order (queue 0 is the default queue, the others ``q1``, ``q2`` ...)."""
        return self.order or (0,)

    def instances(self, b: int) -> tuple[str, ...]:
        """The MTLBuffers behind buffer ``b``: ``b<i>``, or for an input (a buffer variable, rebound per submit)
        two, ``b<i>#0`` and ``b<i>#1``: submit k binds ``b<i>#<k % 2>``."""
        return (f"b{b}#0", f"b{b}#1") if b in self.inputs else (f"b{b}",)

    def bound(self, b: int, submit: int) -> str:
        """The MTLBuffer buffer ``b`` is at submit number ``submit``."""
        got = self.instances(b)
        return got[submit % len(got)]

    def initial(self) -> list[bytes]:
        """The initial bytes of each buffer (random int32, from ``seed``)."""
        rng = np.random.default_rng(self.seed)
        return [rng.integers(-1000, 1000, size=n, dtype=np.int32).tobytes() for n in self.buffers]

    def to_json(self) -> str:
        """The spec as JSON (``from_json`` reads it back)."""
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> QueueSpec:
        """A spec written by ``to_json``."""
        d = json.loads(text)
        ops = tuple(Op(o["kind"], o["kernel"], None if o["out"] is None else View(**o["out"]),
                       tuple(View(**v) for v in o["ins"]), o["n"], o["slot"], o.get("queue", 0), o.get("shift", ""),
                       o.get("src_shift", ""), o.get("count", "")) for o in d["ops"])
        return QueueSpec(tuple(d["buffers"]), d["seed"], {k: (lo, hi) for k, (lo, hi) in d["variables"].items()},
                         ops, tuple(d["submits"]), Target(**d["target"]), tuple(d.get("inputs", ())),
                         tuple(d.get("order", ())))


def n_value(n: int | str, values: dict[str, int]) -> int:
    """The element count of a dispatch at one submit's values."""
    return values[n] if isinstance(n, str) else n


def schedule(spec: QueueSpec) -> list[Op]:
    """An order a submit's commands (dispatches and blits) may run in on the GPU: each queue in order, a wait holding
    its queue until the event is signaled (``event-wait``: by a ``signal`` of this submit; ``queue-wait``: that
    queue has run everything), the queues taken in commit order and each run until it blocks. The generator makes
    every two commands of different queues that touch the same bytes (one writing) ordered by these waits, so this
    order and the drawn one (which the waits allow too: each wait comes after what it waits for) give the same
    bytes. Raises ``ValueError`` when the waits never let every queue finish (a spec that would deadlock)."""
    pending = {q: [op for op in spec.ops if op.queue == q] for q in spec.queues()}
    signaled: set[int] = set()
    done: set[int] = set()
    out: list[Op] = []
    progress = True
    while progress:
        progress = False
        for q in spec.queues():
            ops = pending[q]
            while ops:
                op = ops[0]
                if (op.kind == "event-wait" and op.slot not in signaled) or (op.kind == "queue-wait"
                                                                             and op.slot not in done):
                    break
                ops.pop(0)
                progress = True
                if op.kind == "signal":
                    signaled.add(op.slot)
                elif op.kind in COMMANDS:
                    out.append(op)
            if not ops and q not in done:
                done.add(q)
                progress = True
    if len(done) != len(pending):
        stuck = {q: ops[0] for q, ops in pending.items() if ops}
        raise ValueError(f"the queues' waits never let them finish: {stuck}")
    return out


def build(spec: QueueSpec) -> Any:
    """The queue graph of ``spec`` for its target's device: one SUBMIT, or with several queues their SINK
    (``queues``, in ``spec.order``)."""
    from mtlir.frontend.nodes import buffer, buffer_variable, shared_event, timeline_value, view
    from mtlir.frontend.queue import Queue, queues
    from mtlir.ir.uop import UOp
    from mtlir.metal import DeviceSpec
    t = spec.target
    device = DeviceSpec(t.family, t.residency_set, t.icb)
    qs = {i: Queue(device, name=None if i == 0 else f"q{i}") for i in spec.queues()}
    bufs = [buffer_variable(f"in{i}") if i in spec.inputs else buffer(f"b{i}", 4 * n)
            for i, n in enumerate(spec.buffers)]
    variables = {name: UOp.variable(name, lo, hi) for name, (lo, hi) in spec.variables.items()}
    step = timeline_value()

    def as_view(v: View) -> UOp:
        if v.first == 0 and v.elems == spec.buffers[v.buffer]:
            return bufs[v.buffer]
        return view(bufs[v.buffer], 4 * v.first, 4 * v.elems)

    def blit_target(v: View, shift: str) -> tuple[UOp, UOp | int]:
        """A blit operand: the view as it is, or with a run-time shift the whole buffer and the offset expression."""
        if not shift:
            return as_view(v), 0
        return bufs[v.buffer], variables[shift] * 4 + 4 * v.first if v.first else variables[shift] * 4

    for op in spec.ops:
        q = qs[op.queue]
        size: UOp | int = variables[op.count] * 4 if op.count else 4 * (op.out.elems if op.out is not None else 0)
        if op.kind == "exec":
            lib = KERNELS[op.kernel]
            assert op.out is not None
            n: UOp | int = variables[op.n] if isinstance(op.n, str) else op.n
            vals: list[UOp | int] = [n, op.ins[0].elems] if lib.gathers else [n]
            grid = (n + (GROUP - 1)) // GROUP if isinstance(n, UOp) else -(-n // GROUP)
            q.exec(lib.kernel, [as_view(op.out), *map(as_view, op.ins)], vals, grid=(grid,), threadgroup=(GROUP,))
        elif op.kind == "copy":
            assert op.out is not None
            (src, src_off), (dst, dst_off) = blit_target(op.ins[0], op.src_shift), blit_target(op.out, op.shift)
            q.copy(src, dst, size, src_offset=src_off, dst_offset=dst_off)
        elif op.kind == "fill":
            assert op.out is not None
            dst, dst_off = blit_target(op.out, op.shift)
            q.fill(dst, op.slot, size, offset=dst_off)
        elif op.kind == "wait":
            q.wait(q.timeline, step - 1)
        elif op.kind == "signal":
            q.signal(shared_event(f"e{op.slot}"), step)
        elif op.kind == "event-wait":
            q.wait(shared_event(f"e{op.slot}"), step)
        elif op.kind == "queue-wait":
            q.wait(qs[op.slot].timeline, step)
        elif op.kind == "timestamp":
            q.timestamp(op.slot)
        else:
            raise ValueError(f"unknown op kind {op.kind!r}")
    for q in qs.values():
        q.signal(q.timeline, step)
    if len(qs) == 1:
        return qs[0].submit()
    return queues(*(qs[i] for i in spec.order))


@dataclass
class SimResult:
    """What the simulated device gave: the bytes of every MTLBuffer the run has (by ``QueueSpec.instances`` name)
    after each submit, and the selectors of each submit's messages."""

    buffers: list[dict[str, bytes]]
    messages: list[list[str]]


def run_sim(spec: QueueSpec, runner: Any, order_seed: int | None = None) -> SimResult:
    """Lower ``spec`` with the default pipeline, link it on a ``SimDevice`` (strict or faithful) whose kernels run on
    ``runner`` (one ``KernelRunner`` shared by every example: kernels build once), submit once per entry of
    ``spec.submits`` (each recorded: its messages), wait, and read every buffer after each. ``order_seed``: the
    order of the commands between two ICB barriers (``SimDevice(order_seed=...)``: None runs them last first, an
    int shuffles them). The GPU watchdog waits 30 s, not 2: on a busy machine a command buffer can wait on its fence
    that long without anything being wrong."""
    from mtlir.passes import lower
    from mtlir.runtime import Session
    from mtlir.runtime.link.link import collect_objects
    from mtlir.runtime.sim.device import SimDevice
    t = spec.target
    program = lower(build(spec), t.target).program
    names = {name for name, o in collect_objects(program).items() if o.kind == "buffer"}  # the ICB's included
    used = [i for i in range(len(spec.buffers)) if f"buffer:b{i}" in names]
    init = spec.initial()
    initial = {f"buffer:b{i}": init[i] for i in used}  # a buffer no dispatch binds is not in the Program
    out = SimResult([], [])
    sim = SimDevice(t.target, strict=t.strict, family=t.family, residency_sets=t.residency_set, icb=t.icb,
                    kernel_runner=runner, timeout_s=60, gpu_timeout_s=30, order_seed=order_seed)
    with sim, Session(program, sim, initial=initial, executor=t.executor, timeout_s=60) as s:
        placeholder = {f"b{i}": f"buffer:b{i}" for i in used}
        handles = {}
        for i in spec.inputs:  # the MTLBuffers given to the buffer variables, made after link
            for name in spec.instances(i):
                placeholder[name] = f"input:{name}"
                handles[name] = s.linked.new_buffer(f"input:{name}", 4 * spec.buffers[i], init[i])
        for k, values in enumerate(spec.submits):
            given = {**values, **{f"in{i}": handles[spec.bound(i, k)] for i in spec.inputs}}
            bound = {name: v for name, v in given.items() if name in program.variables}
            out.messages.append([m["selector"] for m in s.record_submit(**bound)])
            s.wait(timeout_s=60)
            out.buffers.append({name: s.read(p) for name, p in placeholder.items()})
    return out
