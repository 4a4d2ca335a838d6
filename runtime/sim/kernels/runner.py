"""Run Metal kernels for real on the OpenCL device present (PoCL on the CPU here): the simulated device's GPU.

``KernelRunner`` owns one pyopencl context and queue. ``compile(msl, function)`` translates the MSL library with
``msl.translate`` and builds it once (cached per MSL source; kernels per (source, function)).
``CompiledKernel.run(bindings, grid, threadgroup)`` binds each Metal buffer index to (host storage, byte offset),
runs ``grid`` threadgroups of ``threadgroup`` threads (Metal's dispatchThreadgroups convention, METAL.md §4:
OpenCL global size = grid x threadgroup per axis, local size = threadgroup) and returns when the results are in
the storage arrays.

Memory: each distinct storage array becomes one OpenCL buffer over the same host memory (``CL_MEM_USE_HOST_PTR``:
nothing is copied where the device can use host memory, as PoCL's CPU device does); the buffers the kernel may
write are mapped for reading after the run, which is where OpenCL guarantees the host sees the results. A view
at a byte offset is bound as an OpenCL sub-buffer when the offset is a multiple of the device's
``mem_base_addr_align`` (OpenCL 1.2 §5.2.1: sub-buffer origins must be), else as the whole buffer with the
offset passed in the kernel's offset parameter (the translator adds one per buffer, ``msl.translate``).
"""
from __future__ import annotations

import importlib
import threading
import time
import warnings
from typing import Any

import numpy as np

# The pieces, one idea each: a kernel's bindings and sizes (``compiled``), the fault record read back as an error
# (``faults``), the compiler's stderr (``stderr``); this module holds the device, the build cache and the launch.
from mtlir.errors import KernelCompileError, NoDeviceError, WaitTimeoutError
from mtlir.runtime.sim.kernels.buildlog import build_error
from mtlir.runtime.sim.kernels.compiled import CompiledKernel, View
from mtlir.runtime.sim.kernels.faults import _access_error
from mtlir.runtime.sim.kernels.stderr import _native_stderr, _pass_on
from mtlir.runtime.sim.msl.translate import Translation, translate
from mtlir.runtime.sim.msl.guard.bound import FAULT_WORDS, SCRATCH_BYTES
from mtlir.runtime.sim.msl.simd import scratch_bytes

__all__ = ["KernelRunner", "INSTALL_HINT", "BUILD_OPTIONS"]

INSTALL_HINT = ("install an OpenCL runtime for the CPU (Debian/Ubuntu: `sudo apt-get install pocl-opencl-icd "
                "ocl-icd-libopencl1`) and the Python package pyopencl (`pip install pyopencl`)")
# -cl-single-precision-constant: MSL has no double, an unsuffixed literal such as 0.5 is a float there.
# -w: no warnings (tinygrad's `if ((a==0))` draws one per kernel, which PoCL prints on stderr).
BUILD_OPTIONS = ["-cl-single-precision-constant", "-w"]
SPIN_S = 2e-4  # poll without sleeping this long first: a sleep costs ~60 us here, most dispatches take less


