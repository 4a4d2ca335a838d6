"""Execution on the simulated GPU: committed work runs asynchronously and in order (step hook and worker thread),
GPU times, shared-event signals and waits with timeouts, cross-queue ordering, the direct path, fault injection."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from mtlir.metal import MTL
from simscene import Scene


@pytest.fixture
def s() -> Iterator[Scene]:
    scene = Scene()
    yield scene
    scene.close()


def fill_setup(s: Scene, values: tuple[int, ...]) -> tuple[int, list[int], int]:
    """An ICB with one fill command per value, each into its own 16-byte slice of one output buffer."""
    out = s.buffer(256)
    icb = s.icb(len(values))
    vars_ = []
    for i, v in enumerate(values):
        var = s.buffer(256)
        s.set_int(var, 0, v)
        vars_.append(var)
        s.command(icb, i, "fill", [(out, 16 * i), (var, 0)])
    s.residency(out, *vars_)
    return icb, vars_, out


def test_work_is_in_flight_until_stepped(s: Scene) -> None:
    icb, _, out = fill_setup(s, (1, 2))
    a = s.submit_icb(icb, 0, 1, signal=1)
    b = s.submit_icb(icb, 1, 1, signal=2)
    assert s.status(a) == s.status(b) == MTL.StatusCommitted
    assert not s.floats(out).any() and s.send(s.event, "signaledValue") == 0
    seen = []
    while s.dev.step():
        seen.append((s.status(a), s.status(b)))
    # in order: b is not scheduled before a completed
    assert all(sb <= MTL.StatusCommitted for sa, sb in seen if sa < MTL.StatusCompleted)
    assert seen[-1] == (MTL.StatusCompleted, MTL.StatusCompleted)
    assert s.send(a, "GPUEndTime") <= s.send(b, "GPUStartTime")
    assert s.send(s.event, "signaledValue") == 2
    assert list(s.floats(out)[:8]) == [1, 1, 1, 1, 2, 2, 2, 2]


def test_run_until_idle_times_out_on_a_held_wait() -> None:
    s = Scene(gpu_timeout_s=5.0)
    try:
        cb = s.send(s.queue, "commandBuffer")
        s.send(cb, "encodeWaitForEvent:value:", s.event, 1)  # nothing will ever signal it
        s.send(cb, "commit")
        with pytest.raises(TimeoutError, match=r"run_until_idle: command buffers still running after 0.05 s"):
            s.dev.run_until_idle(0.05)
        assert s.status(cb) == MTL.StatusScheduled
        with pytest.raises(TimeoutError, match=r"waitUntilCompleted .* still Scheduled .* autorun=False"):
            s.dev.timeout_s = 0.05
            s.send(cb, "waitUntilCompleted")
    finally:
        s.close()


def test_worker_thread_runs_committed_work() -> None:
    s = Scene(autorun=True)
    try:
        icb, _, out = fill_setup(s, (3,))
        cbs = [s.submit_icb(icb, 0, 1, signal=v) for v in range(1, 6)]
        assert s.send(s.event, "waitUntilSignaledValue:timeoutMS:", 5, 2000) is True
        for cb in cbs:
            s.send(cb, "waitUntilCompleted")
            assert s.status(cb) == MTL.StatusCompleted
        times = [(s.send(cb, "GPUStartTime"), s.send(cb, "GPUEndTime")) for cb in cbs]
        assert all(0 < t0 <= t1 for t0, t1 in times)
        assert all(times[i][1] <= times[i + 1][0] for i in range(len(times) - 1))  # one after another
        assert (s.floats(out)[:4] == 3).all()
    finally:
        s.close()
    assert s.dev.gpu.thread is None or not s.dev.gpu.thread.is_alive()


def test_wait_until_signaled_times_out() -> None:
    s = Scene(autorun=True)
    try:
        t0 = time.perf_counter()
        assert s.send(s.event, "waitUntilSignaledValue:timeoutMS:", 1, 40) is False
        assert time.perf_counter() - t0 >= 0.04
        s.dev.timeout_s = 0.05
        with pytest.raises(TimeoutError, match=r"not signaled after 0.05 s, the simulated device's longest wait"):
            s.send(s.event, "waitUntilSignaledValue:timeoutMS:", 1, 2**63)
    finally:
        s.close()


def test_a_waiter_on_another_thread_wakes_when_the_value_arrives() -> None:
    s = Scene(autorun=True)
    try:
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(s.send(s.event, "waitUntilSignaledValue:timeoutMS:",
                                                                   3, 2000)))
        waiter.start()
        cb = s.send(s.queue, "commandBuffer")
        s.send(cb, "encodeSignalEvent:value:", s.event, 3)
        s.send(cb, "commit")
        waiter.join(5)
        assert got == [True]
    finally:
        s.close()


def test_event_wait_orders_queues(s: Scene) -> None:
    other = s.send(s.device, "newCommandQueueWithMaxCommandBufferCount:", 4)
    icb, _, out = fill_setup(s, (4,))
    waiter = s.send(s.queue, "commandBuffer")
    s.send(waiter, "encodeWaitForEvent:value:", s.event, 7)
    s.encode_icb(waiter, icb, 0, 1)
    s.send(waiter, "commit")
    for _ in range(4):
        s.dev.step()
    assert s.status(waiter) == MTL.StatusScheduled and not s.floats(out).any()
    signaller = s.send(other, "commandBuffer")
    s.send(signaller, "encodeSignalEvent:value:", s.event, 7)
    s.send(signaller, "commit")
    s.dev.run_until_idle()
    assert s.status(waiter) == MTL.StatusCompleted and (s.floats(out)[:4] == 4).all()


def test_event_wait_that_never_ends_hits_the_watchdog(s: Scene) -> None:
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "encodeWaitForEvent:value:", s.event, 1)
    s.send(cb, "commit")
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorTimeout
    assert "GPU watchdog" in s.error_text(cb) and "rule 12" in s.error_text(cb)


@pytest.mark.parametrize("target", ["x86_64", "arm64"])
def test_direct_path_dispatch(target: str) -> None:
    s = Scene(target=target)
    try:
        out = s.buffer(64)
        value = s.dev.malloc(4)
        s.dev.write(value, (5).to_bytes(4, "little"))
        cb = s.send(s.queue, "commandBuffer")
        enc = s.send(cb, "computeCommandEncoder")
        s.send(enc, "setComputePipelineState:", s.pipelines["fill"])
        s.send(enc, "setBuffer:offset:atIndex:", out, 16, 0)
        s.send(enc, "setBytes:length:atIndex:", value, 4, 1)
        s.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (2, 1, 1), (2, 1, 1))
        s.dev.write(value, (9).to_bytes(4, "little"))  # setBytes copied at the call
        s.send(enc, "setComputePipelineState:", s.pipelines["add1"])
        s.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (8, 1, 1))
        s.send(enc, "endEncoding")
        s.send(cb, "commit")
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted
        assert list(s.floats(out)[:8]) == [0, 0, 0, 0, 6, 6, 6, 6]  # buffer bound from byte 16; add1 from 16 too
    finally:
        s.close()


def test_inject_fault_after_n_commands(s: Scene) -> None:
    icb, _, out = fill_setup(s, (1, 2, 3))
    s.dev.inject_fault(MTL.ErrorOutOfMemory, after_commands=4)
    ok = s.submit_icb(icb, 0, 3, signal=1)
    bad = s.submit_icb(icb, 0, 3, signal=2)
    after = s.submit_icb(icb, 0, 3, signal=3)
    s.dev.run_until_idle()
    assert s.status(ok) == MTL.StatusCompleted
    assert s.status(bad) == MTL.StatusError and s.error_code(bad) == MTL.ErrorOutOfMemory
    assert "injected fault at ICB command 1" in s.error_text(bad)  # the 5th command: command 1 of the second run
    assert s.status(after) == MTL.StatusCompleted  # one shot; later work runs
    assert s.send(s.event, "signaledValue") == 3
    with pytest.raises(ValueError, match=r"not an MTLCommandBufferError code"):
        s.dev.inject_fault(6)


def test_kernel_exception_fails_the_command_buffer_not_the_device(s: Scene) -> None:
    icb, _, out = fill_setup(s, (1,))
    s.dev.object(s.pipelines["fill"]).kernel.fn = lambda *a: 1 / 0  # type: ignore[attr-defined]
    cb = s.submit_icb(icb, 0, 1)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusError and s.error_code(cb) == 1
    assert "ZeroDivisionError" in s.error_text(cb)
    assert isinstance(s.dev.gpu.last_exception, ZeroDivisionError)


def test_a_kernel_runner_that_cannot_bring_results_back_fails_the_command_buffer_not_the_gpu(s: Scene) -> None:
    """The runner's sync failing at a command buffer's end (OpenCL's context lost after a device fault, as on
    NVIDIA: CL_INVALID_COMMAND_QUEUE) ends that command buffer in Error, Internal, naming the error; the GPU goes on
    and runs the next one (the runner healthy again)."""
    icb, _, out = fill_setup(s, (1,))
    runner = s.dev._runner
    healthy = runner.sync

    def lost() -> None:
        raise RuntimeError("OpenCL could not copy the kernels' results back to the host: clFinish failed: "
                           "INVALID_COMMAND_QUEUE")

    runner.sync = lost
    cb = s.submit_icb(icb, 0, 1)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorInternal
    assert "could not be brought back to the host" in s.error_text(cb) and "INVALID_COMMAND_QUEUE" in s.error_text(cb)
    runner.sync = healthy
    cb = s.submit_icb(icb, 0, 1)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted


def test_encoders_and_signals_run_in_encoding_order(s: Scene) -> None:
    icb, _, out = fill_setup(s, (1, 2))
    cb = s.send(s.queue, "commandBuffer")
    s.encode_icb(cb, icb, 0, 1)
    s.send(cb, "encodeSignalEvent:value:", s.event, 1)
    s.encode_icb(cb, icb, 1, 1)
    s.send(cb, "encodeSignalEvent:value:", s.event, 2)
    s.send(cb, "commit")
    values = []
    while s.dev.step():
        values.append((s.send(s.event, "signaledValue"), int(s.floats(out)[4])))
    assert (1, 0) in values and values[-1] == (2, 2)


def test_strict_race_check_costs_nothing_with_barriers(s: Scene) -> None:
    icb, _, out = fill_setup(s, (1, 2, 3, 4))
    runs_before = sum(len(k.runs) for k in s.dev.kernel_runner.kernels.values())
    cb = s.submit_icb(icb, 0, 4)
    s.dev.run_until_idle()
    runs = sum(len(k.runs) for k in s.dev.kernel_runner.kernels.values()) - runs_before
    assert s.status(cb) == MTL.StatusCompleted and runs == 4  # no dry runs: every command has a barrier
    assert np.array_equal(s.floats(out)[:16], np.repeat([1, 2, 3, 4], 4))


def test_a_kernel_that_does_not_end_delays_neither_the_error_nor_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a wait timed out, leaving the Session does not wait again, and SimDevice.close() does not wait for the
    kernel still running (OpenCL cannot stop one): `mtlir run --timeout 3` on an endless kernel ended at 11.6 s."""
    from progbuild import submit_program

    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    from mtlir.runtime.sim.kernels.pyrunner import PyKernel, PyKernelArg, PyKernelRunner

    release = threading.Event()
    params = (PyKernelArg("out", "buffer", 0), PyKernelArg("inp", "buffer", 1),
              PyKernelArg("n", "constant", 2, "int32"))
    runner = PyKernelRunner([PyKernel("add1", params, lambda a, g, t: release.wait(60))])
    dev = SimDevice("x86_64", family="Apple7", kernel_runner=runner)
    waits: list[float | None] = []
    real = Session._wait
    monkeypatch.setattr(Session, "_wait", lambda self, v, t: (waits.append(t), real(self, v, t))[1])
    try:
        with pytest.raises(TimeoutError):
            with Session(submit_program("x86_64"), dev, timeout_s=5.0) as s:
                s.submit(n=4)
                s.wait(timeout_s=0.05)
        assert waits == [0.05, 0.0]  # the exit polled once instead of waiting again
        dev.close()
        assert dev.kernel_running  # close returned while the kernel runs
    finally:
        release.set()
    deadline = time.monotonic() + 30
    while dev.kernel_running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not dev.kernel_running


