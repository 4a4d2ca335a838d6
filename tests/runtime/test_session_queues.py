"""Several queues in one Program on the simulated device (issue 17): link makes each queue, fence and timeline;
one submit commits to each queue in order; a cross-queue wait orders the work; the host signals and waits on any
event of the Program."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from mtlir.errors import GPUExecutionError, MetalValidationError, WaitTimeoutError
from mtlir.frontend.nodes import buffer, shared_event, timeline_value
from mtlir.frontend.queue import Queue, queues
from mtlir.metal import DeviceSpec, Kernel, KernelParam
from mtlir.passes import lower
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice

N = 64
ADD1_MSL = """#include <metal_stdlib>
using namespace metal;
kernel void add1(device float* out, device float* x, uint3 gid [[threadgroup_position_in_grid]],
                 uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 64 + lid.x;
  out[i] = x[i] + 1.0f;
}
"""
ADD1 = Kernel("add1", "add1", ADD1_MSL, (KernelParam(None, 0, "float32", N), KernelParam(None, 1, "float32", N)))
DEV = DeviceSpec("Apple9")


def _program(host_wait: bool = False) -> Session:
    a, b, c = buffer("a", 4 * N), buffer("b", 4 * N), buffer("c", 4 * N)
    v = timeline_value()
    copy, compute = Queue(DEV, name="copy"), Queue(DEV)
    if host_wait:
        copy.wait(shared_event("go"), v)
    copy.exec(ADD1, [b, a], grid=(1,), threadgroup=(N,)).signal(copy.timeline, v)
    compute.wait(copy.timeline, v).exec(ADD1, [c, b], grid=(1,), threadgroup=(N,)).signal(compute.timeline, v)
    program = lower(queues(copy, compute), target="x86_64").program
    dev = SimDevice("x86_64", family="Apple9")
    return Session(program, dev, initial={"buffer:a": np.arange(N, dtype=np.float32).tobytes()}, timeout_s=10)


def test_a_cross_queue_wait_orders_two_queues() -> None:
    s = _program()
    with s.bridge, s:  # type: ignore[attr-defined]
        for _ in range(3):
            s.submit()
            s.wait()
        c = np.frombuffer(s.read("buffer:c"), np.float32)
        assert (c == np.arange(N) + 2).all()
        assert s.event_value("event:copy") == s.event_value("event") == 3
        assert s.timeline_value() == 3


def test_the_host_signals_a_shared_event_the_copy_queue_waits_for() -> None:
    s = _program(host_wait=True)
    with s.bridge, s:  # type: ignore[attr-defined]
        s.submit()
        with pytest.raises(WaitTimeoutError, match=r"wait_event\('event', 1\): not reached after 0.1 s \(its value "
                                                   r"is 0\)"):
            s.wait_event("event", 1, timeout_s=0.1)
        # a wait's timeout names what a pending command buffer waits for (the simulated GPU can tell)
        with pytest.raises(WaitTimeoutError, match=r"submit 0 \(value 1\): Scheduled \(command buffer 0 \(queue "
                                                   r"'copy'\) waits for MTLSharedEvent 0x[0-9a-f]+ \(event:go\) to "
                                                   r"reach 1 \(encodeWaitForEvent:value:\)\), Scheduled \(command "
                                                   r"buffer 1 \(the default queue\) waits for .*\(event:copy\)"):
            s.wait(timeout_s=0.1)
        threading.Timer(0.05, s.signal_event, ("event:go", 1)).start()
        s.wait_event("event", 1, timeout_s=5)
        s.wait()
        assert (np.frombuffer(s.read("buffer:c"), np.float32) == np.arange(N) + 2).all()
        with pytest.raises(ValueError, match="no event 'event:nope' in this Program: it has event"):
            s.event_value("event:nope")


def test_blits_copy_and_fill_with_offsets_set_per_submit() -> None:
    from mtlir.ir.uop import UOp
    a, b = buffer("a", 256), buffer("b", 256)
    k = UOp.variable("k", 0, 3)
    q = Queue(DeviceSpec("Apple7"))
    q.fill(b, 7).copy(a, b, 64, src_offset=k * 64, dst_offset=64).exec(ADD1, [a, b], grid=(1,), threadgroup=(N,))
    q.signal(q.timeline, timeline_value())
    program = lower(q.submit(), target="arm64").program
    with SimDevice("arm64", family="Apple7") as dev, \
            Session(program, dev, initial={"buffer:a": np.arange(64, dtype=np.float32).tobytes()}) as s:
        s.submit(k=2)
        s.wait()
        got = np.frombuffer(s.read("buffer:b"), np.uint8)
        assert (got[:64] == 7).all() and (got[128:] == 7).all()
        assert (got[64:128].view(np.float32) == np.arange(32, 48)).all()
        a_now = np.frombuffer(s.read("buffer:a"), np.float32)  # the kernel ran after the blits: a = b + 1
        assert (a_now[16:32] == np.arange(32, 48) + 1).all()


def test_the_two_queues_example_runs_and_matches() -> None:
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "examples" / "two_queues.py"
    proc = subprocess.run([sys.executable, "-P", str(script), "--run", "--target", "x86_64"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "6 steps over two queues: timelines copy 6, compute 6; outputs match numpy" in proc.stderr
    proc = subprocess.run([sys.executable, "-P", str(script), "--json"], capture_output=True, text=True, timeout=300)
    import json
    msgs = [(m["receiver"], m["selector"], m["args"]) for m in json.loads(proc.stdout)["messages"]]
    waits = [i for i, m in enumerate(msgs) if m[1] == "encodeWaitForEvent:value:"]
    assert [msgs[i][2] for i in waits] == [["event", 0], ["event:copy", 0]]
    assert [msgs[i + 1][1] for i in waits] == ["blitCommandEncoder", "computeCommandEncoder"]
    assert ("blit", "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:",
            ["buffer:staging", 1024, "buffer:inputs", 1024, 1024]) in msgs


def test_a_submit_that_completes_without_its_timeline_value_is_reported_at_once() -> None:
    """A Program that signals its timeline with another value (``timeline - 1``): its submit completes, the value
    never comes. The wait sat out its whole timeout ("... command buffer statuses: Completed") and so did the next
    submit's wait for it; now the wait says so at once (a ValueError) and releases the submit."""
    import time
    a, b = buffer("a", 4 * N), buffer("b", 4 * N)
    v = timeline_value()
    q = Queue(DEV)
    q.exec(ADD1, [b, a], grid=(1,), threadgroup=(N,)).signal(q.timeline, v - 1)
    program = lower(q.submit(), target="x86_64").program
    with SimDevice("x86_64", family="Apple9") as dev, Session(program, dev, timeout_s=20) as s:
        with pytest.raises(MetalValidationError, match=r"value:0 .*0 is not above 0"):  # strict: a signal of 0
            s.submit()  # does nothing (Metal ignores a value not above the event's), refused at once
    with SimDevice("x86_64", family="Apple9", strict=False) as dev, Session(program, dev, timeout_s=20) as s:
        t0 = time.monotonic()
        s.submit()
        with pytest.raises(ValueError, match=r"submit 0 \(timeline value 1\) completed, but the timeline is at 0: "
                                             r"the Program's command buffers ran without signaling its value"):
            s.wait(timeout_s=20)
        assert not s.inflight and s.submits_completed == 1
        s.submit()  # nothing in flight to wait for
        with pytest.raises(ValueError, match=r"submit 1 \(timeline value 2\) completed, but the timeline is at 1"):
            s.wait(timeout_s=20)
        assert time.monotonic() - t0 < 10  # not the timeouts