class KernelRunner:
    """Compiles and runs translated kernels on one OpenCL device (one context, one in-order queue).

    ``device``: a ``pyopencl.Device``; ``None`` takes the first device of the first platform that has one.
    ``cl``: the OpenCL API the runner calls: the pyopencl module (``None``: imported here) or a stand-in with the
    same names. Raises ``NoDeviceError`` saying what to install when pyopencl or an OpenCL device is missing.
    Thread-safe: one lock serialises compiles and runs."""

    def __init__(self, device: Any = None, *, cl: Any = None) -> None:
        if cl is None:
            cl = _import_pyopencl()
        self.cl = cl
        if device is None:
            device = _first_device(cl)
        self.device = device
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context, device)
        self.base_align: int = max(1, device.mem_base_addr_align // 8)  # the device reports bits
        self._lock = threading.RLock()
        self._programs: dict[str, tuple[Translation, Any]] = {}
        self._kernels: dict[tuple[str, str], CompiledKernel] = {}
        self._stuck: str | None = None
        self._stuck_refs: list[Any] = []
        # The fault record and scratch area every kernel gets as its last argument (``guard``): one per runner
        # (runs are serialised by the lock), its record cleared after a run that faulted. Where the device works in
        # the host memory itself (PoCL's CPU device: a map returns the host pointer, checked once here), the record
        # is read there once the kernel has completed; elsewhere it is mapped after each run like the outputs.
        self._fault_host = np.zeros(FAULT_WORDS * 4 + SCRATCH_BYTES, np.uint8)
        self._fault_buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR,
                                    hostbuf=self._fault_host)
        mapped, _ = cl.enqueue_map_buffer(self.queue, self._fault_buf, cl.map_flags.READ, 0, (FAULT_WORDS * 4,),
                                          np.uint8, is_blocking=True)
        self.fault_in_host_memory: bool = _address(mapped) == _address(self._fault_host)
        mapped.base.release(self.queue)
        self.queue.finish()

    def __repr__(self) -> str:
        return f"KernelRunner({self.device.name!r}, base_align={self.base_align})"

    def compile(self, msl: str, function: str) -> CompiledKernel:
        """The kernel ``function`` of the MSL library ``msl``, translated and built once (cached).

        Raises ``UnsupportedKernelError`` (MSL the translator cannot express in OpenCL C; ``.construct`` names
        it), ``KernelCompileError`` (MSL that is not valid, no kernel named ``function``) or its subclass
        ``KernelBuildError`` (OpenCL did not build the translation: the MSL may be invalid, or use something the
        translator does not handle; the build log and the numbered translated source are in the message)."""
        cl = self.cl
        with self._lock:
            got = self._kernels.get((msl, function))
            if got is not None:
                return got
            translation, program = self._program(msl)
            info = translation.kernels.get(function)
            if info is None:
                names = ", ".join(sorted(translation.kernels)) or "none"
                raise KernelCompileError(f"no kernel function {function!r} in the MSL (its kernels: {names})")
            kernel = cl.Kernel(program, function)
            compiled = CompiledKernel(self, kernel, info, translation.source)
            self._kernels[(msl, function)] = compiled
            return compiled

    def _program(self, msl: str) -> tuple[Translation, Any]:
        cl = self.cl
        got = self._programs.get(msl)
        if got is None:
            translation = translate(msl)
            failed: str | None = None
            with _native_stderr() as captured:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        program = cl.Program(self.context, translation.source).build(options=BUILD_OPTIONS)
                except cl.Error as e:
                    failed = str(e)
            if failed is not None:
                log = failed + ("\n" + captured.text if captured.text.strip() else "")
                raise build_error(tuple(translation.kernels), log, translation.source)
            _pass_on(captured.text)
            got = self._programs[msl] = (translation, program)
        return got

    def _launch(self, ck: CompiledKernel, views: tuple[View, ...], bindings: dict[int, tuple[np.ndarray, int]],
                global_size: tuple[int, ...], local_size: tuple[int, int, int], timeout_s: float) -> None:
        cl = self.cl
        with self._lock:
            if self._stuck is not None:
                raise RuntimeError(f"the OpenCL queue is blocked by an earlier kernel that never finished "
                                   f"({self._stuck}); make a new KernelRunner")
            buffers: dict[int, tuple[Any, np.ndarray]] = {}
            writes: set[int] = set()
            args: list[Any] = []
            # The argument block (msl.ParamBinding): per binding its offset from the base pointer, the bytes of the
            # MTLBuffer before that pointer and the MTLBuffer's length (the bounds of the guard's checks).
            block = np.zeros(3 * max(1, len(views)), np.uint64)
            for b, view in zip(ck.info.bindings, views):
                storage = bindings[b.arg.index][0]
                key = _storage_key(storage, buffers)
                if key not in buffers:
                    buffers[key] = (self._buffer(storage), storage)
                if b.writable:
                    writes.add(key)
                buf = buffers[key][0]
                k = 3 * b.slot
                if view.how == "sub-buffer":
                    flags = cl.mem_flags.READ_WRITE if b.writable else cl.mem_flags.READ_ONLY
                    args.append(buf.get_sub_region(view.offset, storage.nbytes - view.offset, flags))
                    block[k + 1] = view.offset
                else:
                    args.append(buf)
                    block[k] = view.offset
                block[k + 2] = storage.nbytes
            args += [cl.Buffer(self.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=block),
                     self._fault_buf]
            if ck.info.simd:  # the threadgroup scratch SIMD-group lanes exchange values through (msl.simd)
                args.append(cl.LocalMemory(scratch_bytes(local_size[0] * local_size[1] * local_size[2])))
            ck._kernel.set_args(*args)
            what = f"kernel {ck.function!r}, global size {global_size}, threadgroup {local_size}"
            try:
                last = cl.enqueue_nd_range_kernel(self.queue, ck._kernel, global_size, local_size)
                # Map what the kernel may write, in the same round trip: once a map completes, OpenCL guarantees
                # the host memory holds the results (OpenCL 1.2 §5.4.2.1).
                maps = []
                for key in sorted(writes):
                    buf, storage = buffers[key]
                    mapped, last = cl.enqueue_map_buffer(self.queue, buf, cl.map_flags.READ, 0, (storage.nbytes,),
                                                         np.uint8, is_blocking=False)
                    maps.append((mapped, storage))
                fault: Any = self._fault_host[:FAULT_WORDS * 4]
                if not self.fault_in_host_memory:
                    fault, last = cl.enqueue_map_buffer(self.queue, self._fault_buf,
                                                        cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                                        (FAULT_WORDS * 4,), np.uint8, is_blocking=False)
                self.queue.flush()
            except cl.Error as e:
                raise RuntimeError(f"OpenCL refused to run {what}: {e}") from None
            self._wait(last, timeout_s, what, (args, [s for _, s in buffers.values()]))
            for mapped, storage in maps:
                if _address(mapped) != _address(storage):  # the device kept its own copy: bring the results home
                    storage[...] = mapped
                mapped.base.release(self.queue)  # the unmap is queued; later commands come after it
            words = fault.view(np.uint32)
            error = _access_error(ck, views, bindings, words) if words[0] else None
            if error is not None:
                words[:4] = 0  # cleared (through the mapping, if any): the next run starts with no fault
            if not self.fault_in_host_memory:
                fault.base.release(self.queue)
            if error is not None:
                raise error

    def _buffer(self, storage: np.ndarray) -> Any:
        cl = self.cl
        if storage.flags.writeable:
            return cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=storage)
        return cl.Buffer(self.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=storage)

    def _wait(self, event: Any, timeout_s: float, what: str, keep: Any) -> None:
        """Poll ``event`` until it completes: spin for the first ``SPIN_S`` (a small kernel is done by then), then
        sleep between polls, 10 us growing to 1 ms. Past ``timeout_s`` mark the runner stuck (keeping the memory the
        kernel uses alive: OpenCL cannot stop it) and raise ``TimeoutError``."""
        start = time.monotonic()
        spin_until, deadline = start + SPIN_S, start + timeout_s
        delay = 1e-5
        while True:
            status = event.command_execution_status
            if status == self.cl.command_execution_status.COMPLETE:
                return
            if status < 0:
                raise RuntimeError(f"OpenCL failed to run {what}: execution status {status}")
            now = time.monotonic()
            if now > deadline:
                self._stuck = what
                self._stuck_refs.append(keep)
                raise WaitTimeoutError(f"{what} did not finish within {timeout_s} s")
            if now > spin_until:
                time.sleep(delay)
                delay = min(delay * 2, 1e-3)