def test_a_host_blocked_in_a_wait_goes_on_when_another_thread_closes_the_device() -> None:
    """A thread waiting for a command buffer without running the GPU's steps itself (a wait shorter than the kernel
    watchdog) is woken by close() on another thread and gets DeviceClosedError at once, not after its timeout."""
    from progbuild import submit_program

    from mtlir.errors import DeviceClosedError
    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    from mtlir.runtime.sim.kernels.pyrunner import PyKernel, PyKernelArg, PyKernelRunner

    release = threading.Event()
    params = (PyKernelArg("out", "buffer", 0), PyKernelArg("inp", "buffer", 1),
              PyKernelArg("n", "constant", 2, "int32"))
    runner = PyKernelRunner([PyKernel("add1", params, lambda a, g, t: release.wait(30))])
    dev = SimDevice("x86_64", family="Apple7", kernel_runner=runner, kernel_timeout_s=60.0)
    s = Session(submit_program("x86_64"), dev, timeout_s=20.0)
    got: list[BaseException] = []
    waited: list[float] = []

    def wait() -> None:
        t0 = time.monotonic()
        try:
            s.wait()
        except BaseException as e:
            got.append(e)
        waited.append(time.monotonic() - t0)

    try:
        s.submit(n=4)
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.2)  # blocked on the command buffer's end (the kernel holds it)
        dev.close()
        waiter.join(10)
        assert not waiter.is_alive() and waited and waited[0] < 5.0
        assert got and isinstance(got[0], DeviceClosedError)
    finally:
        release.set()
