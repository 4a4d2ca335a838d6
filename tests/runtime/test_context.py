"""DeviceContext (runtime/context.py): buffers of one device never pass for another's; a close with work in flight
keeps what that work reaches and a later close releases it; its Sessions share one timeline whoever submits; after
the device's own close every call raises at once and close sends nothing."""
from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from mtlir.frontend.nodes import buffer, buffer_variable, timeline_value
from mtlir.frontend.queue import Queue
from mtlir.errors import ArgumentError, DeviceClosedError, LinkError, MetalValidationError
from mtlir.metal import MTL, DeviceSpec, Kernel, KernelParam
from mtlir.passes import lower
from mtlir.program.program import Program
from mtlir.runtime.context import ContextError, DeviceContext
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.objects import ResidencySet

MSL = """#include <metal_stdlib>
using namespace metal;
kernel void cp(device uchar* y, device uchar* x, uint3 lid [[thread_position_in_threadgroup]]) {
  y[lid.x] = x[lid.x] + 10;
}
"""


def test_a_buffer_of_another_device_is_refused_naming_it() -> None:
    spec = DeviceSpec("Apple9")
    k = Kernel("cp", "cp", MSL, (KernelParam(None, 0, "uint8", 64), KernelParam(None, 1, "uint8", 64)))
    q = Queue(spec)
    q.exec(k, [buffer_variable("y"), buffer("w", 64)], [], grid=(1,), threadgroup=(64,))
    q.signal(q.timeline, timeline_value())
    program = lower(q.submit(), target="x86_64").program
    sim_a, sim_b = SimDevice("x86_64"), SimDevice("x86_64")
    a, b = DeviceContext(sim_a, name="A", spec=spec), DeviceContext(sim_b, name="B", spec=spec)
    try:
        a.alloc(64)
        theirs = b.alloc(64)  # the same position in B as A's first buffer: it used to get the same handle
        with pytest.raises(ContextError, match=rf"A: buffer:w is handle {theirs.handle:#x}, which is no live buffer "
                                               "of this device"):
            a.session(program, shared_extra={"buffer:w": theirs.handle})
    finally:
        a.close()
        b.close()
        sim_a.close()
        sim_b.close()


def _program(msl: str = MSL, key: str = "cp") -> Program:
    """``cp`` of 64 bytes from the Program's own buffer ``w`` into the buffer variable ``y``; signals the timeline."""
    spec = DeviceSpec("Apple9")
    k = Kernel(key, "cp", msl, (KernelParam(None, 0, "uint8", 64), KernelParam(None, 1, "uint8", 64)))
    q = Queue(spec)
    q.exec(k, [buffer_variable("y"), buffer("w", 64)], [], grid=(1,), threadgroup=(64,))
    q.signal(q.timeline, timeline_value())
    return lower(q.submit(), target="x86_64").program


def test_close_with_work_in_flight_keeps_what_it_reaches_then_a_later_close_releases_everything() -> None:
    """As Session.close: the wait's timeout is not an error, nor is rule 14 for what the work in flight reaches
    (a ResourceWarning names it); a second close() releases it once the work has ended (it used to leak for good)."""
    program = _program()
    sim = SimDevice("x86_64", gpu_timeout_s=1.0)
    ctx = DeviceContext(sim, name="C", spec=DeviceSpec("Apple9"), timeout_s=0.05)
    with sim:
        s = ctx.session(program)
        y = ctx.alloc(64)
        sim.inject("0:hang")  # its kernel runs until the GPU watchdog (gpu_timeout_s)
        ctx.submit(s, y=y.handle)
        with pytest.warns(ResourceWarning, match=r"DeviceContext.close: C: kept alive.*DeviceBuffer\(C, 64 bytes"):
            ctx.close()
        assert ctx.closed and y.handle in ctx.buffers
        with pytest.raises(ContextError, match="alloc on device C, which is closed"):
            ctx.alloc(16)
        sim.run_until_idle(10.0)  # the watchdog ends the command buffer
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ctx.close()
        live = sim.live_objects()
        assert not {"MTLBuffer", "MTLComputePipelineState", "MTLCommandQueue", "MTLSharedEvent", "MTLFence",
                    "MTLResidencySet", "MTLIndirectCommandBuffer"} & set(live), live
        assert not ctx.buffers and not ctx.sessions