def _import_pyopencl() -> Any:
    """The pyopencl module; ``NoDeviceError`` saying what to install when it is missing."""
    try:
        return importlib.import_module("pyopencl")
    except ImportError:
        raise NoDeviceError(f"pyopencl is not installed: {INSTALL_HINT}") from None


def _first_device(cl: Any) -> Any:
    """The first device of the first OpenCL platform that has one; ``NoDeviceError`` saying what to install."""
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:
        raise NoDeviceError(f"no OpenCL platform found ({e}): {INSTALL_HINT}") from None
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        if devices:
            return devices[0]
    raise NoDeviceError(f"no OpenCL device found: {INSTALL_HINT}")


def _storage_key(storage: np.ndarray, known: dict[int, tuple[Any, np.ndarray]]) -> int:
    """The key of the OpenCL buffer for ``storage``: arrays over the same memory share one (views alias as in
    Metal); ``ValueError`` for two storages that overlap without being the same memory."""
    addr = _address(storage)
    for key, (_, other) in known.items():
        if key == addr and other.nbytes == storage.nbytes:
            return key
        if np.may_share_memory(storage, other):
            raise ValueError("two bound storages overlap without being the same array: bind one MTLBuffer's "
                             "memory as one storage array")
    return addr


def _address(array: np.ndarray) -> int:
    """The address of an array's first byte (``__array_interface__``: cheaper than ``ndarray.ctypes``)."""
    return int(array.__array_interface__["data"][0])
