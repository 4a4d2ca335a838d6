"""The device copies of the kernels' buffers (``DeviceMemory``, the kernel runner's base): one OpenCL buffer per
storage array (one MTLBuffer's bytes), made at its first use and kept across syncs while it is used, copied in and
back where the device keeps its own copies (a GPU), worked on in place where it works in host memory (PoCL's CPU
device: ``USE_HOST_PTR``); the page-locked mirrors results come back through; ``sync`` (the runner's) brings the
results to the host arrays and marks the device copies stale (docs/kernels.md, "Memory: buffers on the device").
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from mtlir.runtime.sim.kernels.launch import DeviceBuffer, Launch

__all__ = ["DeviceMemory", "KEEP_SYNCS", "SNAPSHOT_BYTES", "MIRROR_BYTES"]

KEEP_SYNCS = 4  # a device buffer unused for this many syncs is dropped at the next sweep (a submit syncs 1-3 times)
SNAPSHOT_BYTES = 1 << 18  # device copies of buffers up to this size are copied in only when the host changed them
MIRROR_BYTES = 1 << 24  # buffers up to this size come back through a page-locked mirror (``_copy_back``)


class DeviceMemory:
    """The device copies of ``KernelRunner``'s buffers (its base class): the runner's context, queue, lock and
    bookkeeping are set by its constructor; every method here expects the runner's lock held."""

    cl: Any
    context: Any
    device: Any
    queue: Any
    in_host_memory: bool
    _lock: threading.RLock
    _stuck: str | None
    # storage address -> its OpenCL buffer, kept across syncs while it is used (``DeviceBuffer``); holding the
    # array keeps its address, the key, from being reused by another while the entry lives
    _buffers: dict[int, DeviceBuffer]
    _generation: int  # syncs so far
    # the entries made current since the last sync, and those written (device copies only, maybe twice): a
    # sync resets and copies back these, not every entry of ``_buffers`` (a tinygrad device holds hundreds)
    _current: list[DeviceBuffer]
    _written: list[DeviceBuffer]
    _dropped: int  # device buffers dropped so far (while none was, no launch needs a rebind)
    _blocks: dict[bytes, Any]  # argument blocks by content: most dispatches repeat one
    _mirrors: dict[DeviceBuffer, np.ndarray]  # page-locked host copies results come back through
    _map_queue: Any  # the queue page-locked staging buffers are mapped on (``_pinned``)

    @property
    def resident(self) -> int:
        """How many buffers have a device copy that is current now (copied in, or worked in, since the last
        ``sync``)."""
        return sum(1 for e in self._buffers.values() if e.current)

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
