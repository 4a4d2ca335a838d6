"""The simulated GPU's batched kernel path with real kernels: an ICB range enqueued in batches with one wait each,
launches prepared once per ICB command and reused while the ICB is unchanged, the fault of one dispatch of a batch
named, a batch that does not finish timed out naming its kernel, and every trace matching through the simulated
device when the runner copies buffers as on a discrete GPU."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mtlir.cli.lower import lower_trace
from mtlir.frontend.trace import load_trace
from mtlir.metal import MTL
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.kernels.launch import MAX_BATCH
from mtlir.runtime.sim.kernels.runner import KernelRunner
from simscene import Scene

TRACES = Path(__file__).resolve().parents[4] / "examples" / "traces"
HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
MSL = HEAD + """
kernel void fill(device float* out, uint3 lid [[thread_position_in_threadgroup]]) { out[lid.x] = 7.0f; }
kernel void add1(device float* out, uint3 lid [[thread_position_in_threadgroup]]) { out[lid.x] += 1.0f; }
kernel void copy(device float* out, device const float* src, uint3 lid [[thread_position_in_threadgroup]]) {
  out[lid.x] = src[lid.x] * 2.0f;
}
kernel void over(device float* out, uint3 lid [[thread_position_in_threadgroup]]) { out[lid.x + 4] = 1.0f; }
kernel void spin(device uint* x, uint3 lid [[thread_position_in_threadgroup]]) {
  uint j = x[0];  // a chain of loads, each waiting for the one before: ~35 ms on PoCL here, longer on a GPU
  for (int k = 0; k < 20000000; k++) { j = x[j & 3u]; }
  x[4 + lid.x] = j;
}
"""


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


@pytest.fixture
def scene(runner: KernelRunner) -> Iterator[Scene]:
    s = Scene(strict=False, runner=runner, autorun=True)
    s.lib = s.send(s.device, "newLibraryWithSource:options:error:", s.m.string(MSL), 0, s.err)
    s.pipelines = {k: s.pipeline(k) for k in ("fill", "add1", "copy", "over", "spin")}
    try:
        yield s
    finally:
        s.close()


def _run(s: Scene, icb: int, count: int, *use: int) -> int:
    cb = s.submit_icb(icb, 0, count, use=use)
    s.send(cb, "waitUntilCompleted")
    return cb


def test_a_range_longer_than_a_batch_runs_whole_and_reuses_its_launches(scene: Scene, runner: KernelRunner,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    s, n = scene, MAX_BATCH + 6
    out = s.buffer(16 * n)
    icb = s.icb(n, max_bind=1)
    for i in range(n):  # command i adds 1 to its own 4 floats, a view at byte 16 i
        s.command(icb, i, "add1", [(out, 16 * i)], barrier=False)
    prepared: list[Any] = []
    real = KernelRunner.prepare

    def counting(self: KernelRunner, *a: Any, **kw: Any) -> Any:
        prepared.append(kw.get("keep"))
        return real(self, *a, **kw)
    monkeypatch.setattr(KernelRunner, "prepare", counting)
    for round_ in (1, 2, 3):
        cb = _run(s, icb, n, out)
        assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
        assert s.floats(out)[:4 * n].tolist() == [float(round_)] * (4 * n)
    assert prepared == [True] * n  # once per ICB command, at its first run: the later submits reuse them


def test_a_command_the_cpu_changes_gets_a_new_launch(scene: Scene) -> None:
    s = scene
    a, b = s.buffer(16), s.buffer(16)
    icb = s.icb(1, max_bind=2)
    s.command(icb, 0, "fill", [(a, 0)])
    _run(s, icb, 1, a, b)
    s.command(icb, 0, "copy", [(b, 0), (a, 0)])  # another pipeline and other buffers
    cb = _run(s, icb, 1, a, b)
    assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
    assert s.floats(b)[:4].tolist() == [14.0] * 4


def test_the_fault_of_one_dispatch_of_a_batch_names_that_dispatch(scene: Scene) -> None:
    s = scene
    ok, small = s.buffer(16), s.buffer(16)
    icb = s.icb(3, max_bind=1)
    s.command(icb, 0, "fill", [(ok, 0)], barrier=False)
    s.command(icb, 1, "over", [(small, 0)], barrier=False)  # writes floats 4..7 of a 4-float buffer
    s.command(icb, 2, "add1", [(ok, 0)], barrier=False)
    cb = _run(s, icb, 3, ok, small)
    assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorPageFault
    text = s.error_text(cb)
    assert "ICB command 1 of" in text and "kernel 'over' wrote 4 bytes out of bounds" in text, text
    assert "ICB command 0 " not in text and "ICB command 2 " not in text
    s.command(icb, 1, "fill", [(small, 0)], barrier=False)  # fixed: the records were cleared, the next run is clean
    cb = _run(s, icb, 3, ok, small)
    assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)


SPIN = HEAD + """kernel void quick(device float* x) { x[3] = 1.0f; }
kernel void spin(device float* x, constant int& n) {
  float acc = x[0];
  for (int k = 0; k < n; k++) { acc = acc * 0.999999f + x[1]; }
  x[2] = acc;
}"""


def _quick_and_slow(own: KernelRunner) -> tuple[Any, Any]:
    """Two launches of ``SPIN`` on ``own``: ``quick`` and ``slow`` (>= 0.1 s on PoCL: 5x the 0.02 s timeouts of the
    tests, whatever the load)."""
    data, var = np.ones(16, np.uint8), np.zeros(4, np.uint8)
    var.view(np.int32)[0] = 120_000_000
    quick = own.compile(SPIN, "quick").prepare({0: (data, 0)}, (1, 1, 1), (1, 1, 1))
    slow = own.compile(SPIN, "spin").prepare({0: (data, 0), 1: (var, 0)}, (1, 1, 1), (1, 1, 1))
    assert quick is not None and slow is not None
    return quick, slow


def test_a_batch_that_does_not_finish_names_its_kernel() -> None:
    own = KernelRunner()
    quick, slow = _quick_and_slow(own)
    own.run_batch([quick], timeout_s=30)  # built and warm
    with pytest.raises(TimeoutError, match="kernel 'spin'.*did not finish within 0.02 s"):
        own.run_batch([quick, slow], timeout_s=0.02)
    with pytest.raises(RuntimeError, match="blocked by an earlier kernel that never finished"):
        own.run_batch([quick], timeout_s=1)
    own.queue.finish()  # let the spinning kernel end before the test does


@pytest.fixture(scope="module")
def copies() -> KernelRunner:
    return KernelRunner(in_host_memory=False)


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.json")), ids=lambda p: p.name.removesuffix(".json"))
def test_every_trace_matches_on_the_simulated_device_with_copies(copies: KernelRunner, path: Path) -> None:
    """The copy path a discrete GPU takes (buffers on the device between kernels, copied at each command buffer's
    start and end) through the whole simulated device, two submits each."""
    trace = load_trace(path)
    device = trace.device()
    program = lower_trace(trace, device, "x86_64", keep_stages=False).program
    dev = SimDevice("x86_64", family=device.family, residency_sets=device.residency_set, icb=device.icb,
                    kernel_runner=copies)
    try:
        with Session(program, dev, initial=trace.initial_data(), timeout_s=60) as s:
            for _ in range(2):
                s.submit(**trace.values)
            s.wait(timeout_s=60)
            o = trace.output
            got = np.frombuffer(s.read(o.placeholder, o.offset, o.nbytes), dtype=np.float32).reshape(o.shape)
            np.testing.assert_allclose(got, o.expected_array(), rtol=1e-4, atol=1e-5)
    finally:
        dev.close()


def test_a_device_copy_is_copied_in_again_only_when_the_host_changed_it() -> None:
    import pyopencl as cl
    copies_made: list[int] = []

    class Counting:  # pyopencl, counting the copies to the device (a numpy array as the source)
        def __getattr__(self, name: str) -> object:
            return getattr(cl, name)

        @staticmethod
        def enqueue_copy(queue: Any, dest: Any, src: Any, **kw: Any) -> Any:
            if isinstance(src, np.ndarray) and not isinstance(dest, np.ndarray):
                copies_made.append(src.nbytes)
            return cl.enqueue_copy(queue, dest, src, **kw)

    own = KernelRunner(cl=Counting(), in_host_memory=False)
    ck = own.compile(MSL, "copy")
    src, out = np.zeros(16, np.uint8), np.zeros(16, np.uint8)
    src.view(np.float32)[:] = [1, 2, 3, 4]
    ck.run({0: (out, 0), 1: (src, 0)}, (1, 1, 1), (4, 1, 1))
    assert out.view(np.float32).tolist() == [2, 4, 6, 8] and len(copies_made) == 2
    ck.run({0: (out, 0), 1: (src, 0)}, (1, 1, 1), (4, 1, 1))  # nothing changed on the host: nothing copied in
    assert len(copies_made) == 2
    src.view(np.float32)[2] = 10.0  # the host writes both buffers: both are copied in again
    out.view(np.float32)[0] = -1.0
    ck.run({0: (out, 0), 1: (src, 0)}, (1, 1, 1), (4, 1, 1))
    assert out.view(np.float32).tolist() == [2, 4, 20, 8] and len(copies_made) == 4


def test_a_kept_command_is_checked_again_at_every_run(scene: Scene) -> None:
    """A command whose launch is kept still meets the checks that can change while it stays the same: residency,
    a buffer released since, the pipeline's threadgroup limit."""
    s = scene
    a, b = s.buffer(16), s.buffer(16)
    icb = s.icb(2, max_bind=1)
    s.command(icb, 0, "add1", [(a, 0)])
    s.command(icb, 1, "add1", [(b, 0)])
    cb = _run(s, icb, 2, a, b)
    assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
    cb = _run(s, icb, 2, a)  # b is not made resident this time
    assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorInvalidResource
    assert "ICB command 1 of" in s.error_text(cb) and "not resident" in s.error_text(cb)
    s.dev.set_max_total_threads(s.pipelines["add1"], 2)  # below the commands' 4 threads: Metal drops them
    cb = _run(s, icb, 2, a, b)
    assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
    assert s.floats(a)[:4].tolist() == [2.0] * 4 and s.floats(b)[:4].tolist() == [1.0] * 4