def test_the_sessions_of_a_context_share_its_timeline_whoever_submits() -> None:
    program = _program()
    sim = SimDevice("x86_64")
    with sim, DeviceContext(sim, name="C", spec=DeviceSpec("Apple9")) as ctx:
        s1, s2 = ctx.session(program), ctx.session(program)
        y = ctx.alloc(64)
        assert ctx.submit(s1, y=y.handle).value == 1
        s1.wait()
        assert s1.submit(y=y.handle).value == 2  # the Session's own submit takes the context's next value
        s2_value = ctx.submit(s2, y=y.handle).value
        assert s2_value == 3 and ctx.value == 3
        ctx.synchronize()
        assert s1.wait(s2_value) == []  # reached (by s2's submit): nothing of s1 is in flight
        assert ctx.next_value() == 4  # handed out, as for another Session's submit, not signaled yet
        with pytest.raises(ArgumentError, match=r"wait\(4\): no submit signals timeline value 4: the highest timeline "
                                                r"value submitted is 2 by this Session \(.*values up to 4: wait on the "
                                                r"Session that submitted 4.*the last value signaled is 3$"):
            s1.wait(4)


def test_after_the_device_closes_the_context_refuses_every_call_and_close_sends_nothing() -> None:
    program = _program()
    sim = SimDevice("x86_64", autorun=False)  # the submit below never runs
    ctx = DeviceContext(sim, name="C", spec=DeviceSpec("Apple9"))
    s = ctx.session(program)
    y = ctx.alloc(64)
    ctx.submit(s, y=y.handle)
    sim.close()
    t0 = time.monotonic()
    for call, what in ((lambda: ctx.synchronize(timeout_s=5.0), "synchronize"), (lambda: ctx.read(y), "read"),
                       (lambda: ctx.write(y, b"\0"), "write"), (lambda: ctx.alloc(16), "alloc"),
                       (lambda: ctx.submit(s, y=y.handle), "submit"), (lambda: ctx.session(program), "session")):
        with pytest.raises(DeviceClosedError, match=rf"^{what} on DeviceContext C: the device, SimDevice #\d+, is "
                                                    "closed"):
            call()
    assert time.monotonic() - t0 < 1.0  # no wait sat out its timeout
    with pytest.raises(DeviceClosedError):
        DeviceContext(sim, name="D")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctx.close()  # sends nothing: every message would raise
        ctx.close()
    assert ctx.closed and not ctx.buffers and not ctx.sessions


def test_a_fault_another_session_of_the_context_gets_first_is_reported_once() -> None:
    """Strict mode's out-of-bounds error is raised at the host's next call to the device, which may be another
    Session's submit: that error releases the faulting submit (a note names it), whose own wait reports nothing."""
    bad, good = _program(MSL.replace("y[lid.x]", "y[lid.x + 32]")), _program()
    sim = SimDevice("x86_64")
    with sim, DeviceContext(sim, name="C", spec=DeviceSpec("Apple9")) as ctx:
        s_good = ctx.session(good)
        with pytest.raises(LinkError, match="kernel key 'cp' names a pipeline compiled from another MSL"):
            ctx.session(bad)  # one key, two sources: it would run the other's pipeline
        s_bad = ctx.session(_program(MSL.replace("y[lid.x]", "y[lid.x + 32]"), key="cp_bad"))
        y = ctx.alloc(64)
        ctx.submit(s_bad, y=y.handle)
        while not sim.object(s_bad.inflight[0].cbs[0]).status >= MTL.StatusCompleted:  # type: ignore[attr-defined]
            time.sleep(0.001)
        with pytest.raises(MetalValidationError, match="out of bounds") as e:
            ctx.submit(s_good, y=y.handle)
        assert any("fault of submit 0 (timeline value 1) of another Session" in n for n in e.value.__notes__)
        assert not s_bad.inflight and s_bad.wait() == []
        assert ctx.submit(s_good, y=y.handle).value == 2  # the refused submit sent nothing: its value is free
        ctx.synchronize()


