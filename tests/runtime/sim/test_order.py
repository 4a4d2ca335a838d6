"""The order the simulated GPU runs the commands between two ICB barriers in (rule 9): last first, or shuffled from
``SimDevice(order_seed=...)``; with the barriers pass every shipped trace and a queue with concurrent commands
compute the right answer under every order, and a barrier the pass keeps (a read-after-write through views of one
buffer), removed by hand, is refused in strict mode and gives the wrong answer in faithful mode."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mtlir.cli.lower import lower_trace
from mtlir.errors import ArgumentError, MetalValidationError
from mtlir.frontend.nodes import buffer, timeline_value, view
from mtlir.frontend.queue import Queue
from mtlir.frontend.trace import load_trace
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj
from mtlir.passes import lower
from mtlir.program.payloads import CommandList, IcbSpec
from mtlir.program.program import Program
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.dispatch import concurrent_order

TRACES = Path(__file__).resolve().parents[3] / "examples" / "traces"
SEEDS = (None, 1, 2, 3)  # None: last command first

DOUBLE = Kernel("double", "double_it", """
kernel void double_it(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                      uint i [[thread_position_in_grid]]) { y[i] = 2.0f * x[i]; }""",
                (KernelParam(None, 0, "float32", 64), KernelParam(None, 1, "float32", 64)))
INC = Kernel("inc", "inc", """
kernel void inc(const device float* y [[buffer(0)]], device float* z [[buffer(1)]],
                uint i [[thread_position_in_grid]]) { z[i] = y[i] + 1.0f; }""",
             (KernelParam(None, 0, "float32", 64), KernelParam(None, 1, "float32", 64)))
X = np.arange(64, dtype=np.float32)


def _icb(program: Program) -> IcbSpec:
    (spec,) = [o.payload[0] for o in program.objects.values() if o.kind == "icb"]
    assert isinstance(spec, IcbSpec)
    return spec


def _without_barrier(program: Program, index: int) -> Program:
    """``program`` with the barrier of ICB command ``index`` removed by hand."""
    objects = dict(program.objects)
    for reg, obj in objects.items():
        if obj.kind == "icb":
            spec = obj.payload[0]
            cmds = list(spec.commands)
            cmds[index] = cmds[index]._replace(barrier=False)
            objects[reg] = Obj("icb", obj.name, (dataclasses.replace(spec, commands=CommandList(cmds)),))
    return dataclasses.replace(program, objects=objects)


def _fan_in() -> Program:
    """x -> b[0:256] and x -> b[256:512] (disjoint views: concurrent), then b[0:256] + 1 -> b[512:768] (reads
    what command 0 wrote: a barrier), then b[256:512] + 1 -> out."""
    x, b, out = buffer("x", 256), buffer("b", 768), buffer("out", 256)
    q = Queue(DeviceSpec("Apple9"))
    q.exec(DOUBLE, [x, view(b, 0, 256)], [], (2,), (32,))
    q.exec(DOUBLE, [x, view(b, 256, 256)], [], (2,), (32,))
    q.exec(INC, [view(b, 0, 256), view(b, 512, 256)], [], (2,), (32,))
    q.exec(INC, [view(b, 256, 256), out], [], (2,), (32,))
    q.signal(q.timeline, timeline_value())
    return lower(q.submit(), target="x86_64").program


def _run(program: Program, **kw: object) -> tuple[np.ndarray, np.ndarray]:
    with SimDevice("x86_64", **kw) as dev, Session(program, dev, initial={"buffer:x": X.tobytes()},
                                                   timeout_s=60) as s:
        s.submit()
        s.wait(timeout_s=60)
        b = np.frombuffer(s.read("buffer:b"), np.float32)
        return b, np.frombuffer(s.read("buffer:out"), np.float32)


def test_groups_run_last_first_or_shuffled_by_the_seed() -> None:
    barriers = [True, False, False, False, False, True, False, False]
    icb = SimpleNamespace(slots={i: SimpleNamespace(barrier=b) for i, b in enumerate(barriers) if i != 6})
    assert concurrent_order(icb, 0, 8) == [4, 3, 2, 1, 0, 7, 5]  # type: ignore[arg-type]
    assert concurrent_order(icb, 2, 4) == [4, 3, 2, 5]  # type: ignore[arg-type]
    orders = {tuple(concurrent_order(icb, 0, 8, seed)) for seed in range(8)}  # type: ignore[arg-type]
    assert len(orders) > 2  # different seeds, different orders
    for order in orders:
        assert sorted(order[:5]) == [0, 1, 2, 3, 4] and sorted(order[5:]) == [5, 7]  # never across a barrier
    assert concurrent_order(icb, 0, 8, 5) == concurrent_order(icb, 0, 8, 5)  # type: ignore[arg-type]


def test_order_seed_is_checked() -> None:
    """Also when set on a device: 'x' or [1] made the GPU fail later with a bare internal error, -5 and 2.5 were
    taken silently."""
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ArgumentError, match="order_seed"):
            SimDevice("x86_64", order_seed=bad)  # type: ignore[arg-type]
    with SimDevice("x86_64") as dev:
        for bad in (-5, 2.5, "x", [1], True):
            with pytest.raises(ArgumentError, match=r"order_seed is an int >= 0 or None, got"):
                dev.order_seed = bad  # type: ignore[assignment]
            assert dev.order_seed is None
        dev.order_seed = 7
        assert dev.order_seed == 7


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.json")), ids=lambda p: p.name.removesuffix(".json"))
def test_every_trace_is_right_under_every_order(path: Path) -> None:
    trace = load_trace(path)
    device = trace.device()
    program = lower_trace(trace, device, "x86_64", keep_stages=False).program
    assert _icb(program).commands[0].barrier is False  # the barriers pass ran
    o = trace.output
    with SimDevice("x86_64", family=device.family) as dev, Session(program, dev, initial=trace.initial_data(),
                                                                   timeout_s=60) as s:
        for seed in SEEDS:  # the device reads the seed at each executeCommandsInBuffer
            dev.order_seed = seed
            s.write(o.placeholder, bytes(o.nbytes), o.offset)
            s.submit(**trace.values)
            s.wait(timeout_s=60)
            got = np.frombuffer(s.read(o.placeholder, o.offset, o.nbytes), np.float32).reshape(o.shape)
            np.testing.assert_allclose(got, o.expected_array(), rtol=1e-4, atol=1e-5, err_msg=f"seed {seed}")


def test_the_pass_lets_independent_commands_run_together() -> None:
    program = _fan_in()
    assert [c.barrier for c in _icb(program).commands] == [False, False, True, False]
    for seed in SEEDS:
        for strict in (True, False):
            b, out = _run(program, order_seed=seed, strict=strict)
            np.testing.assert_array_equal(b, np.concatenate([2 * X, 2 * X, 2 * X + 1]))
            np.testing.assert_array_equal(out, 2 * X + 1)


def test_a_kept_barrier_removed_by_hand_is_a_race() -> None:
    program = _without_barrier(_fan_in(), 2)  # command 2 reads b[0:256] as command 0 writes it
    with pytest.raises(MetalValidationError, match=r"ICB commands 0, 1, 2, 3 .* run concurrently .* data race"):
        _run(program)
    b, _ = _run(program, strict=False)  # faithful: the reverse order reads b[0:256] before it is written
    np.testing.assert_array_equal(b, np.concatenate([2 * X, 2 * X, np.ones(64, np.float32)]))  # 0 + 1, not 2x + 1


_COPY = """#include <metal_stdlib>
using namespace metal;
kernel void copyk(device float* out, const device float* inp, uint3 gid [[threadgroup_position_in_grid]],
                  uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 64 + lid.x;
  out[i] = inp[i] * 2.0f;
}
"""


def _two_queues(synchronized: bool, producer_first: bool) -> Program:
    """Queue prod writes b = 2a, queue cons reads c = 2b: with a wait on prod's timeline (``synchronized``) or none
    (a race between queues: Metal orders no two queues without a wait)."""
    from mtlir.frontend.nodes import shared_event
    from mtlir.frontend.queue import queues
    dev, n = DeviceSpec("Apple9"), 256
    k = Kernel("copyk", "copyk", _COPY, (KernelParam(None, 0, "float32"), KernelParam(None, 1, "float32")))
    a, b, c = buffer("a", 4 * n), buffer("b", 4 * n), buffer("c", 4 * n)
    v = timeline_value()
    prod, cons = Queue(dev, name="prod"), Queue(dev, name="cons")
    prod.exec(k, [b, a], [], grid=(n // 64,), threadgroup=(64,)).signal(shared_event("done"), v)
    if synchronized:
        cons.wait(shared_event("done"), v)
    cons.exec(k, [c, b], [], grid=(n // 64,), threadgroup=(64,)).signal(cons.timeline, v)
    graph = queues(prod, cons) if producer_first else queues(cons, prod)
    return lower(graph, target="x86_64").program


def _c_after_one_submit(program: Program, seed: int) -> np.ndarray:
    a = np.arange(256, dtype=np.float32) + 1
    with SimDevice("x86_64", autorun=False, order_seed=seed) as dev, \
            Session(program, dev, initial={"buffer:a": a.tobytes()}, timeout_s=20) as s:
        s.submit()
        dev.run_until_idle()  # the GPU runs on this thread: the seed alone decides which queue goes first
        s.wait(timeout_s=20)
        return np.frombuffer(s.read("buffer:c"), np.float32) / a


def test_the_order_seed_also_orders_the_queues() -> None:
    """A race between two queues (cons reads what prod writes, no wait) gives a result that depends on the seed in
    either commit order, as on a GPU that runs the queues concurrently; with the wait every seed agrees."""
    for producer_first in (True, False):
        racy = _two_queues(False, producer_first)
        seen = {float(_c_after_one_submit(racy, seed)[0]) for seed in range(8)}
        assert seen == {0.0, 4.0}, (producer_first, seen)  # cons before prod (c = 0) and after it (c = 4a)
        synced = _two_queues(True, producer_first)
        assert {float(_c_after_one_submit(synced, seed)[0]) for seed in range(8)} == {4.0}
