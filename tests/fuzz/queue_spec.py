"""A random queue as plain data (``QueueSpec``, JSON-able: failing ones are saved as regressions), built into an
mtlir queue graph and run on the simulated Metal device.

A spec names buffers by index (``buffer:b0`` ...), views by (buffer, first element, elements), and per dispatch a
kernel of ``msl_library.LIBRARY``, its output view, its input views and its element count ``n``: an int, or the name of
a run-time variable (then the grid is the expression ``(n + 31) // 32``). Besides dispatches a queue holds signals
of shared events and later waits on them, waits on its timeline, and timestamps.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from msl_library import GROUP, LIBRARY, LibKernel

KERNELS: dict[str, LibKernel] = {k.kernel.key: k for k in LIBRARY}


@dataclass(frozen=True)
class View:
    """``elems`` int32 elements of buffer ``buffer`` from element ``first``."""

    buffer: int
    first: int
    elems: int


@dataclass(frozen=True)
class Op:
    """One queue operation. ``kind``: ``exec`` (``kernel``, ``out``, ``ins``, ``n``), ``copy`` (blit: ``ins[0]``'s
    elements into ``out``, as many), ``fill`` (blit: every byte of ``out`` set to ``slot``), ``wait`` (on the queue's
    timeline, value ``timeline - 1``: lowers to nothing), ``signal`` / ``event-wait`` (shared event ``e<slot>`` at
    value ``timeline``: an event is signaled once per submit, a value it already has would be refused),
    ``timestamp`` (``slot``)."""

    kind: str
    kernel: str = ""
    out: View | None = None
    ins: tuple[View, ...] = ()
    n: int | str = 0
    slot: int = 0


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
    the operations; one dict of variable values per submit; the target."""

    buffers: tuple[int, ...]
    seed: int
    variables: dict[str, tuple[int, int]]
    ops: tuple[Op, ...]
    submits: tuple[dict[str, int], ...]
    target: Target = field(default_factory=Target)
    inputs: tuple[int, ...] = ()

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
                       tuple(View(**v) for v in o["ins"]), o["n"], o["slot"]) for o in d["ops"])
        return QueueSpec(tuple(d["buffers"]), d["seed"], {k: (lo, hi) for k, (lo, hi) in d["variables"].items()},
                         ops, tuple(d["submits"]), Target(**d["target"]), tuple(d.get("inputs", ())))


def n_value(n: int | str, values: dict[str, int]) -> int:
    """The element count of a dispatch at one submit's values."""
    return values[n] if isinstance(n, str) else n


def build(spec: QueueSpec) -> Any:
    """The queue graph of ``spec`` (one SUBMIT) for its target's device."""
    from mtlir.frontend.nodes import buffer, buffer_variable, shared_event, timeline_value, view
    from mtlir.frontend.queue import Queue
    from mtlir.ir.uop import UOp
    from mtlir.metal import DeviceSpec
    t = spec.target
    q = Queue(DeviceSpec(t.family, t.residency_set, t.icb))
    bufs = [buffer_variable(f"in{i}") if i in spec.inputs else buffer(f"b{i}", 4 * n)
            for i, n in enumerate(spec.buffers)]
    variables = {name: UOp.variable(name, lo, hi) for name, (lo, hi) in spec.variables.items()}
    step = timeline_value()

    def as_view(v: View) -> UOp:
        if v.first == 0 and v.elems == spec.buffers[v.buffer]:
            return bufs[v.buffer]
        return view(bufs[v.buffer], 4 * v.first, 4 * v.elems)

    for op in spec.ops:
        if op.kind == "exec":
            lib = KERNELS[op.kernel]
            assert op.out is not None
            n: UOp | int = variables[op.n] if isinstance(op.n, str) else op.n
            vals: list[UOp | int] = [n, op.ins[0].elems] if lib.gathers else [n]
            grid = (n + (GROUP - 1)) // GROUP if isinstance(n, UOp) else -(-n // GROUP)
            q.exec(lib.kernel, [as_view(op.out), *map(as_view, op.ins)], vals, grid=(grid,), threadgroup=(GROUP,))
        elif op.kind == "copy":
            assert op.out is not None
            q.copy(as_view(op.ins[0]), as_view(op.out), 4 * op.out.elems)
        elif op.kind == "fill":
            assert op.out is not None
            q.fill(as_view(op.out), op.slot, 4 * op.out.elems)
        elif op.kind == "wait":
            q.wait(q.timeline, step - 1)
        elif op.kind == "signal":
            q.signal(shared_event(f"e{op.slot}"), step)
        elif op.kind == "event-wait":
            q.wait(shared_event(f"e{op.slot}"), step)
        elif op.kind == "timestamp":
            q.timestamp(op.slot)
        else:
            raise ValueError(f"unknown op kind {op.kind!r}")
    q.signal(q.timeline, step)
    return q.submit()


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
