"""maxTotalThreadsPerThreadgroup of a simulated pipeline state is the compiled kernel's own limit (at most Metal's
1024): the MSL's ``[[max_total_threads_per_threadgroup(n)]]``, the OpenCL kernel's work-group limit, and for a kernel
with SIMD-group functions what its scratch leaves of the device's local memory. A dispatch between that limit and
1024 is refused as Metal refuses one above the pipeline's limit (rule 13: strict raises at the call naming the
pipeline, the threadgroup and the limit; faithful drops it), never as an OpenCL error from the kernel runner."""
from __future__ import annotations

from collections.abc import Iterator
import numpy as np
import pytest

from mtlir.errors import MetalValidationError
from mtlir.metal import MTL
from mtlir.runtime.sim.kernels.compiled import CompiledKernel, simd_thread_limit, threadgroup_limit
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.msl.translate import translate
from simscene import Scene

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
MSL = HEAD + """
kernel void fill(device float* out, uint3 lid [[thread_position_in_threadgroup]]) { out[lid.x] = 7.0f; }
[[max_total_threads_per_threadgroup(256)]]
kernel void capped(device float* out, uint3 lid [[thread_position_in_threadgroup]]) { out[lid.x] = 5.0f; }
kernel void lanes(device float* out, uint i [[thread_position_in_grid]]) { out[i] = simd_sum(1.0f); }
"""
NVIDIA_GROUP = 256  # CL_KERNEL_WORK_GROUP_SIZE NVIDIA's OpenCL gave some kernels on the H200 (docs/performance.md)


class NarrowRunner(KernelRunner):
    """PoCL, with every compiled kernel's OpenCL work-group limit at ``NVIDIA_GROUP`` threads, as NVIDIA's driver
    reports it for some kernels (PoCL gives every kernel 4096): what the pipeline must report, and what a dispatch
    above it must not reach."""

    def compile(self, msl: str, function: str) -> CompiledKernel:
        ck = super().compile(msl, function)
        ck.max_threads_per_threadgroup = NVIDIA_GROUP
        ck.max_total_threads = threadgroup_limit(NVIDIA_GROUP, ck.max_simd_threads, ck.info)
        return ck


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


@pytest.fixture(scope="module")
def narrow() -> KernelRunner:
    return NarrowRunner()


def make_scene(runner: KernelRunner, strict: bool) -> Scene:
    s = Scene(strict=strict, runner=runner, autorun=True)
    s.lib = s.send(s.device, "newLibraryWithSource:options:error:", s.m.string(MSL), 0, s.err)
    s.pipelines = {k: s.pipeline(k) for k in ("fill", "capped", "lanes")}
    return s


@pytest.fixture(params=[True, False], ids=["strict", "faithful"])
def scene(request: pytest.FixtureRequest, runner: KernelRunner) -> Iterator[Scene]:
    s = make_scene(runner, request.param)
    try:
        yield s
    finally:
        s.close()


def limit(s: Scene, kernel: str) -> int:
    return int(s.send(s.pipelines[kernel], "maxTotalThreadsPerThreadgroup"))


def dispatch(s: Scene, kernel: str, out: int, threads: int) -> int:
    """One command buffer with one direct dispatch of ``kernel`` on ``out`` ((1, 1, 1) threadgroups of ``threads``
    threads), committed and waited for; the command buffer (retained)."""
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "retain")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "setComputePipelineState:", s.pipelines[kernel])
    s.send(enc, "setBuffer:offset:atIndex:", out, 0, 0)
    s.send(enc, "useResources:count:usage:", s.resources(out), 1, MTL.ResourceUsageRead | MTL.ResourceUsageWrite)
    try:
        s.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (threads, 1, 1))
    finally:
        s.send(enc, "endEncoding")
    s.send(cb, "commit")
    s.send(cb, "waitUntilCompleted")
    return int(cb)


def test_limits_from_the_local_memory_and_the_kernel() -> None:
    assert simd_thread_limit(48 * 1024, 0) == 704  # NVIDIA's local memory: 22 SIMD groups of 68 * 32 bytes
    assert simd_thread_limit(48 * 1024, 16 * 1024) == 480  # less beside 16 KiB of threadgroup arrays
    assert simd_thread_limit(1 << 20, 0) == 15392 and simd_thread_limit(2000, 0) == 0
    infos = translate(MSL).kernels
    assert threadgroup_limit(4096, 15392, infos["fill"]) == 1024  # PoCL: Metal's own limit
    assert threadgroup_limit(NVIDIA_GROUP, 15392, infos["fill"]) == NVIDIA_GROUP
    assert threadgroup_limit(4096, 15392, infos["capped"]) == 256  # the MSL's attribute
    assert threadgroup_limit(4096, 704, infos["lanes"]) == 704  # the SIMD scratch
    assert threadgroup_limit(4096, 704, infos["fill"]) == 1024  # no SIMD-group functions: no scratch
    assert threadgroup_limit(4096, 0, infos["lanes"]) == 1  # Metal never reports 0


