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
offset passed in the kernel's offset parameter (the translator adds one per buffer, ``msl.py``).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtlir.runtime.errors import KernelAccessError, KernelBuildError, KernelCompileError
from mtlir.runtime.sim.msl import KernelArg, KernelInfo, ParamBinding, Translation, translate
from mtlir.runtime.sim.msl_guard import FAULT_WORDS, SCRATCH_BYTES

cl: Any  # the pyopencl module, or None when it is missing (the runner then says what to install)
try:
    cl = importlib.import_module("pyopencl")
except ImportError:  # pragma: no cover - pyopencl is a dependency
    cl = None

__all__ = ["KernelRunner", "CompiledKernel", "KernelArg", "View", "INSTALL_HINT"]

INSTALL_HINT = ("install an OpenCL runtime for the CPU (Debian/Ubuntu: `sudo apt-get install pocl-opencl-icd "
                "ocl-icd-libopencl1`) and the Python package pyopencl (`pip install pyopencl`)")
# -cl-single-precision-constant: MSL has no double, an unsuffixed literal such as 0.5 is a float there.
# -w: no warnings (tinygrad's `if ((a==0))` draws one per kernel, which PoCL prints on stderr).
BUILD_OPTIONS = ["-cl-single-precision-constant", "-w"]
DEFAULT_TIMEOUT_S = 120.0  # a kernel still running after this long is reported, never waited for forever
# Global sizes the runner refuses before OpenCL sees them (PoCL aborts the whole process on a global size that
# overflows its work-group arithmetic): Metal's own 2**32 threads per axis (thread positions are 32-bit uints),
# and 2**40 threads in all, far more than a CPU runs before any timeout.
MAX_GLOBAL_PER_AXIS = 1 << 32
MAX_GLOBAL_THREADS = 1 << 40
SPIN_S = 2e-4  # poll without sleeping this long first: a sleep costs ~60 us here, most dispatches take less


@dataclass(frozen=True)
class View:
    """How ``run`` binds one parameter: ``how`` is ``"buffer"`` (offset 0: the whole buffer), ``"sub-buffer"``
    (an OpenCL sub-buffer starting at the view, offset argument 0) or ``"offset"`` (the whole buffer, the byte
    ``offset`` passed to the kernel); ``offset`` is the byte offset of the view in its storage."""

    arg: KernelArg
    how: str
    offset: int


