"""Run Metal kernels for real on an OpenCL device (PoCL on the CPU here, a GPU where one is): the simulated device's GPU.

``KernelRunner`` owns one pyopencl context and queue on the device ``opencl_device`` picks (``select_device``: an
index, or a substring of the platform or device name; the first device by default; ``list_devices`` lists them).
``compile(msl, function)`` translates the MSL library with ``msl.translate`` and builds it once (cached per MSL source; kernels per (source, function)).
``CompiledKernel.run(bindings, grid, threadgroup)`` binds each Metal buffer index to (host storage, byte offset),
runs ``grid`` threadgroups of ``threadgroup`` threads (Metal's dispatchThreadgroups convention, METAL.md §4:
OpenCL global size = grid x threadgroup per axis, local size = threadgroup) and returns when the results are in
the storage arrays. ``CompiledKernel.prepare`` checks a dispatch once and gives a ``Launch`` (``launch``) that
``run_batch`` enqueues with others at once, waiting once for all of them (``waiter``: a helper thread blocks in
``clWaitForEvents``, so a kernel that never ends still times out); each launch of a batch has its own fault record.

Memory: each distinct storage array (one MTLBuffer's bytes) becomes one OpenCL buffer, made once and kept while it
is used (dropped after ``KEEP_SYNCS`` to twice that many syncs without a use: a sweep every ``KEEP_SYNCS`` syncs): where the device works in host memory (PoCL's CPU
device) a ``USE_HOST_PTR`` buffer over the array itself, nothing copied or mapped; elsewhere a buffer in the
device's own memory, copied in at its first use after a sync and kept there between kernels (``resident``): a run
with ``keep=True`` leaves what it wrote on the device until ``sync()`` copies it back to the host arrays and marks
every device copy stale (the next use copies in again, so what the host wrote in between is seen). A run without
``keep`` syncs at once: its results are in the arrays when it returns. A view at a byte offset is always bound as the whole buffer with the offset passed in
the kernel's offset argument (the translator adds one per buffer, ``msl.translate``), never as an OpenCL
sub-buffer: a kernel whose views of one buffer overlap (an arena that holds a kernel's inputs and output, as
tinygrad's memory planner makes) would read and write overlapping sub-buffers at once, which OpenCL leaves
undefined (OpenCL 3.0 §5.2.2) and NVIDIA's driver answers by losing the writes.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

# The pieces, one idea each: a kernel's bindings and sizes (``compiled``), the fault record read back as an error
# (``faults``), the compiler's stderr (``stderr``); this module holds the device, the build cache and the launch.
from mtlir.errors import KernelAccessError, KernelCompileError, WaitTimeoutError
from mtlir.runtime.sim.kernels.buildlog import build_error
from mtlir.runtime.sim.kernels.compiled import CompiledKernel, View
from mtlir.runtime.sim.kernels.devices import _import_pyopencl, device_kind, device_name, select_device
from mtlir.runtime.sim.kernels.faults import _access_error
from mtlir.runtime.sim.kernels.launch import MAX_BATCH, DeviceBuffer, FaultRecords, Launch
from mtlir.runtime.sim.kernels.stderr import _native_stderr, _pass_on
from mtlir.runtime.sim.kernels.waiter import EventWaiter
from mtlir.runtime.sim.msl.translate import Translation, translate
from mtlir.runtime.sim.msl.simd import scratch_bytes

KEEP_SYNCS = 4  # a device buffer unused for this many syncs is dropped at the next sweep (a submit syncs 1-3 times)
SNAPSHOT_BYTES = 1 << 18  # device copies of buffers up to this size are copied in only when the host changed them
SPIN_S = 0.002  # on a GPU the batch's wait first watches its last event this long on the calling thread (``waiter``)
MIRROR_BYTES = 1 << 24  # buffers up to this size come back through a page-locked mirror (``_copy_back``)

__all__ = ["KernelRunner", "BUILD_OPTIONS"]

# -cl-single-precision-constant: MSL has no double, an unsuffixed literal such as 0.5 is a float there.
# -w: no warnings (tinygrad's `if ((a==0))` draws one per kernel, which PoCL prints on stderr).
BUILD_OPTIONS = ["-cl-single-precision-constant", "-w"]


class KernelRunner:
    """Compiles and runs translated kernels on one OpenCL device (one context, one in-order queue).

    ``device``: a ``pyopencl.Device``, or what ``select_device`` takes (an index into ``list_devices()``, or a
    substring of ``"platform / device"``); ``None`` takes the first device of the first platform that has one.
    ``cl``: the OpenCL API the runner calls: the pyopencl module (``None``: imported here) or a stand-in with the
    same names. Raises ``NoDeviceError`` saying what to install when pyopencl or an OpenCL device is missing, or
    naming the devices present when none matches ``device``. ``in_host_memory``: whether kernels work in the host
    arrays themselves (``USE_HOST_PTR`` buffers, nothing copied); ``None`` (default): where the device does, a CPU
    device such as PoCL's whose map of such a buffer returns the host pointer (checked once here: a GPU's map may
    return the host pointer and still work in its own memory, as NVIDIA's does); ``False``: copies in
    and out as on a discrete GPU, whatever the device (``True`` where it does not is refused: ``ValueError``).
    Thread-safe: one lock serialises compiles and runs."""

    checker: Any = None  # checked mode's hook (kernels/oclgrind.py ``CheckedRuns``): runs each launch checked
    checking: int | None = None  # checked mode: the position in the batch of the launch being checked or run

    def __init__(self, device: Any = None, *, cl: Any = None, in_host_memory: bool | None = None) -> None:
        if cl is None:
            cl = _import_pyopencl()
        self.cl = cl
        if device is None or isinstance(device, (str, int)):
            device = select_device(cl, device)
        self.device = device
        self.device_name: str = device_name(device)
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context, device)
        self.base_align: int = max(1, device.mem_base_addr_align // 8)  # the device reports bits
        self._lock = threading.RLock()
        self._programs: dict[str, tuple[Translation, Any]] = {}
        self._kernels: dict[tuple[str, str], CompiledKernel] = {}
        self._stuck: str | None = None
        self._stuck_refs: list[Any] = []
        # storage address -> its OpenCL buffer, kept across syncs while it is used (``DeviceBuffer``); holding the
        # array keeps its address, the key, from being reused by another while the entry lives. An entry not used
        # for ``KEEP_SYNCS`` syncs is dropped at the next sweep, every ``KEEP_SYNCS`` syncs (a launch that still names it
        # makes a new one at its next run).
        self._buffers: dict[int, DeviceBuffer] = {}
        self._generation = 0  # syncs so far
        # the entries made current since the last sync, and those written (device copies only, maybe twice): a
        # sync resets and copies back these, not every entry of ``_buffers`` (a tinygrad device holds hundreds)
        self._current: list[DeviceBuffer] = []
        self._written: list[DeviceBuffer] = []
        self._dropped = 0  # device buffers dropped so far (while none was, no launch needs a rebind)
        self._blocks: dict[bytes, Any] = {}  # argument blocks by content: most dispatches repeat one
        self._mirrors: dict[DeviceBuffer, np.ndarray] = {}  # page-locked host copies results come back through
        self._waiter = EventWaiter()
        self.in_flight: list[tuple[Launch, Any]] = []  # the batch enqueued now: (launch, its kernel's event)
        # Where the device works in host memory (PoCL's CPU device: a map of a USE_HOST_PTR buffer returns the host
        # pointer, checked once here) kernels work in the arrays themselves; elsewhere buffers are copied.
        probe = np.zeros(64, np.uint8)
        probe_buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=probe)
        mapped, _ = cl.enqueue_map_buffer(self.queue, probe_buf, cl.map_flags.READ, 0, (64,), np.uint8,
                                          is_blocking=True)
        # A CPU device whose map returns the host pointer works in host memory; a GPU's map may return it too
        # (NVIDIA's does: the driver copies its own copy into the host memory at the map), so the kind decides.
        works_in_place = device_kind(cl, device) == "CPU" and _address(mapped) == _address(probe)
        mapped.base.release(self.queue)
        self.queue.finish()
        if in_host_memory and not works_in_place:
            raise ValueError(f"the OpenCL device {self.device_name!r} keeps its own copy of buffers: it cannot work "
                             "in the host arrays (in_host_memory=True)")
        self.in_host_memory: bool = works_in_place if in_host_memory is None else in_host_memory
        # a batch's wait watches its event first where that takes no time from the kernels (not a CPU device)
        self.spin_s: float = SPIN_S if device_kind(cl, device) == "GPU" else 0.0
        # The fault records and scratch areas kernels get as their last argument (``guard``), one per launch of a
        # batch (``launch.FaultRecords``): read once the batch completed, in place or by one copy.
        self._records = FaultRecords(cl, self.context, self.base_align, self.in_host_memory, self._pinned,
                                     self.queue)
        self._map_queue: Any = None  # the queue page-locked staging buffers are mapped on (``_pinned``)

    def __repr__(self) -> str:
        return f"KernelRunner({self.device_name!r}, base_align={self.base_align})"

    @property
    def stuck(self) -> str | None:
        """The launch that did not finish within its batch's timeout (the OpenCL queue stays blocked behind it:
        every later run is refused), None while every kernel ended in time."""
        return self._stuck

    @property
    def resident(self) -> int:
        """How many buffers have a device copy that is current now (copied in, or worked in, since the last
        ``sync``)."""
        return sum(1 for e in self._buffers.values() if e.current)

    def sync(self) -> None:
        """Copy what kernels run with ``keep=True`` wrote back into the host arrays, and forget every device copy:
        the next run copies its buffers in again, so it sees what the host wrote since. Raises ``RuntimeError``
        when OpenCL refuses a copy."""
        with self._lock:
            self._sync_locked()

    def _sync_locked(self) -> None:
        cl = self.cl
        if self._stuck is not None:
            self._buffers.clear()
            self._current, self._written = [], []
            return  # the queue is blocked: nothing more comes back (the error said so)
        self._generation += 1
        current, written = self._current, self._written
        self._current, self._written = [], []
        try:
            back = []
            for e in dict.fromkeys(written):  # an entry written, copied back by a batch, then written again: once
                if e.dirty:
                    back.append((e, self._copy_back(e)))
            for e in current:  # every entry current or dirty was made current since the last sync
                e.current = e.dirty = False
            if back:
                self.queue.finish()
                for e, mirror in back:
                    self._landed(e, mirror)
        except cl.Error as err:
            raise RuntimeError(f"OpenCL could not copy the kernels' results back to the host: {err}") from None
        finally:
            if self._generation % KEEP_SYNCS == 0:  # the sweep, every KEEP_SYNCS syncs: O(buffers) once per sweep
                old = self._generation - KEEP_SYNCS
                for key in [k for k, e in self._buffers.items() if e.used < old]:
                    dropped = self._buffers.pop(key)
                    dropped.buf = None  # a launch holding it rebinds at its next run
                    self._dropped += 1
                    self._mirrors.pop(dropped, None)

    def _copy_back(self, e: DeviceBuffer) -> np.ndarray | None:
        """Enqueue the copy of ``e``'s device copy to the host, without waiting: into its page-locked mirror
        (returned; ``_landed`` moves the bytes to the host array once the copy completed), else straight into the
        host array (None)."""
        mirror = self._mirror(e)
        self.cl.enqueue_copy(self.queue, e.storage if mirror is None else mirror, e.buf, is_blocking=False)
        return mirror

    def _mirror(self, e: DeviceBuffer) -> np.ndarray | None:
        """The page-locked host copy results of ``e`` come back through (made at its first use), for a buffer of
        at most ``MIRROR_BYTES``; None for a larger one (copied straight into the host array). A copy into pageable
        memory is staged by the driver on the calling thread: NVIDIA's copies twice, where a copy into page-locked
        memory is one DMA (as ``FaultRecords`` reads its records)."""
        mirror = self._mirrors.get(e)
        if mirror is None and 0 < e.storage.nbytes <= MIRROR_BYTES:
            mirror = self._mirrors[e] = self._pinned(e.storage.nbytes)
        return mirror

    def _pinned(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of page-locked host memory (uint8): an ``ALLOC_HOST_PTR`` buffer mapped once and kept mapped,
        the staging area copies to the host go through (one DMA, no copy by the driver on the calling thread). It
        is mapped on a queue of its own (``_map_queue``, made at the first call): a blocking map on the kernels'
        in-order queue would wait for every kernel enqueued before it, as a map made while a batch is in flight
        (the first copy back of a buffer) would, turning the batch's wait with a timeout into an unbounded one.
        The buffer is no kernel's, so the map completes at once. Raises ``pyopencl.Error`` when OpenCL refuses."""
        cl = self.cl
        if self._map_queue is None:
            self._map_queue = cl.CommandQueue(self.context, self.device)
        buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, size=nbytes)
        mapped, _ = cl.enqueue_map_buffer(self._map_queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                          (nbytes,), np.uint8, is_blocking=True)
        return mapped  # type: ignore[no-any-return]  # its ``base`` keeps the buffer alive

    @staticmethod
    def _landed(e: DeviceBuffer, mirror: np.ndarray | None) -> None:
        """After the copy ``_copy_back`` enqueued completed: the bytes in the host array (from the mirror), and in
        the snapshot (the device copy's bytes are the host's now)."""
        if mirror is not None:
            np.copyto(e.storage, mirror)
        if e.snapshot is not None:
            np.copyto(e.snapshot, e.storage)

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
            kernel = cl.Kernel(program, info.opencl_function)
            compiled = CompiledKernel(self, kernel, info, translation.source, program)
            self._kernels[(msl, function)] = compiled
            return compiled

    def _program(self, msl: str) -> tuple[Translation, Any]:
        cl = self.cl
        got = self._programs.get(msl)
        if got is None:
            translation = translate(msl)
            failed: str | None = None
            with _native_stderr() as captured, _interrupts_held() as held:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        program = cl.Program(self.context, translation.source).build(options=BUILD_OPTIONS)
                except cl.Error as e:
                    failed = str(e)
            if failed is not None:
                if held.interrupted:  # the Ctrl-C held off during the build wins over what the build said
                    raise KeyboardInterrupt
                log = failed + ("\n" + captured.text if captured.text.strip() else "")
                raise build_error(tuple(translation.kernels), log, translation.source, msl=msl,
                                  position=translation.msl_position)
            _pass_on(captured.text)
            got = self._programs[msl] = (translation, program)
            if held.interrupted:  # the Ctrl-C held off during the build
                raise KeyboardInterrupt
        return got

    def prepare(self, ck: CompiledKernel, views: tuple[View, ...], bindings: dict[int, tuple[np.ndarray, int]],
                global_size: tuple[int, ...], local_size: tuple[int, int, int], *, keep: bool = False,
                reuse: Launch | None = None) -> Launch:
        """A ``Launch`` of ``ck`` for bindings and sizes that ``CompiledKernel.prepare`` checked: the device buffers
        (made once per storage array), the argument block, the SIMD scratch. ``keep``: the launch will be reused
        (the simulated GPU keeps one per ICB command): it gets an OpenCL kernel object of its own with its arguments
        set once; otherwise it shares the compiled kernel's, its arguments set at every enqueue. ``reuse``: a kept
        launch of ``ck`` this one replaces (no longer run), whose kernel object it takes over."""
        cl = self.cl
        with self._lock:
            # The argument block (msl.ParamBinding): per binding its offset from the base pointer, the bytes of the
            # MTLBuffer before that pointer (0: views are offsets from the buffer's start) and the MTLBuffer's
            # length (the bounds of the guard's checks).
            block = np.zeros(3 * max(1, len(views)), np.uint64)
            uses: list[tuple[DeviceBuffer, bool]] = []
            args: list[Any] = []
            try:
                for b, view in zip(ck.info.bindings, views):
                    storage = bindings[b.arg.index][0]
                    e = self._device_buffer(storage)
                    uses.append((e, b.writable))
                    args.append(e.buf)
                    block[3 * b.slot] = view.offset
                    block[3 * b.slot + 2] = storage.nbytes
                args += [self._block(block), self._records.slots[0]]
                if ck.info.simd:  # the threadgroup scratch SIMD-group lanes exchange values through (msl.simd)
                    args.append(cl.LocalMemory(scratch_bytes(local_size[0] * local_size[1] * local_size[2])))
                if keep and reuse is not None and reuse.own and reuse.ck is ck:
                    kernel = reuse.kernel  # the launch it replaces is dropped: its kernel object is free
                else:  # a new kernel object costs pyopencl ~200 us (it looks up its argument setter)
                    kernel = cl.Kernel(ck._program, ck.info.opencl_function) if keep else ck._kernel
                launch = Launch(ck, views, bindings, global_size, local_size, uses, args, kernel, keep)
                if keep:
                    kernel.set_args(*args)
                    launch.record = 0
            except cl.Error as err:
                raise RuntimeError(f"OpenCL refused the arguments of kernel {ck.function!r}: {err}") from None
            return launch

    def run_batch(self, launches: Sequence[Launch], timeout_s: float, keep: bool = False,
                  write_back: bool = False) -> tuple[int, KernelAccessError] | None:
        """Run ``launches`` in order (the in-order queue runs each after the one before), enqueued ``MAX_BATCH`` at a
        time with one wait each: buffers copied in at their first use since the last sync, every launch with its own
        fault record. Returns the first fault, ``(position in launches, KernelAccessError)``, None when none
        faulted: the batch with the faulting launch ran whole (its later launches too), later batches did not.
        Without ``keep`` the results are synced to the host arrays before it returns. ``write_back`` (with
        ``keep``, where the device keeps its own copies): the buffers kernels wrote since the last sync are copied
        back to the host arrays behind the last batch, covered by its one wait (the simulated GPU asks for it at
        the end of an encoder's work: the ``sync`` after it then has nothing to copy nor to wait for, one round
        trip to the device fewer); the device copies stay current.

        Raises ``TimeoutError`` (``WaitTimeoutError``) when a batch has not finished after ``timeout_s`` seconds,
        naming the first launch not finished (the runner then refuses further work: OpenCL cannot stop a
        kernel); ``RuntimeError`` when OpenCL refuses or fails a launch."""
        if self.checker is not None and launches:  # checked mode: kernels/oclgrind.py checks each launch first
            return self.checker(self, launches, timeout_s, keep)  # type: ignore[no-any-return]
        with self._lock:
            if self._stuck is not None:
                raise RuntimeError(f"the OpenCL queue is blocked by an earlier kernel that never finished "
                                   f"({self._stuck}); make a new KernelRunner (a new SimDevice)")
            fault: tuple[int, KernelAccessError] | None = None
            for first in range(0, len(launches), MAX_BATCH):
                last = first + MAX_BATCH >= len(launches)
                fault = self._batch(launches[first:first + MAX_BATCH], first, timeout_s,
                                    write_back and keep and last and not self.in_host_memory)
                if fault is not None:
                    break
            if not keep:
                self._sync_locked()
            return fault

    def _batch(self, launches: Sequence[Launch], first: int, timeout_s: float,
               write_back: bool = False) -> tuple[int, KernelAccessError] | None:
        """Enqueue ``launches`` and wait once. The copies in come first, all of them, before the first kernel (a
        buffer not current is used by no earlier launch of the batch, so copying it in earlier changes nothing);
        the transfers to the host (results for ``write_back``, the fault records) are enqueued only once the
        kernels completed (``after``, run by the wait): NVIDIA's driver blocks the thread that enqueues a copy
        between the host and the device behind running kernels (seen on the H200: ~50 ms behind a 50 ms kernel,
        pinned memory or not), which would make the wait's timeout unreachable; copies between buffers and
        kernels return at once there."""
        cl, queue, records = self.cl, self.queue, self._records
        in_flight: list[tuple[Launch, Any]] = []
        back: list[tuple[DeviceBuffer, np.ndarray | None]] = []
        launch = launches[0]
        generation, current = self._generation, self._current
        if not self.in_host_memory:
            records.destination()  # made before the kernels too
        try:
            for launch in launches:
                if self._dropped and launch.uses and any(e.buf is None for e, _ in launch.uses):
                    self._rebind(launch)
                for e, writable in launch.uses:
                    e.used = generation
                    if not e.current:
                        if not e.in_place:
                            self._copy_in(e)
                        e.current = True
                        current.append(e)
                    if writable and not e.dirty:
                        e.dirty = True
                        if not e.in_place:
                            self._written.append(e)
            # the buffers kernels wrote since the last sync, with their page-locked mirrors: made before the kernels
            # are enqueued (a map made while they run might wait for them), on this thread (not the one that may
            # run ``after``)
            if write_back and self._written:
                back = [(entry, self._mirror(entry)) for entry in dict.fromkeys(self._written) if entry.dirty]
            for k, launch in enumerate(launches):
                if not launch.own:
                    launch.args[launch.fault_arg] = records.slots[k]
                    launch.kernel.set_args(*launch.args)
                elif launch.record != k:
                    launch.kernel.set_arg(launch.fault_arg, records.slots[k])
                    launch.record = k
                in_flight.append((launch, cl.enqueue_nd_range_kernel(queue, launch.kernel, launch.global_size,
                                                                     launch.local_size)))
            queue.flush()
        except cl.Error as e:
            raise RuntimeError(f"OpenCL refused to run {launch.what}: {e}") from None
        got: list[np.ndarray] = []

        def after() -> Any:
            """Once the kernels completed: enqueue the copies back and the records' read; their last event."""
            for entry, mirror in back:
                cl.enqueue_copy(queue, entry.storage if mirror is None else mirror, entry.buf, is_blocking=False)
            words, last = records.read(queue, len(launches))
            got.append(words)
            queue.flush()
            return last

        self.in_flight = in_flight
        try:
            self._wait(in_flight[-1][1], timeout_s, in_flight, after)
        finally:
            self.in_flight = []
        for entry, mirror in back:  # the host arrays hold what the device copies hold
            entry.dirty = False
            self._landed(entry, mirror)
        if back:
            self._written = [e for e in self._written if e.dirty]
        words = got[0]
        if not words[:, 0].any():
            return None
        for k in range(len(launches)):
            if words[k, 0]:
                launch = launches[k]
                error = _access_error(launch.ck, launch.views, launch.bindings, words[k])
                for j in range(k, len(launches)):  # cleared: the next run starts with no fault
                    if words[j, 0]:
                        records.clear(queue, j, words[j])
                return first + k, error
        return None

    def _copy_in(self, e: DeviceBuffer) -> None:
        """Bring the host's bytes of ``e`` to its device copy, before the kernels enqueued after (the queue is in
        order). A buffer of at most ``SNAPSHOT_BYTES`` keeps a host copy of what its device copy holds
        (``snapshot``): when the host has not changed the bytes since, nothing is copied (a compare of a few KiB in
        memory costs less than a copy to a GPU, about 10 us each on NVIDIA's)."""
        storage, snapshot = e.storage, e.snapshot
        if snapshot is not None and np.array_equal(storage, snapshot):
            return
        self.cl.enqueue_copy(self.queue, e.buf, storage, is_blocking=False)
        if storage.nbytes <= SNAPSHOT_BYTES:
            if snapshot is None:
                e.snapshot = storage.copy()
            else:
                np.copyto(snapshot, storage)

    def _rebind(self, launch: Launch) -> None:
        """Point a kept launch at the current device buffers of its storages (one of its entries was dropped)."""
        uses = []
        for k, ((e, writable), b) in enumerate(zip(launch.uses, launch.ck.info.bindings)):
            if e.buf is None:
                e = self._device_buffer(launch.bindings[b.arg.index][0])
            uses.append((e, writable))
            launch.args[k] = e.buf  # the buffers come first, in the order of the bindings
        launch.uses = uses
        if launch.own:
            launch.kernel.set_args(*launch.args)

    def _device_buffer(self, storage: np.ndarray) -> DeviceBuffer:
        """The OpenCL buffer of ``storage``, made once per storage array: where the device works in host memory
        (PoCL's CPU device) a ``USE_HOST_PTR`` buffer over the array itself, nothing copied; elsewhere a buffer of
        the device's own, copied in at its first use after each sync (``run_batch``)."""
        cl = self.cl
        key = _storage_key(storage, self._buffers)
        e = self._buffers.get(key)
        if e is None:
            in_place = self.in_host_memory and storage.flags.writeable
            flags = cl.mem_flags.READ_WRITE | (cl.mem_flags.USE_HOST_PTR if in_place else 0)
            buf = cl.Buffer(self.context, flags, size=0 if in_place else storage.nbytes,
                            hostbuf=storage if in_place else None)
            e = self._buffers[key] = DeviceBuffer(buf, storage, in_place)
        return e

    def _block(self, block: np.ndarray) -> Any:
        """A read-only device buffer holding ``block``, one per distinct content (at most 4096 kept)."""
        data = block.tobytes()
        buf = self._blocks.get(data)
        if buf is None:
            if len(self._blocks) >= 4096:
                self._blocks.clear()
            cl = self.cl
            buf = self._blocks[data] = cl.Buffer(self.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                                                 hostbuf=block)
        return buf

    def _wait(self, event: Any, timeout_s: float, in_flight: list[tuple[Launch, Any]],
              after: Any = None) -> None:
        """Wait for ``event`` (the batch's last kernel), then for what ``after()`` enqueues once it completed (the
        event it returns), through the ``EventWaiter``: no sleeping. Past ``timeout_s`` in which no kernel of the
        batch completed (``running``: a kernel running that long, not the batch in all) mark the runner stuck
        (keeping the memory the kernels use alive: OpenCL cannot stop them) and raise ``WaitTimeoutError`` naming
        the first launch of the batch that has not completed."""
        try:
            # the batch was just enqueued: its first launch runs (or has run: the first look then sees progress)
            done = self._waiter.wait(event, timeout_s, self.spin_s, after, progress=self.running,
                                     start=self.checking if self.checking is not None else 0)
        except self.cl.Error as e:
            raise RuntimeError(f"OpenCL failed to run {in_flight[0][0].what} (or a launch after it): {e}") from None
        if done:
            return
        what = next((launch.what for launch, ev in in_flight if not _completed(self.cl, ev)), in_flight[-1][0].what)
        self._stuck = what
        self._stuck_refs.append((in_flight, list(self._buffers.values())))
        raise WaitTimeoutError(f"{what} did not finish within {timeout_s} s")

    def running(self) -> int | None:
        """The position in the batch enqueued now of its first launch not completed (None: no batch runs). In
        checked mode, the launch being checked on Oclgrind or run after its check (``checking``)."""
        if self.checking is not None:
            return self.checking
        in_flight = self.in_flight
        for k, (_, ev) in enumerate(in_flight):
            if not _completed(self.cl, ev):
                return k
        return None


