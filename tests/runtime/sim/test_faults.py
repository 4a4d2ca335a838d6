"""Fault injection (issue 13, docs/reliability.md): a command buffer that fails with each MTLCommandBufferError, a
kernel that never finishes, an allocation that returns nil. Each fault ends in bounded time (a generous timeout, never
a timed assertion), the Session raises ``GPUExecutionError`` naming the command buffer, the code and its name and what
became of the command buffers after it; the device stays usable (the next submit on a fresh timeline value works)
and buffers no failed command wrote keep their bytes; a nil allocation is a ``LinkError`` naming the object, with
nothing left half-linked."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from progbuild import submit_program

from mtlir.errors import ArgumentError, DeviceClosedError, GPUExecutionError, LinkError, WaitTimeoutError
from mtlir.metal import MTL, DeviceSpec, Kernel, KernelParam
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.injection import Fault

NAMED = {"Timeout": 2, "PageFault": 3, "NotPermitted": 7, "OutOfMemory": 8, "InvalidResource": 9}
MODES = [True, False]
MODE_IDS = ["strict", "faithful"]
WAIT_S = 30.0  # generous: every fault here ends in well under a second (a hang: its watchdog's 0.3 s)


def _session(dev: SimDevice, **kw: Any) -> Session:
    return Session(submit_program("x86_64", kernels=2, family="Apple7"), dev, timeout_s=WAIT_S, **kw)


def _device(strict: bool = True, **kw: Any) -> SimDevice:
    kw.setdefault("gpu_timeout_s", 0.3)
    return SimDevice("x86_64", strict=strict, family="Apple7", **kw)


def _buffers(s: Session) -> dict[str, bytes]:
    """The bytes of every buffer the kernels write (the variables buffer is the host's: each submit patches it)."""
    return {name: s.read(name) for name in ("buffer:0", "buffer:1")}


def _live_host_blocks(dev: SimDevice) -> int:
    """Host memory blocks (malloc'd tables, buffer contents, C strings) still mapped on ``dev``."""
    return sum(1 for reg in dev.memory._regions if reg.alive)


# ---- spelling


@pytest.mark.parametrize("text, fault", [
    ("0:PageFault", Fault("command_buffer", 0, 3)), ("3:invalidresource", Fault("command_buffer", 3, 9)),
    ("1:2", Fault("command_buffer", 1, 2)), ("2:hang", Fault("hang", 2)), ("alloc:buffer", Fault("alloc", 0, 0,
                                                                                                  "buffer")),
    ("alloc:ICB:4", Fault("alloc", 4, 0, "icb")), ("alloc:pipeline:1", Fault("alloc", 1, 0, "pipeline")),
])
def test_a_fault_reads_as_the_flag_spells_it(text: str, fault: Fault) -> None:
    assert Fault.parse(text) == fault
    assert Fault.parse(fault.spec()) == fault


@pytest.mark.parametrize("text, match", [
    ("PageFault", "expected K:NAME or K:CODE"), ("0:Bogus", "'Bogus' is not an MTLCommandBufferError name"),
    ("0:6", "6 is not an MTLCommandBufferError code"), ("0:0", "0 is not an MTLCommandBufferError code"),
    ("-1:PageFault", "'-1' is not an index"), ("alloc:texture", "expected alloc:KIND"),
    ("alloc:buffer:x", "'x' is not an index"), ("1:2:3", "expected K:NAME"),
])
def test_a_fault_spelled_wrong_is_an_argument_error_naming_it(text: str, match: str) -> None:
    with pytest.raises(ArgumentError, match=match):
        Fault.parse(text)


def test_a_bool_is_no_error_code() -> None:
    """``Fault("command_buffer", 0, True)`` was accepted as code 1 (True == 1)."""
    with pytest.raises(ArgumentError, match="True is not an MTLCommandBufferError code"):
        Fault("command_buffer", 0, True)
    assert Fault("command_buffer", 0, 1).code == 1


def test_two_faults_for_one_command_buffer_are_refused_and_nothing_is_armed() -> None:
    with _device() as dev:
        with pytest.raises(ArgumentError, match=r"command buffer 0 already has a fault armed \(0:PageFault\)"):
            dev.inject("1:Timeout", "0:PageFault", "0:Timeout")
        assert dev.faults.armed == []


# ---- a command buffer that fails


@pytest.mark.parametrize("strict", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("name", list(NAMED))
def test_each_named_fault_fails_the_submit_and_the_device_goes_on(name: str, strict: bool) -> None:
    with _device(strict) as dev, _session(dev) as s:
        s.submit(n=64)
        s.wait()
        before = _buffers(s)
        dev.inject(f"0:{name}")
        s.submit(n=64)  # value 2: its only command buffer fails at its first kernel, before it runs
        with pytest.raises(GPUExecutionError) as e:
            s.wait()
        err = e.value
        assert (err.code, err.name, err.submit, err.command_buffer) == (NAMED[name], name, 1, 0)
        assert err.command_buffers == {0: f"Error ({name})"}
        assert (f"submit 1 (timeline value 2): command buffer 0 failed with status Error, MTLCommandBufferError "
                f"{NAMED[name]} ({name}); no command buffer of the submit comes after it") in str(err)
        assert f"an injected fault (0:{name})" in str(err)
        assert _buffers(s) == before  # no failed command wrote them: exactly their previous bytes
        assert s.timeline_value() == 1  # Metal skipped the failed command buffer's signal (METAL.md §3 rule 6)
        s.submit(n=64)  # a fresh timeline value: 3
        (done,) = s.wait()
        assert done.value == 3 and s.timeline_value() == 3 and not s.inflight
        assert _buffers(s) != before and dev.faults.armed == []


def test_the_index_counts_command_buffers_committed_after_arming() -> None:
    with _device() as dev, _session(dev) as s:
        dev.inject("1:OutOfMemory")
        s.submit(n=8)
        s.wait()  # command buffer 0 after arming: runs
        s.submit(n=8)
        with pytest.raises(GPUExecutionError, match=r"submit 1 \(timeline value 2\).*\(OutOfMemory\)"):
            s.wait()
        assert [f.spec() for f in dev.faults.fired] == ["1:OutOfMemory"]


SAXPY = """#include <metal_stdlib>
using namespace metal;
kernel void saxpy(device float* y, device float* x, constant int& n, constant int& a,
                  uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 32 + lid.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def _two_command_buffers() -> Any:
    """y += 3 * x, then y += 2 * x, each in its own command buffer (a profiled submit: one per command)."""
    from mtlir.frontend.nodes import buffer, buffer_variable, timeline_value
    from mtlir.frontend.queue import Queue
    from mtlir.ir.uop import UOp
    from mtlir.passes import lower
    k = Kernel("saxpy", "saxpy", SAXPY, (KernelParam(None, 0), KernelParam(None, 1), KernelParam("n", 2, "int32"),
                                         KernelParam("a", 3, "int32")))
    n = UOp.variable("n", 1, 256)
    y, x = buffer("y", 1024), buffer_variable("x")
    q = Queue(DeviceSpec("Apple7"))
    q.timestamp(0)
    q.exec(k, [y, x], [n, 3], grid=((n + 31) // 32,), threadgroup=(32,))
    q.exec(k, [y, x], [n, 2], grid=((n + 31) // 32,), threadgroup=(32,))
    q.timestamp(1)
    return lower(q.signal(q.timeline, timeline_value()).submit(), target="x86_64", keep_stages=False).program


@pytest.mark.parametrize("strict", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("failed, y_after, statuses", [
    (0, 2.0, {0: "Error (PageFault)", 1: "Completed"}),  # y += 2x ran after the failed y += 3x
    (1, 3.0, {0: "Completed", 1: "Error (PageFault)"}),
])
def test_the_error_says_whether_the_command_buffers_after_the_failed_one_ran(
        strict: bool, failed: int, y_after: float, statuses: dict[int, str]) -> None:
    program = _two_command_buffers()
    with _device(strict) as dev, Session(program, dev, timeout_s=WAIT_S) as s:
        x = s.linked.new_buffer("x", 1024, np.ones(256, np.float32).tobytes())
        dev.inject(f"{failed}:PageFault")
        s.submit(n=256, x=x)
        with pytest.raises(GPUExecutionError) as e:
            s.wait()
        assert e.value.command_buffer == failed and e.value.command_buffers == statuses
        if failed == 0:
            assert "after it: command buffer 1 Completed (ran)" in str(e.value)
        np.testing.assert_array_equal(np.frombuffer(s.read("buffer:y"), np.float32), np.full(256, y_after))
        s.submit(n=256, x=x)
        s.wait()
        np.testing.assert_array_equal(np.frombuffer(s.read("buffer:y"), np.float32), np.full(256, y_after + 5))


def test_inject_fault_keeps_counting_dispatches() -> None:
    """The older hook: N dispatches run, the next one fails its command buffer (any command buffer)."""
    with _device() as dev, _session(dev) as s:
        dev.inject_fault(MTL.ErrorInvalidResource, after_commands=1)
        s.submit(n=8)
        with pytest.raises(GPUExecutionError, match=r"\(InvalidResource\).*injected fault at ICB command"):
            s.wait()


# ---- a kernel that never finishes


@pytest.mark.parametrize("strict", MODES, ids=MODE_IDS)
def test_a_kernel_that_never_finishes_ends_by_the_gpu_watchdog(strict: bool) -> None:
    with _device(strict) as dev, _session(dev) as s:
        dev.inject("0:hang")
        s.submit(n=8)
        with pytest.raises(GPUExecutionError) as e:
            s.wait()  # the watchdog (0.3 s) ends it long before the wait's 30 s
        assert e.value.code == MTL.ErrorTimeout and e.value.name == "Timeout"
        assert "GPU watchdog: kernel 'add1' ran" in str(e.value) and "a kernel that never finishes" in str(e.value)
        s.submit(n=8)
        (done,) = s.wait()
        assert done.value == 2


def test_a_wait_shorter_than_the_watchdog_names_the_kernel_that_never_finishes() -> None:
    with _device(gpu_timeout_s=20.0) as dev, _session(dev) as s:
        dev.inject("0:hang")
        s.submit(n=8)
        with pytest.raises(WaitTimeoutError, match=r"timed out after 0\.2 s waiting for timeline value 1 .*kernel "
                                                   r"'add1' is still running \(ICB command \d of .*\), in command "
                                                   r"buffer 0 of submit 0"):
            s.wait(timeout_s=0.2)
        dev.close()  # stops the GPU: the hung kernel ends now, not after its 20 s
        assert not dev.kernel_running and dev.gpu.running is None
        cb = dev.object(s.inflight[0].cbs[0])
        assert cb.status == MTL.StatusError and cb.error.code == MTL.ErrorTimeout  # type: ignore[attr-defined]
        with pytest.raises(DeviceClosedError):
            s.wait()  # the device answers nothing more once closed


# ---- an allocation that returns nil


@pytest.mark.parametrize("strict", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("fault, named", [
    ("alloc:buffer", r"buffer:0 \(256 bytes\): Metal returned nil"),
    ("alloc:buffer:1", r"buffer:1 \(256 bytes\): Metal returned nil"),
    ("alloc:icb", r"^icb \(2 commands; the device is out of memory.*Metal returned nil"),
    ("alloc:pipeline", r"pipeline:add1: newComputePipelineStateWithDescriptor:options:reflection:error: returned "
                       r"nil: Insufficient memory .* function 'add1' .*\(NSError code 8\)"),
])
def test_a_nil_allocation_is_a_link_error_naming_the_object_with_nothing_left(fault: str, named: str,
                                                                              strict: bool) -> None:
    with _device(strict, faults=[fault]) as dev:
        blocks = _live_host_blocks(dev)
        with pytest.raises(LinkError, match=named):
            _session(dev)
        assert dev.live_objects() == {}  # link released everything it had made
        assert _live_host_blocks(dev) == blocks  # and freed its host tables and buffer contents
        assert [f.spec() for f in dev.faults.fired] == [Fault.parse(fault).spec()]
        with _session(dev) as s:  # the fault fired once: the device links and runs
            s.submit(n=8)
            s.wait()
