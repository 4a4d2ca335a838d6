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
``start`` enqueues a batch and returns at once, ``finish`` waits for it later (the simulated GPU starts a command
buffer's kernels at its commit; any other use of the runner meanwhile waits for the batch first).

Memory (``memory.DeviceMemory``, the runner's base): each distinct storage array (one MTLBuffer's bytes) becomes one
OpenCL buffer, made once and kept while it is used (dropped after ``KEEP_SYNCS`` to twice that many syncs without a
use: a sweep every ``KEEP_SYNCS`` syncs): where the device works in host memory (PoCL's CPU device) a
``USE_HOST_PTR`` buffer over the array itself, nothing copied or mapped; elsewhere a buffer in the device's own
memory, copied in at its first use after a sync and kept there between kernels (``resident``): a run with
``keep=True`` leaves what it wrote on the device until ``sync()`` copies it back to the host arrays and marks every
device copy stale (the next use copies in again, so what the host wrote in between is seen). A run without ``keep``
syncs at once: its results are in the arrays when it returns. A view at a byte offset is always bound as the whole
buffer with the offset passed in the kernel's offset argument (the translator adds one per buffer,
``msl.translate``), never as an OpenCL sub-buffer: a kernel whose views of one buffer overlap (an arena that holds a
kernel's inputs and output, as tinygrad's memory planner makes) would read and write overlapping sub-buffers at once,
which OpenCL leaves undefined (OpenCL 3.0 §5.2.2) and NVIDIA's driver answers by losing the writes.
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
from mtlir.runtime.sim.kernels.launch import MAX_BATCH, DeviceBuffer, FaultRecords, InFlight, Launch
from mtlir.runtime.sim.kernels.memory import KEEP_SYNCS, MIRROR_BYTES, SNAPSHOT_BYTES, DeviceMemory, _address
from mtlir.runtime.sim.kernels.stderr import _native_stderr, _pass_on
from mtlir.runtime.sim.kernels.waiter import EventWaiter
from mtlir.runtime.sim.msl.translate import Translation, translate
from mtlir.runtime.sim.msl.simd import scratch_bytes

SPIN_S = 0.002  # on a GPU the batch's wait first watches its last event this long on the calling thread (``waiter``)
_ONE_LOOK_S = 1e-9  # a "spin" this short reads an event's status once (``EventWaiter.wait``): a started batch's wait

__all__ = ["KernelRunner", "BUILD_OPTIONS", "KEEP_SYNCS", "SNAPSHOT_BYTES", "MIRROR_BYTES"]

# -cl-single-precision-constant: MSL has no double, an unsuffixed literal such as 0.5 is a float there.
# -w: no warnings (tinygrad's `if ((a==0))` draws one per kernel, which PoCL prints on stderr).
BUILD_OPTIONS = ["-cl-single-precision-constant", "-w"]


class KernelRunner(DeviceMemory):
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
        self._started: InFlight | None = None  # a batch ``start`` enqueued that nobody has waited for yet
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

    def sync(self) -> None:
        """Copy what kernels run with ``keep=True`` wrote back into the host arrays, and forget every device copy:
        the next run copies its buffers in again, so it sees what the host wrote since. Raises ``RuntimeError``
        when OpenCL refuses a copy."""
        with self._lock:
            if self._started is not None:
                self._settle()
            self._sync_locked()

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
            if self._started is not None:
                self._settle()
            self._refuse_if_stuck()
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

    def start(self, launches: Sequence[Launch], timeout_s: float, write_back: bool = False) -> InFlight:
        """Enqueue one batch (at most ``MAX_BATCH`` launches, run with ``keep``) and return at once: the kernels run
        on the OpenCL device while the caller goes on; ``finish`` waits for them and gives what ``run_batch`` gives.
        Any other use of the runner before that (``run_batch``, ``start``, ``sync``) first waits for the batch and
        keeps its outcome for ``finish``, so the runner's queue and buffers are never shared by two batches.
        ``timeout_s`` and ``write_back`` as for ``run_batch``. Raises ``ValueError`` for an empty or too long batch,
        ``RuntimeError`` when OpenCL refuses a launch or the queue is blocked by a kernel that never finished. Not
        in checked mode (``checker``: Oclgrind checks each launch first): use ``run_batch`` there."""
        if not 0 < len(launches) <= MAX_BATCH:
            raise ValueError(f"start: a batch has 1 to {MAX_BATCH} launches, got {len(launches)}")
        if self.checker is not None:
            raise RuntimeError("start: checked mode runs each launch on Oclgrind first: use run_batch")
        with self._lock:
            if self._started is not None:
                self._settle()
            self._refuse_if_stuck()
            batch = self._enqueue(launches, 0, write_back and not self.in_host_memory)
            batch.timeout_s = timeout_s
            self._started = batch
            return batch

    def finish(self, batch: InFlight) -> tuple[int, KernelAccessError] | None:
        """Wait for a batch ``start`` enqueued (unless a later use of the runner already did) and return its first
        fault, ``(position in the batch, KernelAccessError)``, None when none faulted; raises what ``run_batch``
        raises for it (``WaitTimeoutError`` past its ``timeout_s`` without progress, ``RuntimeError``)."""
        with self._lock:
            if batch is self._started:
                self._settle()
        if batch.error is not None:
            raise batch.error
        return batch.fault

    def drain(self, timeout_s: float) -> None:
        """Wait for a batch ``start`` enqueued, if any, at most ``timeout_s`` seconds without progress (its outcome
        kept for ``finish``); past that the runner is ``stuck``, as for a batch past its own timeout. The simulated
        device calls it when it closes: the batch's kernels work in host memory that must outlive them."""
        with self._lock:
            batch = self._started
            if batch is not None:
                batch.timeout_s = min(batch.timeout_s, timeout_s)
                self._settle()

    def _settle(self) -> None:
        """Wait for the batch ``start`` enqueued (the lock held) and keep its outcome on it for ``finish``."""
        batch, self._started = self._started, None
        if batch is None:
            return
        try:
            batch.fault = self._complete(batch, batch.timeout_s, look=True)
        except Exception as e:  # kept for ``finish``: the caller here goes on with its own work (or refuses it)
            batch.error = e
        except BaseException as e:  # a Ctrl-C during the wait: the batch's outcome is not known
            batch.error = RuntimeError(f"the wait for {batch.events[0][0].what} was interrupted "
                                       f"({type(e).__name__})")
            raise

    def _refuse_if_stuck(self) -> None:
        if self._stuck is not None:
            raise RuntimeError(f"the OpenCL queue is blocked by an earlier kernel that never finished "
                               f"({self._stuck}); make a new KernelRunner (a new SimDevice)")

    def _batch(self, launches: Sequence[Launch], first: int, timeout_s: float,
               write_back: bool = False) -> tuple[int, KernelAccessError] | None:
        """Enqueue ``launches`` and wait once (``_enqueue``, ``_complete``)."""
        return self._complete(self._enqueue(launches, first, write_back), timeout_s)

    def _enqueue(self, launches: Sequence[Launch], first: int, write_back: bool) -> InFlight:
        """Enqueue ``launches`` (the lock held) and flush the queue: the batch runs from now on. The copies in come
        first, all of them, before the first kernel (a buffer not current is used by no earlier launch of the batch,
        so copying it in earlier changes nothing); the transfers to the host (results for ``write_back``, the fault
        records) are enqueued only once the kernels completed (``_complete``): NVIDIA's driver blocks the thread
        that enqueues a copy between the host and the device behind running kernels (seen on the H200: ~50 ms
        behind a 50 ms kernel, pinned memory or not), which would make the wait's timeout unreachable; copies
        between buffers and kernels return at once there. Raises ``RuntimeError`` when OpenCL refuses a launch."""
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
        self.in_flight = in_flight
        return InFlight(launches, first, in_flight, back)

    def _complete(self, batch: InFlight, timeout_s: float, look: bool = False) -> tuple[int, KernelAccessError] | None:
        """Wait for a batch ``_enqueue`` enqueued (the lock held), bring its results and fault records back, and
        return its first fault (position in the whole run, error); raises what ``_wait`` raises. ``look``: a batch
        enqueued a while ago (``start``): its last event's status is read once on this thread first, and a batch
        that has completed meanwhile is taken without the waiter thread's two hand-offs."""
        cl, queue, records = self.cl, self.queue, self._records
        launches, in_flight, back = batch.launches, batch.events, batch.back
        got: list[np.ndarray] = []

        def after() -> Any:
            """Once the kernels completed: enqueue the copies back and the records' read; their last event."""
            for entry, mirror in back:
                cl.enqueue_copy(queue, entry.storage if mirror is None else mirror, entry.buf, is_blocking=False)
            words, last = records.read(queue, len(launches))
            got.append(words)
            queue.flush()
            return last

        try:
            self._wait(in_flight[-1][1], timeout_s, in_flight, after, look)
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
                return batch.first + k, error
        return None

    def _wait(self, event: Any, timeout_s: float, in_flight: list[tuple[Launch, Any]],
              after: Any = None, look: bool = False) -> None:
        """Wait for ``event`` (the batch's last kernel), then for what ``after()`` enqueues once it completed (the
        event it returns), through the ``EventWaiter``: no sleeping. Past ``timeout_s`` in which no kernel of the
        batch completed (``running``: a kernel running that long, not the batch in all) mark the runner stuck
        (keeping the memory the kernels use alive: OpenCL cannot stop them) and raise ``WaitTimeoutError`` naming
        the first launch of the batch that has not completed. ``look`` (on a CPU device, where the wait does not
        spin): read the events' status once on this thread before handing the wait to the waiter's thread."""
        try:
            # the batch was just enqueued: its first launch runs (or has run: the first look then sees progress)
            done = self._waiter.wait(event, timeout_s, self.spin_s or (_ONE_LOOK_S if look else 0.0), after,
                                     progress=self.running,
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