def test_the_running_kernel_of_a_batch_is_named(scene: Scene) -> None:
    s = scene
    a, b = s.buffer(16), s.buffer(64)
    icb = s.icb(2, max_bind=1)
    s.command(icb, 0, "fill", [(a, 0)])
    s.command(icb, 1, "spin", [(b, 0)], tg=(1, 1, 1))
    cb = s.submit_icb(icb, 0, 2, use=(a, b))
    seen = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the batch's first kernel not completed: fill a moment, then spin
        seen = s.dev.running_kernel
        if seen is not None and seen[0] == "spin":
            break
        time.sleep(0.001)
    assert seen is not None and seen[0] == "spin" and seen[1].startswith("ICB command 1 of") and s.dev.kernel_running
    s.send(cb, "waitUntilCompleted")
    assert s.status(cb) == MTL.StatusCompleted and s.dev.running_kernel is None


class _FakeEvent:
    """An OpenCL event stand-in: its status goes through ``statuses`` one query at a time (then stays at the last)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses, self.waited = list(statuses), 0

    @property
    def command_execution_status(self) -> int:
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def wait(self) -> None:
        self.waited += 1
        if self.statuses[0] < 0:
            raise RuntimeError("the command failed")
        while self.statuses[0] > 0:
            if len(self.statuses) > 1:
                self.statuses.pop(0)
            else:
                time.sleep(0.001)


def test_a_wait_with_a_spin_sees_a_short_batch_end_on_its_own_thread() -> None:
    from mtlir.runtime.sim.kernels.waiter import EventWaiter
    w = EventWaiter()
    ev = _FakeEvent(2, 1, 1, 0)  # submitted, running twice, complete: seen while spinning
    assert w.wait(ev, 5.0, spin_s=1.0) and ev.waited == 0 and w._thread is None
    with pytest.raises(RuntimeError, match="the command failed"):
        w.wait(_FakeEvent(1, -5), 5.0, spin_s=1.0)
    stuck = _FakeEvent(1)  # never completes: the spin ends, the helper thread waits, the timeout still holds
    start = time.monotonic()
    assert not w.wait(stuck, 0.05, spin_s=0.01) and w._thread is not None
    assert 0.05 <= time.monotonic() - start < 2
    stuck.statuses = [0]  # let the helper thread go


@pytest.mark.parametrize("in_host_memory", [None, False])
def test_the_fault_record_of_each_launch_of_a_batch_is_read_back(in_host_memory: bool | None) -> None:
    """In place and by copies (the records gathered on the device, then read back in one copy): the launch that
    faulted, and its element, are the ones of its own record, whichever slot of the batch it ran in: the first,
    the last (its sub-buffer made at its first use) and one of the next batch."""
    own = KernelRunner(in_host_memory=in_host_memory)
    ok, over = own.compile(MSL, "add1"), own.compile(MSL, "over")
    small, big = np.zeros(16, np.uint8), np.zeros(64, np.uint8)
    n = MAX_BATCH + 2
    for where in (0, 5, MAX_BATCH - 1, MAX_BATCH + 1):
        batch = [(over if k == where else ok).prepare({0: (small if k == where else big, 0)}, (1, 1, 1), (4, 1, 1),
                                                     keep=True) for k in range(n)]
        fault = own.run_batch([la for la in batch if la is not None], 30)
        assert fault is not None and fault[0] == where, fault
        assert fault[1].function == "over" and 4 <= fault[1].element <= 7
        assert own.run_batch([batch[1] if where != 1 else batch[0]], 30) is None  # records cleared after a fault


def test_what_follows_the_kernels_is_enqueued_once_they_completed_on_either_thread() -> None:
    """``then`` (the copies to the host a batch ends with) runs only after the kernels' event completed, whether
    the caller's spin saw it or the helper thread did, and the wait also covers the event ``then`` returns."""
    from mtlir.runtime.sim.kernels.waiter import EventWaiter
    for spin in (1.0, 0.0):
        w = EventWaiter()
        kernels, copies = _FakeEvent(1, 1, 0), _FakeEvent(1, 0)
        seen: list[list[int]] = []

        def then() -> _FakeEvent:
            seen.append(list(kernels.statuses))
            return copies
        assert w.wait(kernels, 5.0, spin_s=spin, then=then)
        assert seen == [[0]] and copies.statuses == [0]  # called once, after completion; its event waited for
    w = EventWaiter()
    stuck, called = _FakeEvent(1), []
    assert not w.wait(stuck, 0.02, spin_s=0.005, then=lambda: called.append(1))
    assert called == []  # past the timeout the kernels still run: nothing enqueued behind them yet
    stuck.statuses = [0]
    deadline = time.monotonic() + 5
    while not called and time.monotonic() < deadline:
        time.sleep(0.001)
    assert called == [1]  # the helper thread enqueues it once they end


