"""A dispatch prepared once for the runner's OpenCL device (``Launch``), the fault records of a batch of launches
(``FaultRecords``) and the device copy of one storage array (``DeviceBuffer``).

A ``Launch`` is what ``CompiledKernel.prepare`` makes after checking a dispatch's bindings and sizes: the OpenCL
kernel arguments (the device buffers, the argument block, the SIMD-group scratch) and sizes, ready to enqueue. The
simulated GPU keeps one per ICB command (``objects.ICBSlot``) and reuses it every submit; ``KernelRunner.run_batch``
enqueues a batch of them at once and waits once. Each launch of a batch writes its own fault record (a slot of
``FaultRecords``), so the dispatch that faulted is known after the one wait.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mtlir.runtime.sim.msl.guard.bound import FAULT_WORDS, SCRATCH_BYTES

if TYPE_CHECKING:
    from mtlir.errors import KernelAccessError
    from mtlir.runtime.sim.kernels.compiled import CompiledKernel, View

__all__ = ["Launch", "InFlight", "FaultRecords", "DeviceBuffer", "MAX_BATCH", "RECORD_BYTES"]

# launches enqueued before one wait: each has its own fault record and scratch (64 KiB + 64 bytes; the slots' OpenCL
# sub-buffers are made at their first use). A wait per batch is a round trip to the device (on the H200: the kernels'
# completion seen, then the fault records read back): 256 takes a 200-dispatch command buffer in one.
MAX_BATCH = 256
RECORD_BYTES = FAULT_WORDS * 4  # the fault record's words before the scratch area (``guard.bound``)


class DeviceBuffer:
    """One storage array's OpenCL buffer: ``in_place`` (a ``USE_HOST_PTR`` buffer the device works in directly),
    ``current`` (its bytes are the host's: copied in, or in place, since the last sync), ``dirty`` (a kernel may
    have written it since), ``used`` (the runner's sync count at its last use), ``snapshot`` (a small device copy's
    bytes, kept on the host to tell whether the host changed the buffer since: ``KernelRunner._copy_in``). ``buf`` is None once the runner
    dropped it (unused for a while): a launch that still holds it asks for a new one."""

    __slots__ = ("buf", "storage", "in_place", "current", "dirty", "used", "snapshot")

    def __init__(self, buf: Any, storage: np.ndarray, in_place: bool) -> None:
        self.buf: Any = buf
        self.storage, self.in_place = storage, in_place
        self.current = self.dirty = False
        self.used = 0
        self.snapshot: np.ndarray | None = None  # a small device copy's bytes as the host last saw them


class Launch:
    """One dispatch ready to enqueue: ``ck`` (the kernel), ``views`` and ``bindings`` (as checked: the fault record
    names the parameter through them), ``global_size`` and ``local_size`` (OpenCL's, threads), ``uses`` (per
    binding its ``DeviceBuffer`` and whether the kernel may write it), ``args`` (the OpenCL arguments, the fault
    record last but the SIMD scratch), ``kernel`` (its own OpenCL kernel object with ``args`` set, for a launch
    kept and reused, else the compiled kernel's shared one, whose arguments are set at every enqueue) and
    ``record`` (the fault record slot its arguments name now; -1: none yet)."""

    __slots__ = ("ck", "views", "bindings", "global_size", "local_size", "uses", "args", "kernel", "own", "record",
                 "fault_arg")

    def __init__(self, ck: CompiledKernel, views: tuple[View, ...], bindings: dict[int, tuple[np.ndarray, int]],
                 global_size: tuple[int, ...], local_size: tuple[int, int, int], uses: list[tuple[DeviceBuffer, bool]],
                 args: list[Any], kernel: Any, own: bool) -> None:
        self.ck, self.views, self.bindings = ck, views, bindings
        self.global_size, self.local_size = global_size, local_size
        self.uses, self.args, self.kernel, self.own = uses, args, kernel, own
        self.fault_arg = len(ck.info.bindings) + 1  # after the buffers and the argument block
        self.record = -1

    @property
    def what(self) -> str:
        """The launch as errors name it: kernel, global size, threadgroup."""
        return f"kernel {self.ck.function!r}, global size {self.global_size}, threadgroup {self.local_size}"


class InFlight:
    """A batch of launches enqueued and not yet waited for (``KernelRunner.start``, ``_enqueue``): its ``launches``,
    ``first`` (the position of its first launch in the whole run, for the fault's position), ``events`` (per launch
    its kernel's OpenCL event), ``back`` (the buffers to copy back once the kernels completed, with their page-locked
    mirrors) and ``timeout_s``; once waited for, ``fault`` (the first fault: position, error; None) or ``error``
    (the exception the wait raised, kept for ``KernelRunner.finish``)."""

    __slots__ = ("launches", "first", "events", "back", "timeout_s", "fault", "error")

    def __init__(self, launches: Sequence[Launch], first: int, events: list[tuple[Launch, Any]],
                 back: list[tuple[DeviceBuffer, np.ndarray | None]]) -> None:
        self.launches, self.first, self.events, self.back = launches, first, events, back
        self.timeout_s = 0.0
        self.fault: tuple[int, KernelAccessError] | None = None
        self.error: Exception | None = None


class SubBuffers:
    """The ``MAX_BATCH`` slots of a ``FaultRecords`` buffer as OpenCL sub-buffers of ``stride`` bytes each, slot
    ``k`` made at its first use (``slots[k]``): a runner that never runs a long batch makes a few."""

    __slots__ = ("buf", "stride", "made")

    def __init__(self, buf: Any, stride: int) -> None:
        self.buf, self.stride = buf, stride
        self.made: list[Any] = [None] * MAX_BATCH

    def __getitem__(self, k: int) -> Any:
        sub = self.made[k]
        if sub is None:
            sub = self.made[k] = self.buf.get_sub_region(k * self.stride, self.stride)
        return sub

    def __len__(self) -> int:
        return MAX_BATCH


class FaultRecords:
    """``MAX_BATCH`` fault records, one per launch of a batch, each followed by its scratch area: one OpenCL buffer
    of ``MAX_BATCH`` slots of ``stride`` bytes (a multiple of the device's ``mem_base_addr_align``) and a
    sub-buffer per slot, the argument a launch gets. ``in_host_memory``: the buffer is the host array ``host``
    itself (``USE_HOST_PTR``); otherwise ``read`` gathers the records of a batch on the device (one rectangular
    copy into ``compact``, ``MAX_BATCH`` records back to back) and reads them back in one plain copy. A rectangular
    read straight to the host blocks the calling thread until the kernels before it end on NVIDIA's driver (seen on
    the H200: a batch's wait with a timeout then never got to time out), where a copy between buffers and a plain
    read into page-locked memory are enqueued and return."""

    def __init__(self, cl: Any, context: Any, base_align: int, in_host_memory: bool,
                 pinned: Callable[[int], np.ndarray], queue: Any) -> None:
        self.cl, self._pinned = cl, pinned
        self.stride = -(-(RECORD_BYTES + SCRATCH_BYTES) // base_align) * base_align
        self.in_host_memory = in_host_memory
        self.host = np.zeros(MAX_BATCH * self.stride, np.uint8)  # pages untouched until used (device copies: never)
        flags = cl.mem_flags.READ_WRITE
        if in_host_memory:
            self.buf = cl.Buffer(context, flags | cl.mem_flags.USE_HOST_PTR, hostbuf=self.host)
        else:  # zeroed on the device (``queue``: the runner's in-order queue, before any kernel)
            self.buf = cl.Buffer(context, flags, size=self.host.nbytes)
            cl.enqueue_fill_buffer(queue, self.buf, np.uint8(0), 0, self.host.nbytes)
        self.slots = SubBuffers(self.buf, self.stride)
        self.words = self.host.reshape(MAX_BATCH, self.stride)[:, :RECORD_BYTES].view(np.uint32)  # (slot, word)
        self._copy: np.ndarray | None = None  # where the records are read back to (device copies): pinned memory
        self.compact: Any = None if in_host_memory else cl.Buffer(context, flags, size=MAX_BATCH * RECORD_BYTES)

    def destination(self) -> np.ndarray:
        """The host array the records are read into, ``(MAX_BATCH, RECORD_BYTES)`` bytes of page-locked memory
        (``KernelRunner._pinned``: a read into it took ~55 µs on the H200 against ~85 µs into a numpy array), made
        at the first call (the runner makes it before a batch's kernels are enqueued)."""
        if self._copy is None:
            self._copy = self._pinned(MAX_BATCH * RECORD_BYTES).reshape(MAX_BATCH, RECORD_BYTES)
            self._copy[:] = 0
        return self._copy

    def read(self, queue: Any, count: int) -> tuple[np.ndarray, Any]:
        """The records of slots ``[0, count)`` as a ``(count, FAULT_WORDS)`` uint32 array, and the event to wait
        for before reading it (None: in host memory, current once the kernels completed)."""
        if self.in_host_memory:
            return self.words[:count], None
        cl, out = self.cl, self.destination()[:count]
        cl.enqueue_copy(queue, self.compact, self.buf, src_origin=(0, 0), dst_origin=(0, 0),
                        region=(RECORD_BYTES, count), src_pitches=(self.stride,), dst_pitches=(RECORD_BYTES,))
        event = cl.enqueue_copy(queue, out, self.compact, is_blocking=False)  # out: count records back to back
        return out.view(np.uint32), event

    def clear(self, queue: Any, slot: int, words: np.ndarray) -> None:
        """Zero the record of ``slot`` after a fault (``words``: the record as ``read`` gave it)."""
        words[:4] = 0
        if not self.in_host_memory:
            self.cl.enqueue_copy(queue, self.slots[slot], np.zeros(RECORD_BYTES, np.uint8), is_blocking=True)