def _completed(cl: Any, event: Any) -> bool:
    try:
        return bool(event.command_execution_status == cl.command_execution_status.COMPLETE)
    except cl.Error:
        return True  # failed: not running


class _Held:
    interrupted = False


@contextlib.contextmanager
def _interrupts_held() -> Iterator[_Held]:
    """Ctrl-C held off while an OpenCL program builds: SIGINT is blocked in this thread, and so in the compiler's
    child processes, which inherit the mask, and on the main thread Python's handler only records it (the yielded
    object's ``interrupted``), so the caller raises KeyboardInterrupt once the build is done. A Ctrl-C used to reach
    PoCL's linker mid-build and abort the whole process (SIGABRT: no exit line, no JSON)."""
    held = _Held()
    on_main = threading.current_thread() is threading.main_thread()
    previous: Any = None
    if on_main:
        def record(signum: int, frame: Any) -> None:
            held.interrupted = True
        previous = signal.signal(signal.SIGINT, record)
    mask = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if mask else None
    try:
        yield held
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a pending SIGINT is delivered now, to ``record``
        if on_main:
            signal.signal(signal.SIGINT, previous)


def _storage_key(storage: np.ndarray, known: dict[int, DeviceBuffer]) -> int:
    """The key of the OpenCL buffer for ``storage``: arrays over the same memory share one (views alias as in
    Metal); ``ValueError`` for two storages that overlap without being the same memory."""
    addr = _address(storage)
    same = known.get(addr)
    if same is not None and same.storage.nbytes == storage.nbytes:
        return addr
    for e in known.values():
        if np.may_share_memory(storage, e.storage):
            raise ValueError("two bound storages overlap without being the same array: bind one MTLBuffer's "
                             "memory as one storage array")
    return addr


def _address(array: np.ndarray) -> int:
    """The address of an array's first byte (``__array_interface__``: cheaper than ``ndarray.ctypes``)."""
    return int(array.__array_interface__["data"][0])