@pytest.mark.parametrize("in_host_memory", [None, False])
def test_a_started_batch_keeps_its_outcome_until_finish(in_host_memory: bool | None) -> None:
    """``start`` enqueues and returns; another use of the runner first waits for the started batch and keeps its
    outcome (here a fault) for ``finish``; the other batch runs as usual; results reach the host at the sync."""
    own = KernelRunner(in_host_memory=in_host_memory)
    ok, over = own.compile(MSL, "add1"), own.compile(MSL, "over")
    small, big = np.zeros(16, np.uint8), np.zeros(64, np.uint8)
    bad = over.prepare({0: (small, 0)}, (1, 1, 1), (4, 1, 1), keep=True)
    good = ok.prepare({0: (big, 0)}, (1, 1, 1), (4, 1, 1), keep=True)
    assert bad is not None and good is not None
    first = own.start([bad], 30)
    assert own.run_batch([good], 30, keep=True) is None  # waits for ``first`` before its own batch
    fault = own.finish(first)
    assert fault is not None and fault[0] == 0 and fault[1].function == "over"
    second = own.start([good], 30)
    own.sync()  # waits for it too
    assert own.finish(second) is None
    assert list(big.view(np.float32)[:4]) == [2.0, 2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="a batch has 1 to"):
        own.start([], 30)


def test_a_started_batch_past_its_timeout_raises_at_finish() -> None:
    own = KernelRunner()
    _, slow = _quick_and_slow(own)
    batch = own.start([slow], 0.02)
    with pytest.raises(TimeoutError, match="kernel 'spin'.*did not finish within 0.02 s"):
        own.finish(batch)
    assert own.stuck is not None
    own.queue.finish()  # let the spinning kernel end before the test does