def test_write_and_read_count_bytes_and_name_a_bad_argument() -> None:
    """A memoryview of float32 is 4 bytes an element: its range is checked in bytes (it was checked in elements, so
    800 bytes at offset 500 of a 1 KiB buffer passed; on real Metal the memmove ran past the buffer). 0 bytes at the
    end is b""; a float offset, a str of data are a TypeError naming the argument (they were bridge errors)."""
    sim = SimDevice("x86_64")
    with sim, DeviceContext(sim, name="C", spec=DeviceSpec("Apple9")) as ctx:
        a, b = ctx.alloc(1024), ctx.alloc(1024)
        data = np.full(200, 7.0, np.float32).data  # a memoryview of 200 elements, 800 bytes
        for offset in (500, 900):
            with pytest.raises(ValueError, match=rf"write: bytes \[{offset}, {offset + 800}\) are outside the 1024 "):
                ctx.write(a, data, offset)
        ctx.write(a, data, 224)  # exactly to the end: [224, 1024)
        assert ctx.read(a, 224) == data.tobytes() and ctx.read(a, 0, 224) == bytes(224)
        ctx.write(a, np.arange(8, dtype=np.float32)[::2])  # type: ignore[arg-type]  # non-contiguous: C order
        assert np.frombuffer(ctx.read(a, 0, 16), np.float32).tolist() == [0.0, 2.0, 4.0, 6.0]
        assert ctx.read(a, 1024) == b"" and ctx.read(a, 1024, 0) == b"" and ctx.read(a, 10, 0) == b""
        ctx.write(a, b"", 1024)
        with pytest.raises(ValueError, match=r"^read: bytes \[-4, 1024\) are outside the 1024 bytes"):
            ctx.read(a, -4)  # to the end: the range it names is the one it would read
        with pytest.raises(TypeError, match=r"^read: offset \(bytes\) must be an int, got float 1\.5$"):
            ctx.read(a, 1.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^read: nbytes \(bytes\) must be an int, got float 2\.0$"):
            ctx.read(a, 0, 2.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^write: offset \(bytes\) must be an int, got bool True$"):
            ctx.write(a, b"x", True)
        with pytest.raises(TypeError, match=r"^write: data is bytes, bytearray, memoryview .*, got str$"):
            ctx.write(a, "abc")  # type: ignore[arg-type]
        assert ctx.read(b) == bytes(1024)  # nothing ran past a into b


def test_a_free_the_device_refuses_changes_nothing_and_close_leaves_no_object() -> None:
    """Strict mode refuses the release of a buffer a command buffer in flight reaches (rule 14): the buffer must
    stay the context's and resident (it was dropped from both first: the next submit binding it failed rule 10, a
    free after synchronize said 'was freed', and close() left the MTLBuffer alive)."""
    sim = SimDevice("x86_64", autorun=False)  # a submit stays in flight until run_until_idle
    with sim:
        ctx = DeviceContext(sim, name="C", spec=DeviceSpec("Apple9"))
        s = ctx.session(_program())
        y = ctx.alloc(64)
        rset = sim.object(ctx.residency_set)
        assert isinstance(rset, ResidencySet)
        ctx.submit(s, y=y.handle)
        with pytest.raises(MetalValidationError, match=rf"MTLBuffer {y.handle:#x} is deallocated while"):
            ctx.free(y)
        y_obj = sim.object(y.handle)
        assert ctx.buffers[y.handle] is y and y_obj in rset.committed
        sim.run_until_idle(10.0)
        ctx.synchronize()
        ctx.submit(s, y=y.handle)  # still resident: the commit passes rule 10
        sim.run_until_idle(10.0)
        ctx.synchronize()
        assert ctx.read(y) == bytes([10]) * 64  # y = w + 10, w the Program's zeroed buffer
        ctx.free(y)
        assert y.handle not in ctx.buffers and y_obj not in rset.committed and not y_obj.alive
        with pytest.raises(ContextError, match="was freed"):
            ctx.free(y)
        ctx.close()
        assert sim.live_objects() == {}


def test_a_closed_context_leaves_no_object_on_the_device() -> None:
    """Each pipeline's MSL and function name are +0 NSStrings: ``pipeline`` drains them in a pool of its own as
    link does (two per kernel outlived the context: 40 after 20 tinygrad kernels)."""
    sim = SimDevice("x86_64")
    with sim:
        ctx = DeviceContext(sim, name="C", spec=DeviceSpec("Apple9"))
        for i in range(3):
            ctx.session(_program(MSL.replace("+ 10", f"+ {i}"), key=f"cp{i}"))
        assert len(ctx.pipelines) == 3 and "NSString" not in sim.live_objects()
        ctx.close()
        assert sim.live_objects() == {}


def test_a_buffer_taken_out_of_the_residency_set_after_commits_that_passed_fails_rule_10() -> None:
    """The commit's rule-10 check is done once per (ICB range, residency set's commit) (checks.RangeInfo.resident_in):
    a buffer that leaves the set later is refused at the next commit, and a buffer named only by useResources or
    never resident still is at the first."""
    sim = SimDevice("x86_64")
    ctx = DeviceContext(sim, name="R", spec=DeviceSpec("Apple9"))
    try:
        s = ctx.session(_program())
        y = ctx.alloc(64)
        for _ in range(3):
            ctx.submit(s, y=y.handle)
            s.wait()
        m = ctx._ls.messenger
        m.send(ctx.residency_set, "removeAllocation:", y.handle)
        m.send(ctx.residency_set, "commit")
        with pytest.raises(MetalValidationError, match=r"binds MTLBuffer .* which is neither in a residency set"):
            ctx.submit(s, y=y.handle)
        m.send(ctx.residency_set, "addAllocation:", y.handle)
        m.send(ctx.residency_set, "commit")
        ctx.synchronize()
    finally:
        ctx.close()
        sim.close()
