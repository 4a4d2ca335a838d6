"""One kernel built for the runner's device (``kernels``): ``CompiledKernel`` checks a run's bindings and sizes before
the runner launches it (``views`` says how each parameter is bound: a ``View``), and refuses sizes OpenCL would not
survive (``MAX_GLOBAL_PER_AXIS``, ``MAX_GLOBAL_THREADS``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mtlir.metal import MTL
from mtlir.runtime.sim.msl.simd import SIMD_WIDTH, scratch_bytes
from mtlir.runtime.sim.msl.kernel import KernelArg, KernelInfo

if TYPE_CHECKING:
    from mtlir.runtime.sim.kernels.launch import Launch
    from mtlir.runtime.sim.kernels.runner import KernelRunner

__all__ = ["CompiledKernel", "View", "threadgroup_limit", "simd_thread_limit", "DEFAULT_TIMEOUT_S",
           "MAX_GLOBAL_PER_AXIS", "MAX_GLOBAL_THREADS"]

DEFAULT_TIMEOUT_S = 120.0  # a kernel still running after this long is reported, never waited for forever
# Global sizes the runner refuses before OpenCL sees them (PoCL aborts the whole process on a global size that
# overflows its work-group arithmetic): Metal's own 2**32 threads per axis (thread positions are 32-bit uints),
# and 2**40 threads in all, far more than a CPU runs before any timeout.
MAX_GLOBAL_PER_AXIS = 1 << 32
MAX_GLOBAL_THREADS = 1 << 40


def simd_thread_limit(local_mem_size: int, arrays_bytes: int) -> int:
    """The most threads per threadgroup (a multiple of 32) whose SIMD-group scratch (68 bytes per thread,
    ``msl.simd.scratch_bytes``) fits in ``local_mem_size`` bytes of OpenCL local memory beside ``arrays_bytes`` bytes
    of the kernel's own threadgroup arrays: 704 on NVIDIA's 48 KiB, 15,392 on PoCL's 1 MiB; 0 when not even one
    SIMD group fits."""
    return max(0, (local_mem_size - arrays_bytes) // scratch_bytes(SIMD_WIDTH)) * SIMD_WIDTH


def threadgroup_limit(work_group_size: int, simd_threads: int, info: KernelInfo) -> int:
    """The most threads per threadgroup a kernel runs, in threads: what its pipeline state reports as
    maxTotalThreadsPerThreadgroup (``methods.resources``; Apple's MTLComputePipelineState documentation: "the maximum
    total number of threads per threadgroup for this pipeline state", below the device's 1024 when the kernel needs
    it). The least of Metal's 1024 (``MTL.MAX_THREADS_PER_THREADGROUP``), the kernel's own
    ``[[max_total_threads_per_threadgroup(n)]]`` (``info``), the OpenCL kernel's ``work_group_size``
    (CL_KERNEL_WORK_GROUP_SIZE capped at the device's: 4096 on PoCL, 256 on the H200's NVIDIA driver) and,
    for a kernel with SIMD-group functions (``info.simd``), ``simd_threads``: the most threads whose scratch fits in
    the device's local memory beside the kernel's own threadgroup arrays (704 on NVIDIA's 48 KiB for a kernel
    without arrays). At least 1: a kernel that cannot run one thread still reports 1 (Metal never reports 0), and
    its dispatches fail as the runner refuses them."""
    limit = min(MTL.MAX_THREADS_PER_THREADGROUP, work_group_size)
    if info.max_total_threads_per_threadgroup is not None:
        limit = min(limit, info.max_total_threads_per_threadgroup)
    if info.simd:
        limit = min(limit, simd_threads)
    return max(1, limit)


@dataclass(frozen=True)
class View:
    """How ``run`` binds one parameter: ``how`` is ``"buffer"`` (offset 0: the whole buffer) or ``"offset"`` (the
    whole buffer, the byte ``offset`` passed to the kernel; never an OpenCL sub-buffer, ``kernels.runner`` says
    why); ``offset`` is the byte offset of the view in its storage."""

    arg: KernelArg
    how: str
    offset: int


class CompiledKernel:
    """One kernel function built for the runner's OpenCL device.

    ``function``: the MSL kernel name; ``params``: its Metal-bound parameters in MSL order (``KernelArg``:
    name, kind ``buffer`` | ``constant``, Metal buffer index, dtype); ``opencl_source``: the translated source of
    the whole library; ``info``: what the translator learnt of it (``msl.kernel.KernelInfo``);
    ``max_threads_per_threadgroup``: the OpenCL work-group limit of this kernel on its device, in threads;
    ``max_total_threads``: the most threads per threadgroup it runs as a Metal pipeline (``threadgroup_limit``:
    what its pipeline state reports as maxTotalThreadsPerThreadgroup)."""

    def __init__(self, runner: KernelRunner, kernel: Any, info: KernelInfo, source: str, program: Any = None) -> None:
        self.function: str = info.function
        self.params: tuple[KernelArg, ...] = info.args
        self.opencl_source: str = source
        self.info = info
        self._runner = runner
        self._kernel = kernel
        self._program = program  # the OpenCL program: a kept launch makes its own kernel object from it
        dev = runner.device  # the device's limits, asked once (each is a clGetDeviceInfo call)
        self._per_axis: tuple[int, ...] = tuple(dev.max_work_item_sizes)[:3]
        self._local_mem_size: int = int(dev.local_mem_size)
        self._device_label: str = str(dev.name)
        wg = kernel.get_work_group_info(runner.cl.kernel_work_group_info.WORK_GROUP_SIZE, runner.device)
        self.max_threads_per_threadgroup: int = min(int(wg), runner.device.max_work_group_size)
        # the kernel's own threadgroup arrays, and (with SIMD-group functions) the most threads whose scratch fits
        self.local_mem_bytes: int = int(kernel.get_work_group_info(runner.cl.kernel_work_group_info.LOCAL_MEM_SIZE,
                                                                   runner.device))
        self.max_simd_threads: int = simd_thread_limit(self._local_mem_size, self.local_mem_bytes)
        self.max_total_threads: int = threadgroup_limit(self.max_threads_per_threadgroup, self.max_simd_threads,
                                                        info)

    def __repr__(self) -> str:
        return f"CompiledKernel({self.function!r}, params={[a.name for a in self.params]})"

    def views(self, bindings: dict[int, tuple[np.ndarray, int]]) -> tuple[View, ...]:
        """Check ``bindings`` against the parameters and say how each parameter will be bound (``View``).

        Raises ``ValueError`` naming the kernel, parameter and buffer index for a missing binding, a storage that
        is not a 1-D C-contiguous ``numpy.uint8`` array (or is read-only where the kernel writes), an offset
        outside the storage, or an offset that is not a multiple of the element size (Metal requires it,
        METAL.md §1)."""
        views = []
        for b in self.info.bindings:
            arg = b.arg
            where = f"kernel {self.function!r}, parameter {arg.name!r} (buffer index {arg.index})"
            if arg.index not in bindings:
                raise ValueError(f"{where}: no binding for buffer index {arg.index}")
            storage, offset = bindings[arg.index]
            _check_storage(storage, where, writable=b.writable)
            if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
                raise ValueError(f"{where}: the offset must be an int (bytes), got {offset!r}")
            offset = int(offset)
            if not 0 <= offset < storage.nbytes or offset + b.nbytes > storage.nbytes:
                raise ValueError(f"{where}: offset {offset} (+{b.nbytes} bytes read) is outside the "
                                 f"{storage.nbytes}-byte buffer")
            if offset % b.align:
                raise ValueError(f"{where}: offset {offset} is not a multiple of the element size {b.align} bytes")
            how = "buffer" if offset == 0 else "offset"
            views.append(View(arg, how, offset))
        return tuple(views)

    def run(self, bindings: dict[int, tuple[np.ndarray, int]], grid: tuple[int, int, int],
            threadgroup: tuple[int, int, int], *, timeout_s: float = DEFAULT_TIMEOUT_S, keep: bool = False) -> None:
        """Run ``grid`` threadgroups (per axis) of ``threadgroup`` threads each, synchronously.

        ``bindings`` maps each Metal buffer index to ``(storage, byte offset)``: ``storage`` is the whole
        MTLBuffer's host memory as a 1-D ``numpy.uint8`` array; a ``constant T&`` variable is the value at that
        offset. Views of one storage alias as they do in Metal. Results are in the arrays when ``run`` returns;
        with ``keep`` they stay in the device's copies of the buffers until the runner's ``sync()`` (the simulated
        GPU syncs where the host may look: a signal, a wait, a command buffer's start and end).
        A grid or threadgroup with a zero axis runs nothing (Metal accepts such a dispatch, METAL.md §3 rule 13).

        Raises ``ValueError`` for bad bindings (``views``) or sizes, for a threadgroup larger than the OpenCL
        device runs (``max_threads_per_threadgroup``: 4096 on PoCL here, above Metal's 1024), for a kernel with
        SIMD-group functions whose threadgroup needs more local memory than the device has (68 bytes of scratch
        per thread, ``msl.simd.scratch_bytes``: 1024 threads need 68 KiB, NVIDIA's OpenCL has 48 KiB), for a global
        size of 2**32 threads or more on an axis or more than 2**40 in all (``MAX_GLOBAL_PER_AXIS``,
        ``MAX_GLOBAL_THREADS``: a wrapped size would otherwise abort the process inside PoCL); ``TimeoutError``
        when the kernel has not finished after ``timeout_s`` seconds (the runner then refuses further work,
        since OpenCL cannot stop a running kernel); ``RuntimeError`` when OpenCL refuses to run it."""
        launch = self.prepare(bindings, grid, threadgroup)
        if launch is None:
            return
        fault = self._runner.run_batch([launch], timeout_s, keep)
        if fault is not None:
            raise fault[1]

    def prepare(self, bindings: dict[int, tuple[np.ndarray, int]], grid: tuple[int, int, int],
                threadgroup: tuple[int, int, int], *, keep: bool = False, reuse: Launch | None = None) -> Launch | None:
        """Check a dispatch as ``run`` does and prepare it for the runner's ``run_batch`` (``launch.Launch``); None
        for a grid or threadgroup with a zero axis (nothing runs). ``keep``: the launch will be run again (its own
        OpenCL kernel object, arguments set once; ``reuse``: a kept launch of this kernel that this one replaces,
        whose kernel object it takes over). Raises what ``run`` raises before it launches."""
        views = self.views(bindings)
        grid, threadgroup = _size3(grid, "grid"), _size3(threadgroup, "threadgroup")
        if 0 in grid or 0 in threadgroup:
            return None
        threads = threadgroup[0] * threadgroup[1] * threadgroup[2]
        per_axis, local_mem, label = self._per_axis, self._local_mem_size, self._device_label
        if threads > self.max_threads_per_threadgroup or any(t > m for t, m in zip(threadgroup, per_axis)):
            raise ValueError(f"kernel {self.function!r}: a threadgroup of {threadgroup} = {threads} threads is more "
                             f"than the OpenCL device {label!r} runs in one work-group (at most "
                             f"{self.max_threads_per_threadgroup} threads, {per_axis} per "
                             "axis); the simulated device cannot run it")
        if self.info.simd:
            need = scratch_bytes(threads) + self.local_mem_bytes
            if need > local_mem:
                raise ValueError(f"kernel {self.function!r}: a threadgroup of {threads} threads needs {need} bytes of "
                                 f"local memory ({scratch_bytes(threads)} of them the scratch its SIMD-group "
                                 f"functions exchange values through), more than the {local_mem} bytes of "
                                 f"the OpenCL device {label!r}; the simulated device cannot run it with threadgroups "
                                 f"above {self.max_simd_threads} threads")
        global_size = tuple(g * t for g, t in zip(grid, threadgroup))
        total = global_size[0] * global_size[1] * global_size[2]
        if any(n >= MAX_GLOBAL_PER_AXIS for n in global_size) or total > MAX_GLOBAL_THREADS:
            limit = MAX_GLOBAL_THREADS.bit_length() - 1
            raise ValueError(f"kernel {self.function!r}: grid {grid} x threadgroup {threadgroup} = global size "
                             f"{global_size} ({total} threads) is more than the simulated device runs (below 2**32 "
                             f"threads per axis, as Metal addresses them, and at most 2**{limit} in all); a run-time "
                             "size that went below 1 and wrapped?")
        return self._runner.prepare(self, views, bindings, global_size, threadgroup, keep=keep, reuse=reuse)


def _check_storage(storage: Any, where: str, writable: bool) -> None:
    if not isinstance(storage, np.ndarray) or storage.dtype != np.uint8 or storage.ndim != 1:
        got = f"{type(storage).__name__} {getattr(storage, 'dtype', '')} {getattr(storage, 'shape', '')}".strip()
        raise ValueError(f"{where}: the storage must be a 1-D numpy.uint8 array (the MTLBuffer's bytes), got {got}")
    if not storage.flags.c_contiguous:
        raise ValueError(f"{where}: the storage array is not contiguous")
    if storage.nbytes == 0:
        raise ValueError(f"{where}: the storage array is empty (an MTLBuffer has at least 1 byte)")
    if writable and not storage.flags.writeable:
        raise ValueError(f"{where}: the kernel may write this buffer but the storage array is read-only")


def _size3(size: Any, what: str) -> tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be three ints (width, height, depth), got {size!r}") from None
    if len(values) != 3 or any(v < 0 for v in values) or any(isinstance(v, bool) for v in size):
        raise ValueError(f"{what} must be three ints >= 0 (width, height, depth), got {size!r}")
    return values[0], values[1], values[2]
