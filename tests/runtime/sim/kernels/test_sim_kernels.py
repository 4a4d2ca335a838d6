"""End to end on the simulated device with real kernels (MSL translated to OpenCL C, run by PoCL): a hand-built ICB
submit as METAL.md §1 lays it out, and the runtime's link + Session replaying a lowered-shaped Program."""
from __future__ import annotations

import re

import numpy as np
import pytest

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL
from mtlir.errors import GPUExecutionError, KernelBuildError, MetalValidationError
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.kernels.runner import KernelRunner
from progbuild import submit_program
from simscene import Scene

MSL = """#include <metal_stdlib>
using namespace metal;
kernel void saxpy(device float* y, device float* x, constant int& n,
                  uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 32 + lid.x;
  if (i < n) y[i] = 2.0f * x[i] + y[i];
}
kernel void total(device float* out, device float* y, constant int& n, uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup float part[32];
  float acc = 0.0f;
  for (int i = lid.x; i < n; i += 32) acc += y[i];
  part[lid.x] = acc;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid.x == 0) {
    float s = 0.0f;
    for (int k = 0; k < 32; k++) s += part[k];
    out[0] = s;
  }
}
"""


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
@pytest.mark.parametrize("family", ["Apple7", "Apple9"])
def test_icb_submit_runs_real_kernels(runner: KernelRunner, target: str, family: str) -> None:
    s = Scene(target=target, family=family, runner=runner, autorun=True)
    try:
        m, n = s.m, 100
        lib = m.send(s.device, "newLibraryWithSource:options:error:", m.string(MSL), 0, s.err)
        assert lib != 0, s.dev.load(s.err, dtypes.id)
        s.lib = lib
        pipes = {k: s.pipeline(k) for k in ("saxpy", "total")}
        s.pipelines.update(pipes)
        y, x, out, var = s.buffer(4 * n), s.buffer(256 + 4 * n), s.buffer(16), s.buffer(256)
        rng = np.random.default_rng(0)
        y0, x0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        s.dev.write(s.contents(y), y0.tobytes())
        s.dev.write(s.contents(x) + 256, x0.tobytes())  # a view at byte offset 256
        s.set_int(var, 0, n)
        icb = s.icb(2, max_bind=3)
        s.command(icb, 0, "saxpy", [(y, 0), (x, 256), (var, 0)], grid=((n + 31) // 32, 1, 1), tg=(32, 1, 1))
        s.command(icb, 1, "total", [(out, 0), (y, 0), (var, 0)], grid=(1, 1, 1), tg=(32, 1, 1))
        s.residency(y, x, out, var)
        warmup = ("saxpy", "total") if family == "Apple7" else ()
        cb = s.send(s.queue, "commandBuffer")
        s.send(cb, "retain")
        s.encode_icb(cb, icb, 0, 2, warmup=warmup, fence=True)
        s.send(cb, "encodeSignalEvent:value:", s.event, 1)
        s.send(cb, "commit")
        assert s.send(s.event, "waitUntilSignaledValue:timeoutMS:", 1, 5000) is True
        s.send(cb, "waitUntilCompleted")  # the signal can be seen a moment before the status turns Completed
        assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
        want = 2 * x0 + y0
        np.testing.assert_allclose(s.floats(y)[:n], want, rtol=1e-6)
        np.testing.assert_allclose(s.floats(out)[0], want.sum(), rtol=1e-4, atol=1e-5)
        assert 0 < s.send(cb, "GPUStartTime") <= s.send(cb, "GPUEndTime")
    finally:
        s.close()


def _reference(sizes: list[int], kernels: int, nfloats: int) -> tuple[np.ndarray, np.ndarray]:
    bufs = [np.zeros(nfloats, np.float32), np.zeros(nfloats, np.float32)]
    for n in sizes:
        for i in range(kernels):
            out, inp = bufs[i % 2], bufs[(i + 1) % 2]
            out[:n] = inp[:n] + 1
    return bufs[0], bufs[1]


@pytest.mark.parametrize("target,residency_set", [("arm64", True), ("x86_64", False)])
def test_session_replays_on_the_simulated_device(runner: KernelRunner, target: str, residency_set: bool) -> None:
    program = submit_program(target, residency_set=residency_set, kernels=3)
    dev = SimDevice(target, family="Apple7", residency_sets=residency_set, kernel_runner=runner)
    sizes = [1, 17, 64, 5]
    try:
        with Session(program, dev, timeout_s=10.0) as s:
            for n in sizes:
                s.submit(n=n)
            s.wait(timeout_s=10.0)
            got0 = np.frombuffer(s.read("buffer:0"), np.float32)
            got1 = np.frombuffer(s.read("buffer:1"), np.float32)
            assert s.timeline_value() == len(sizes)
        want0, want1 = _reference(sizes, 3, 64)
        np.testing.assert_array_equal(got0, want0)
        np.testing.assert_array_equal(got1, want1)
        assert dev.live_objects().get("MTLCommandBuffer", 0) == 0  # the session released what it retained
    finally:
        dev.close()


def test_strict_device_catches_a_patch_while_in_flight(runner: KernelRunner) -> None:
    program = submit_program("x86_64", kernels=2)
    dev = SimDevice("x86_64", family="Apple7", kernel_runner=runner, autorun=False)
    try:
        s = Session(program, dev, timeout_s=5.0, serialize=False)
        s.submit(n=4)
        with pytest.raises(MetalValidationError, match=r"the CPU writes 4 bytes at offset 0 of MTLBuffer .* while "
                                                       r"MTLCommandBuffer .* reads it.*rule 15"):
            s.submit(n=5)  # patches the variables buffer while the first submit is in flight
        dev.run_until_idle()
        s.close()
    finally:
        dev.close()


def test_session_reports_a_gpu_fault_from_the_device(runner: KernelRunner) -> None:
    program = submit_program("arm64", kernels=2)
    dev = SimDevice("arm64", family="Apple7", kernel_runner=runner)
    try:
        s = Session(program, dev, timeout_s=5.0)
        s.submit(n=8)
        s.wait(timeout_s=5.0)
        dev.inject_fault(MTL.ErrorPageFault, after_commands=1)
        s.submit(n=8)
        with pytest.raises(GPUExecutionError) as e:
            s.wait(timeout_s=5.0)
        assert e.value.code == MTL.ErrorPageFault and e.value.name == "PageFault"
        assert "submit 1 (timeline value 2)" in str(e.value) and "injected fault at ICB command 1" in str(e.value)
        s.close()
    finally:
        dev.close()


def test_invalid_msl_is_reported_as_metal_does_at_its_msl_line(runner: KernelRunner) -> None:
    """MSL the translator passes but OpenCL does not build, at a place that maps back to the MSL (an undeclared
    identifier): invalid MSL, so newLibraryWithSource:options:error: answers nil with an NSError naming the MSL line
    and column, as Metal does (it raised KernelBuildError, exit 4, naming a line of the translation: issue 9)."""
    s = Scene(target="x86_64", runner=runner)
    try:
        m = s.m
        bad = "#include <metal_stdlib>\nusing namespace metal;\nkernel void k(device float* x) { x[0] = nope_1; }"
        lib = m.send(s.device, "newLibraryWithSource:options:error:", m.string(bad), 0, s.err)
        assert lib == 0
        err = s.dev.load(s.err, dtypes.id)
        text = s.dev.read_cstring(m.send(m.send(err, "localizedDescription"), "UTF8String"))
        assert text.startswith("Compilation failed: invalid MSL in kernel(s) k: MSL line 3, column 41: use of "
                               "undeclared identifier 'nope_1'"), text
        assert text.endswith("    3 | kernel void k(device float* x) { x[0] = nope_1; }\n"
                             "      | " + " " * 40 + "^")
    finally:
        s.close()


def test_a_strict_error_mid_submit_is_not_replaced_by_the_cleanup_error(runner: KernelRunner) -> None:
    """A Program lowered for Apple9 (no warm-up) on an Apple7 device: rule 16 at executeCommandsInBuffer: is the
    error; the pool pop that then deallocates the encoder left open (rule 2) is only a note on it."""
    program = submit_program("x86_64", kernels=2, family="Apple9")
    dev = SimDevice("x86_64", family="Apple7", kernel_runner=runner)
    try:
        s = Session(program, dev, timeout_s=5.0)
        with pytest.raises(MetalValidationError) as e:
            s.submit(n=8)
        assert "rule 16" in str(e.value) and "executeCommandsInBuffer" in str(e.value)
        notes = " ".join(getattr(e.value, "__notes__", []))
        assert "Command encoder released without endEncoding" in notes and "rule 2" in notes
        assert dev.live_objects().get("MTLCommandBuffer", 0) == 0  # the uncommitted command buffer was released
        s.close()
    finally:
        dev.close()


def test_direct_path_threadgroup_set_per_submit_is_checked_by_the_strict_device(runner: KernelRunner) -> None:
    from progbuild import direct_program
    program = direct_program("x86_64", threadgroup=None)
    dev = SimDevice("x86_64", family="Apple7", residency_sets=False, icb=False, kernel_runner=runner)
    try:
        s = Session(program, dev, timeout_s=5.0)
        s.submit(n=8, tg=4)
        s.wait(timeout_s=5.0)
        assert np.frombuffer(s.read("buffer:0"), np.float32)[:10].tolist() == [1.0] * 8 + [0.0] * 2
        dev.set_max_total_threads(s.linked.handles["pipeline:add1"], 64)
        with pytest.raises(MetalValidationError, match=r"128 threads per threadgroup > maxTotalThreadsPerThreadgroup "
                                                       r"64.*rule 13"):
            s.submit(n=8, tg=128)
        s.close()
        assert dev.live_objects().get("MTLCommandBuffer", 0) == 0
    finally:
        dev.close()


# --- a kernel that reaches past its buffer: never a crash of the process; a PageFault (faithful) or a validation
# error naming the kernel, the parameter and the element (strict) ---

def test_out_of_bounds_write_faults_the_command_buffer_in_faithful_mode(runner: KernelRunner) -> None:
    from progbuild import OVERRUN_MSL
    program = submit_program("x86_64", kernels=1, msl=OVERRUN_MSL)
    dev = SimDevice("x86_64", family="Apple7", strict=False, kernel_runner=runner)
    try:
        with Session(program, dev, timeout_s=5.0) as s:
            s.submit(n=40)  # out[i + 40] for i < 40: elements 64..79 of a 64-float buffer
            with pytest.raises(GPUExecutionError) as e:
                s.wait(timeout_s=5.0)
            assert e.value.code == MTL.ErrorPageFault and e.value.name == "PageFault"
            # the element of whichever thread's fault the record kept: one of 64..79 (PoCL runs the threads in
            # order and keeps 64; a GPU runs them at once and the first to fault wins the record)
            got = re.search(r"kernel 'add1' wrote 4 bytes out of bounds through parameter 'out' \(buffer index 0\) "
                            r"at element (\d+)\b", str(e.value))
            assert got is not None and 64 <= int(got[1]) <= 79, str(e.value)
            s.submit(n=8)  # in bounds: the device and the session go on
            s.wait(timeout_s=5.0)
            assert np.frombuffer(s.read("buffer:0"), np.float32)[8:16].tolist() == [1.0] * 8
        assert dev.live_objects() == {}
    finally:
        dev.close()


def test_out_of_bounds_write_is_a_validation_error_in_strict_mode(runner: KernelRunner) -> None:
    from progbuild import OVERRUN_MSL
    program = submit_program("arm64", kernels=1, msl=OVERRUN_MSL)
    dev = SimDevice("arm64", family="Apple7", kernel_runner=runner)
    try:
        with Session(program, dev, timeout_s=5.0) as s:
            s.submit(n=40)
            with pytest.raises(MetalValidationError, match=r"ICB command 0 .*kernel 'add1' wrote 4 bytes out of bounds "
                                                           r"through parameter 'out' \(buffer index 0\) at element "
                                                           r"(6[4-9]|7[0-9]) ") as e:  # the faulting thread's, 64..79
                s.wait(timeout_s=5.0)  # raised at the next message to the device after the GPU saw it
            # and the command buffer itself ended in status Error, PageFault: its submit is released with the error,
            # which is reported once (no GPUExecutionError from the next wait)
            assert any("PageFault" in note for note in e.value.__notes__)
            assert s.wait(timeout_s=5.0) == []
            s.submit(n=8)
            s.wait(timeout_s=5.0)
        assert dev.live_objects() == {}
    finally:
        dev.close()


def test_a_failed_submit_leaves_the_device_and_the_session_usable(runner: KernelRunner) -> None:
    """The newcomer's sequence: a timeline value below the last one is refused at encodeSignalEvent:value: (rule 12,
    strict) after the encoder waited on and updated the fence; the command buffer is released uncommitted, so the
    next submit must not wait for that update (it used to fail after 2 s: the GPU watchdog, rule 11)."""
    program = submit_program("x86_64", kernels=2)
    dev = SimDevice("x86_64", family="Apple7", kernel_runner=runner)
    try:
        s = Session(program, dev, initial={"buffer:1": bytes(256)}, timeout_s=5.0)
        s.submit(n=5, timeline=5)
        s.wait()
        with pytest.raises(MetalValidationError, match=r"3 is below 5.*rule 12"):
            s.submit(n=5, timeline=3)
        s.submit(n=5)  # timeline 6
        s.wait(timeout_s=5)
        assert s.timeline_value() == 6
        s.close()
        assert dev.live_objects() == {}
    finally:
        dev.close()