@pytest.mark.parametrize("work", ["copy", "none"])
def test_an_injected_fault_on_a_command_buffer_without_kernels_skips_its_signals(work: str) -> None:
    """A fault armed for a command buffer with no kernel struck at its end, after its signals had fired: the
    consumer queue waiting on them ran on the failed upload's output. It now strikes before the first blit (a copy
    queue) or, with no GPU work at all, before the first signal: the signal is skipped (METAL.md §3 rule 6) and
    the consumer never runs."""
    a, b, c = buffer("a", 4 * N), buffer("b", 4 * N), buffer("c", 4 * N)
    v = timeline_value()
    copy, compute = Queue(DEV, name="copy"), Queue(DEV)
    if work == "copy":
        copy.copy(a, b, 4 * N)
    copy.signal(copy.timeline, v)
    compute.wait(copy.timeline, v).exec(ADD1, [c, b], grid=(1,), threadgroup=(N,)).signal(compute.timeline, v)
    program = lower(queues(copy, compute), target="x86_64").program
    initial = {"buffer:a": np.ones(N, np.float32).tobytes()} if work == "copy" else {}
    with SimDevice("x86_64", family="Apple9", gpu_timeout_s=1) as dev, Session(program, dev, initial=initial,
                                                                               timeout_s=10) as s:
        dev.inject("0:PageFault")
        s.submit()
        with pytest.raises(GPUExecutionError, match=r"command buffer 0 \(queue 'copy'\) failed with status Error, "
                                                     r"MTLCommandBufferError 3 \(PageFault\); after it: command buffer "
                                                     r"1 \(the default queue\) Error") as e:
            s.wait(timeout_s=10)
        where = "at copyFromBuffer:" if work == "copy" else "at the start of a command buffer without GPU work"
        assert where in str(e.value)
        assert s.event_value("event:copy") == 0  # the failed copy's signal was skipped
        assert e.value.command_buffers[1].startswith("Error")  # the consumer did not run
        assert not np.frombuffer(s.read("buffer:c"), np.float32).any()


def test_a_wait_for_a_value_reached_returns_though_a_submit_never_signals_its_own() -> None:
    """wait(v) for a value the timeline has reached returns, though the submit that should signal more never will
    (it signaled ``timeline - 1``); a wait for everything then reports that submit (faithful mode: strict refuses
    the signal of 0 at the first submit)."""
    a, b = buffer("a", 4 * N), buffer("b", 4 * N)
    v = timeline_value()
    q = Queue(DEV)
    q.exec(ADD1, [b, a], grid=(1,), threadgroup=(N,)).signal(q.timeline, v - 1)
    program = lower(q.submit(), target="x86_64").program
    with SimDevice("x86_64", family="Apple9", strict=False) as dev, Session(program, dev, timeout_s=20) as s:
        s.submit(timeline=3)  # signals 2
        s.wait_event("event", 2, timeout_s=20)
        assert s.wait(2, timeout_s=20) == [] and len(s.inflight) == 1  # 2 is reached: nothing to report yet
        with pytest.raises(ValueError, match=r"submit 0 \(timeline value 3\) completed, but the timeline is at 2"):
            s.wait(timeout_s=20)