class CompiledKernel:
    """One kernel function built for the runner's OpenCL device.

    ``function``: the MSL kernel name; ``params``: its Metal-bound parameters in MSL order (``KernelArg``:
    name, kind ``buffer`` | ``constant``, Metal buffer index, dtype); ``opencl_source``: the translated source of
    the whole library; ``info``: what the translator learnt of it (``msl.KernelInfo``)."""

    def __init__(self, runner: KernelRunner, kernel: Any, info: KernelInfo, source: str) -> None:
        self.function: str = info.function
        self.params: tuple[KernelArg, ...] = info.args
        self.opencl_source: str = source
        self.info = info
        self._runner = runner
        self._kernel = kernel
        wg = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, runner.device)
        self.max_threads_per_threadgroup: int = min(int(wg), runner.device.max_work_group_size)

    def __repr__(self) -> str:
        return f"CompiledKernel({self.function!r}, params={[a.name for a in self.params]})"

    def plan(self, bindings: dict[int, tuple[np.ndarray, int]]) -> tuple[View, ...]:
        """Check ``bindings`` against the parameters and say how each parameter will be bound (``View``).

        Raises ``ValueError`` naming the kernel, parameter and buffer index for a missing binding, a storage that
        is not a 1-D C-contiguous ``numpy.uint8`` array (or is read-only where the kernel writes), an offset
        outside the storage, or an offset that is not a multiple of the element size (Metal requires it,
        METAL.md §1)."""
        align = self._runner.base_align
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
            how = "buffer" if offset == 0 else "sub-buffer" if offset % align == 0 else "offset"
            views.append(View(arg, how, offset))
        return tuple(views)

    def run(self, bindings: dict[int, tuple[np.ndarray, int]], grid: tuple[int, int, int],
            threadgroup: tuple[int, int, int], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Run ``grid`` threadgroups (per axis) of ``threadgroup`` threads each, synchronously.

        ``bindings`` maps each Metal buffer index to ``(storage, byte offset)``: ``storage`` is the whole
        MTLBuffer's host memory as a 1-D ``numpy.uint8`` array; a ``constant T&`` variable is the value at that
        offset. Views of one storage alias as they do in Metal. Results are in the arrays when ``run`` returns.
        A grid or threadgroup with a zero axis runs nothing (Metal accepts such a dispatch, METAL.md §3 rule 13).

        Raises ``ValueError`` for bad bindings (``plan``) or sizes, for a threadgroup larger than the OpenCL
        device runs (``max_threads_per_threadgroup``: 4096 on PoCL here, above Metal's 1024), and for a global
        size of 2**32 threads or more on an axis or more than 2**40 in all (``MAX_GLOBAL_PER_AXIS``,
        ``MAX_GLOBAL_THREADS``: a wrapped size would otherwise abort the process inside PoCL); ``TimeoutError``
        when the kernel has not finished after ``timeout_s`` seconds (the runner then refuses further work,
        since OpenCL cannot stop a running kernel); ``RuntimeError`` when OpenCL refuses to run it."""
        views = self.plan(bindings)
        grid, threadgroup = _size3(grid, "grid"), _size3(threadgroup, "threadgroup")
        if 0 in grid or 0 in threadgroup:
            return
        threads = threadgroup[0] * threadgroup[1] * threadgroup[2]
        dev = self._runner.device
        per_axis = tuple(dev.max_work_item_sizes)[:3]
        if threads > self.max_threads_per_threadgroup or any(t > m for t, m in zip(threadgroup, per_axis)):
            raise ValueError(f"kernel {self.function!r}: a threadgroup of {threadgroup} = {threads} threads is more "
                             f"than the OpenCL device {dev.name!r} runs in one work-group (at most "
                             f"{self.max_threads_per_threadgroup} threads, {per_axis} per "
                             "axis); the simulated device cannot run it")
        global_size = tuple(g * t for g, t in zip(grid, threadgroup))
        total = global_size[0] * global_size[1] * global_size[2]
        if any(n >= MAX_GLOBAL_PER_AXIS for n in global_size) or total > MAX_GLOBAL_THREADS:
            limit = MAX_GLOBAL_THREADS.bit_length() - 1
            raise ValueError(f"kernel {self.function!r}: grid {grid} x threadgroup {threadgroup} = global size "
                             f"{global_size} ({total} threads) is more than the simulated device runs (below 2**32 "
                             f"threads per axis, as Metal addresses them, and at most 2**{limit} in all); a run-time "
                             "size that went below 1 and wrapped?")
        self._runner._launch(self, views, bindings, global_size, threadgroup, timeout_s)


class KernelRunner:
    """Compiles and runs translated kernels on one OpenCL device (one context, one in-order queue).

    ``device``: a ``pyopencl.Device``; ``None`` takes the first device of the first platform that has one.
    Raises ``RuntimeError`` saying what to install when pyopencl or an OpenCL device is missing. Thread-safe:
    one lock serialises compiles and runs."""

    def __init__(self, device: Any = None) -> None:
        if cl is None:
            raise RuntimeError(f"pyopencl is not installed: {INSTALL_HINT}")
        if device is None:
            device = _first_device()
        self.device = device
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context, device)
        self.fp16: bool = "cl_khr_fp16" in device.extensions.split()
        self.base_align: int = max(1, device.mem_base_addr_align // 8)  # the device reports bits
        self._lock = threading.RLock()
        self._programs: dict[str, tuple[Translation, Any]] = {}
        self._kernels: dict[tuple[str, str], CompiledKernel] = {}
        self._stuck: str | None = None
        self._stuck_refs: list[Any] = []
        # The fault record and scratch area every kernel gets as its last argument (msl_guard): one per runner
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
        return f"KernelRunner({self.device.name!r}, fp16={self.fp16}, base_align={self.base_align})"

    def compile(self, msl: str, function: str) -> CompiledKernel:
        """The kernel ``function`` of the MSL library ``msl``, translated and built once (cached).

        Raises ``UnsupportedKernelError`` (MSL the translator cannot express in OpenCL C; ``.construct`` names
        it), ``KernelCompileError`` (MSL that is not valid, no kernel named ``function``) or its subclass
        ``KernelBuildError`` (OpenCL did not build the translation: the MSL may be invalid, or use something the
        translator does not handle; the build log and the numbered translated source are in the message)."""
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
        got = self._programs.get(msl)
        if got is None:
            translation = translate(msl, fp16=self.fp16)
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
                raise KernelBuildError(tuple(translation.kernels), log, translation.source)
            _pass_on(captured.text)
            got = self._programs[msl] = (translation, program)
        return got

    def _launch(self, ck: CompiledKernel, views: tuple[View, ...], bindings: dict[int, tuple[np.ndarray, int]],
                global_size: tuple[int, ...], local_size: tuple[int, int, int], timeout_s: float) -> None:
        with self._lock:
            if self._stuck is not None:
                raise RuntimeError(f"the OpenCL queue is blocked by an earlier kernel that never finished "
                                   f"({self._stuck}); make a new KernelRunner")
            buffers: dict[int, tuple[Any, np.ndarray]] = {}
            writes: set[int] = set()
            args: list[Any] = []
            # The argument block (msl.ParamBinding): per binding its offset from the base pointer, the bytes of the
            # MTLBuffer before that pointer and the MTLBuffer's length (the bounds of msl_guard's checks).
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
            if status == cl.command_execution_status.COMPLETE:
                return
            if status < 0:
                raise RuntimeError(f"OpenCL failed to run {what}: execution status {status}")
            now = time.monotonic()
            if now > deadline:
                self._stuck = what
                self._stuck_refs.append(keep)
                raise TimeoutError(f"{what} did not finish within {timeout_s} s")
            if now > spin_until:
                time.sleep(delay)
                delay = min(delay * 2, 1e-3)


def _access_error(ck: CompiledKernel, views: tuple[View, ...], bindings: dict[int, tuple[np.ndarray, int]],
                  words: np.ndarray) -> KernelAccessError:
    """The ``KernelAccessError`` for the fault record ``words`` a run left (``msl_prelude``'s ``__mtl_chk``: code
    = 2 * binding position + 1 (+1 for a write), access size, byte offset in the MTLBuffer as two words)."""
    code, size = int(words[0]), int(words[1])
    position, write = (code - 1) // 2, (code - 1) % 2 == 1
    offset_in_buffer = int(words[2]) | int(words[3]) << 32
    if offset_in_buffer >= 1 << 63:
        offset_in_buffer -= 1 << 64
    verb = "wrote" if write else "read"
    if position >= len(ck.info.bindings):  # one of the kernel's threadgroup or thread arrays
        array = ck.info.arrays[position - len(ck.info.bindings)]
        element = offset_in_buffer // array.elem if array.elem else None
        at = (f"element {element} (byte offset {offset_in_buffer})" if element is not None
              else f"byte offset {offset_in_buffer}")
        message = (f"kernel {ck.function!r} {verb} {size} bytes out of bounds of its {array.memory} array "
                   f"{array.name!r} at {at}: the simulated device skipped the access (on Metal: undefined, "
                   f"another thread's or threadgroup's memory, or a GPU fault)")
        return KernelAccessError(message, function=ck.function, param=array.name, index=-1, write=write,
                                 offset=offset_in_buffer, element=element, size=size, buffer_bytes=0,
                                 view_offset=0, memory=array.memory)
    b: ParamBinding = ck.info.bindings[position]
    view = views[position]
    storage = bindings[b.arg.index][0]
    offset = offset_in_buffer - view.offset
    element = offset // b.elem if b.elem else None
    at = f"element {element} (byte offset {offset})" if element is not None else f"byte offset {offset}"
    message = (f"kernel {ck.function!r} {verb} {size} bytes out of bounds through parameter "
               f"{b.arg.name!r} (buffer index {b.arg.index}) at {at} of its view at offset {view.offset} of a "
               f"{storage.nbytes}-byte buffer: the simulated device skipped the access (on Metal: a GPU address "
               "fault, or a silent access within the allocation's pages)")
    return KernelAccessError(message, function=ck.function, param=b.arg.name, index=b.arg.index, write=write,
                             offset=offset, element=element, size=size, buffer_bytes=storage.nbytes,
                             view_offset=view.offset)


class _Captured:
    text = ""


@contextlib.contextmanager
def _native_stderr() -> Iterator[_Captured]:
    """Capture what native code writes to file descriptor 2 meanwhile (PoCL's compiler prints ``1 error
    generated.`` there itself, past Python): the text is in the yielded object's ``text`` afterwards. Nothing is
    captured when fd 2 cannot be redirected."""
    got = _Captured()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield got
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield got
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            got.text = tmp.read().decode("utf-8", "replace")


def _pass_on(text: str) -> None:
    """Write captured stderr text back, without the compiler's ``N errors generated.`` lines (the text may hold
    other threads' output of the same moment)."""
    keep = [line for line in text.splitlines(keepends=True) if not _GENERATED.fullmatch(line.strip())]
    if keep:
        sys.stderr.write("".join(keep))


_GENERATED = re.compile(r"\d+ (?:errors?|warnings?)(?: and \d+ (?:errors?|warnings?))? generated\.")


def _first_device() -> Any:
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:
        raise RuntimeError(f"no OpenCL platform found ({e}): {INSTALL_HINT}") from None
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        if devices:
            return devices[0]
    raise RuntimeError(f"no OpenCL device found: {INSTALL_HINT}")


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


def _size3(size: Any, what: str) -> tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be three ints (width, height, depth), got {size!r}") from None
    if len(values) != 3 or any(v < 0 for v in values) or any(isinstance(v, bool) for v in size):
        raise ValueError(f"{what} must be three ints >= 0 (width, height, depth), got {size!r}")
    return values[0], values[1], values[2]