def test_pipelines_report_the_kernels_limit(scene: Scene, runner: KernelRunner) -> None:
    ck = runner.compile(MSL, "lanes")
    assert limit(scene, "fill") == min(1024, runner.compile(MSL, "fill").max_threads_per_threadgroup)
    assert limit(scene, "capped") == 256
    assert limit(scene, "lanes") == min(1024, ck.max_threads_per_threadgroup, ck.max_simd_threads)
    scene.dev.set_max_total_threads(scene.pipelines["capped"], 64)  # the test hook still lowers it
    assert limit(scene, "capped") == 64


def test_dispatch_above_the_kernel_attribute(scene: Scene) -> None:
    out = scene.buffer(4096)
    cb = dispatch(scene, "capped", out, 256)  # at the limit: runs
    assert scene.send(cb, "status") == MTL.StatusCompleted and (scene.floats(out)[:256] == 5).all()
    scene.floats(out)[:] = 0
    if scene.dev.strict:
        with pytest.raises(MetalValidationError, match=r"threadsPerThreadgroup:\(512, 1, 1\).*512 threads per "
                                                       r"threadgroup > maxTotalThreadsPerThreadgroup 256 of "
                                                       r"MTLComputePipelineState 0x[0-9a-f]+ 'capped'.*rule 13"):
            dispatch(scene, "capped", out, 512)
        return
    cb = dispatch(scene, "capped", out, 512)  # Metal drops it silently
    assert scene.send(cb, "status") == MTL.StatusCompleted and not scene.floats(out).any()


def test_simd_kernel_runs_up_to_its_pipelines_limit(scene: Scene, runner: KernelRunner) -> None:
    """A SIMD-group kernel's pipeline reports what its scratch allows on this OpenCL device (1024 on PoCL's 1 MiB of
    local memory, 704 on NVIDIA's 48 KiB) and runs a threadgroup of that size; where that is below 1024, one SIMD
    group more is refused as Metal refuses it, not by the runner."""
    top = limit(scene, "lanes")
    ck = runner.compile(MSL, "lanes")
    assert top == min(1024, ck.max_threads_per_threadgroup, ck.max_simd_threads) and top % 32 == 0
    out = scene.buffer(4096)
    cb = dispatch(scene, "lanes", out, top)
    assert scene.send(cb, "status") == MTL.StatusCompleted and (scene.floats(out)[:top] == 32).all()
    if top == 1024:
        return
    scene.floats(out)[:] = 0
    if scene.dev.strict:
        with pytest.raises(MetalValidationError, match=rf"maxTotalThreadsPerThreadgroup {top} of .*'lanes'"):
            dispatch(scene, "lanes", out, top + 32)
        return
    cb = dispatch(scene, "lanes", out, top + 32)
    assert scene.send(cb, "status") == MTL.StatusCompleted and not scene.floats(out).any()


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "faithful"])
def test_dispatch_above_the_opencl_limit_is_refused_as_metal_does(narrow: KernelRunner, strict: bool) -> None:
    """Below 1024 because of the OpenCL kernel: a threadgroup of 512 never reaches the runner (which would refuse it
    with 'more than the OpenCL device runs in one work-group', a GPU fault Internal)."""
    s = make_scene(narrow, strict)
    try:
        assert limit(s, "fill") == NVIDIA_GROUP and limit(s, "capped") == 256
        out = s.buffer(4096)
        cb = dispatch(s, "fill", out, NVIDIA_GROUP)
        assert s.send(cb, "status") == MTL.StatusCompleted and (s.floats(out)[:NVIDIA_GROUP] == 7).all()
        s.floats(out)[:] = 0
        run = s.dev.gpu.kernels_run
        if strict:
            with pytest.raises(MetalValidationError, match=rf"512 threads per threadgroup > maxTotalThreadsPer"
                                                           rf"Threadgroup {NVIDIA_GROUP} of .*'fill'.*rule 13"):
                dispatch(s, "fill", out, 512)
        else:
            cb = dispatch(s, "fill", out, 512)
            assert s.send(cb, "status") == MTL.StatusCompleted and s.send(cb, "error") == 0
            assert not s.floats(out).any()
        assert s.dev.gpu.kernels_run == run and s.dev.gpu.last_exception is None
    finally:
        s.close()


def test_icb_command_above_the_opencl_limit(narrow: KernelRunner) -> None:
    """The same through an ICB command: strict refuses its sizes at the setter."""
    s = make_scene(narrow, True)
    try:
        out = s.buffer(4096)
        icb = s.icb(1)
        with pytest.raises(MetalValidationError, match=rf"512 threads per threadgroup > maxTotalThreadsPerThreadgroup "
                                                       rf"{NVIDIA_GROUP} of .*'fill'"):
            s.command(icb, 0, "fill", [(out, 0)], tg=(512, 1, 1))
    finally:
        s.close()


def test_a_compiled_kernel_knows_its_limit(runner: KernelRunner) -> None:
    ck = runner.compile(MSL, "capped")
    assert ck.max_total_threads == min(256, ck.max_threads_per_threadgroup)
    data = np.zeros(4096, np.uint8)
    ck.run({0: (data, 0)}, (1, 1, 1), (256, 1, 1))
    assert (data.view(np.float32)[:256] == 5).all()
