"""How far one scheduling step of the simulated GPU goes (``GPU._advance``): one operation when the GPU is held
(``SimDevice.step``), on through the operations after it up to a gate or the end when the worker or a waiting host
runs it (autorun) and its queue alone has work; one operation again while another queue has work (that queue's head
may have to run first: the order rules)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from mtlir.metal import MTL
from simscene import Scene


@pytest.fixture
def s() -> Iterator[Scene]:
    scene = Scene()
    yield scene
    scene.close()


def _one_fill(s: Scene) -> tuple[int, int]:
    out, var = s.buffer(256), s.buffer(256)
    s.set_int(var, 0, 5)
    icb = s.icb(1)
    s.command(icb, 0, "fill", [(out, 0), (var, 0)])
    s.residency(out, var)
    return icb, out


def _scheduler_step(s: Scene) -> bool:
    """One call of the scheduler as the worker thread or a driving host makes it (autorun on, no worker started)."""
    s.dev.autorun = True
    try:
        with s.dev._lock:
            return s.dev.gpu.step_locked()
    finally:
        s.dev.autorun = False


def test_a_held_gpu_runs_one_operation_per_step(s: Scene) -> None:
    icb, out = _one_fill(s)
    cb = s.submit_icb(icb, 0, 1, signal=1)
    statuses = []
    while s.dev.step():
        statuses.append(s.status(cb))
    # its start, the ICB range, the signal, its end
    assert statuses == [MTL.StatusScheduled] * 3 + [MTL.StatusCompleted]
    assert list(s.floats(out)[:4]) == [5, 5, 5, 5]


def test_a_step_runs_on_to_the_end_when_its_queue_alone_has_work(s: Scene) -> None:
    icb, out = _one_fill(s)
    a = s.submit_icb(icb, 0, 1, signal=1)
    b = s.submit_icb(icb, 0, 1, signal=2)  # behind a on the same queue: it waits for a either way
    assert _scheduler_step(s)
    assert s.status(a) == MTL.StatusCompleted and s.status(b) == MTL.StatusCommitted
    assert s.send(s.event, "signaledValue") == 1 and list(s.floats(out)[:4]) == [5, 5, 5, 5]
    assert _scheduler_step(s) and s.status(b) == MTL.StatusCompleted
    assert not _scheduler_step(s)


def test_a_step_that_runs_on_stops_at_a_gate(s: Scene) -> None:
    icb, out = _one_fill(s)
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "encodeSignalEvent:value:", s.event, 1)
    s.send(cb, "encodeWaitForEvent:value:", s.event, 3)  # nobody has signaled 3 yet
    s.encode_icb(cb, icb, 0, 1)
    s.send(cb, "commit")
    assert _scheduler_step(s)
    # the signal ran, the wait stopped it before the ICB range: no kernel ran
    assert s.status(cb) == MTL.StatusScheduled and s.send(s.event, "signaledValue") == 1
    assert s.dev.blocked_on(cb) is not None and not s.floats(out).any()
    assert not _scheduler_step(s)
    s.send(s.event, "setSignaledValue:", 3)
    assert _scheduler_step(s) and s.status(cb) == MTL.StatusCompleted
    assert list(s.floats(out)[:4]) == [5, 5, 5, 5]


def test_a_step_runs_one_operation_while_another_queue_has_work(s: Scene) -> None:
    icb, out = _one_fill(s)
    other = s.send(s.device, "newCommandQueueWithMaxCommandBufferCount:", 4)
    gate = s.send(s.device, "newSharedEvent")
    b = s.send(other, "commandBuffer")
    s.send(b, "encodeWaitForEvent:value:", gate, 1)
    s.send(b, "encodeSignalEvent:value:", s.event, 2)
    s.send(b, "commit")
    a = s.submit_icb(icb, 0, 1)
    steps = 0
    while s.status(a) < MTL.StatusCompleted:
        assert _scheduler_step(s)
        steps += 1
    # b's start, b reaching its wait, then a's start, range and end one at a time: b's head stays in the running
    assert steps == 5 and s.status(b) == MTL.StatusScheduled and list(s.floats(out)[:4]) == [5, 5, 5, 5]
    s.send(gate, "setSignaledValue:", 1)
    assert _scheduler_step(s)  # b alone now: on through its signal to its end
    assert s.status(b) == MTL.StatusCompleted and s.send(s.event, "signaledValue") == 2
