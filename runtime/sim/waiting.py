"""How a host thread waits for the simulated GPU (``DeviceWaits``, a base class of ``SimDevice``): a Metal call that
blocks with the device lock held (``wait_for``: ``waitUntilCompleted``, a full queue's ``commandBuffer``), and a
wait for command buffers to end (``wait_command_buffers``, what ``Session.wait`` uses), where the waiting thread may
run the GPU's steps itself instead of blocking (``GPU.drive``; docs/simulator.md, "Who runs the GPU"); and what a
waited-for command buffer is doing, which a Session's errors name (``running_kernel``, ``blocked_on``, ``queue_of``:
real Metal cannot tell)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from mtlir.errors import DeviceClosedError
from mtlir.metal import MTL
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.objects import CommandBuffer, SimObject, clock

if TYPE_CHECKING:
    from mtlir.runtime.sim.gpu import GPU

__all__ = ["DeviceWaits", "notify_waiters"]


def notify_waiters(cv: threading.Condition) -> None:
    """``cv.notify_all()`` (the device lock held), skipped when no thread waits on ``cv``: the GPU notifies at every
    encoder's end, event signal and command buffer end, and most of those find nobody waiting (a host that runs
    the steps it waits for, ``GPU.drive``, waits on nothing meanwhile), where ``Condition.notify_all`` still costs
    a few Python calls (its ownership check and a copy of the waiter list). The waiter list is CPython's
    ``threading.Condition._waiters`` (a waiter joins it before it lets go of the lock, so a check made with the
    lock held sees it); where there is none, it notifies."""
    if getattr(cv, "_waiters", True):
        cv.notify_all()


class DeviceWaits:
    """The waits of ``SimDevice``. Each says whether it expects the device lock held."""

    # provided by SimDevice
    _lock: threading.Lock
    _cv: threading.Condition
    _objects: dict[int, SimObject]
    _runner: Any
    gpu: GPU
    autorun: bool
    checked: bool
    closed: bool
    kernel_timeout_s: float
    _closed_error: Callable[..., DeviceClosedError]

    def wait_for(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Wait (lock held) until ``ready()`` or ``timeout_s`` seconds pass; True when ready. The worker thread is
        woken first for work a commit left to it (``GPU.wake``)."""
        self.gpu.wake()
        deadline = clock() + timeout_s
        while not ready():
            left = deadline - clock()
            if left <= 0:
                return False
            self._cv.wait(min(left, 0.05))
        return True

    def wait_command_buffers(self, handles: Iterable[int], timeout_s: float) -> bool:
        """Block the calling host thread (it takes the lock itself) until every command buffer in ``handles`` has
        ended (status Completed or Error) or ``timeout_s`` seconds pass: True when they all ended. The GPU thread
        sets an event per command buffer waited for when it ends, so the caller wakes once, without polling
        (``Session.wait`` uses it on a SimDevice; real Metal's equivalent is ``waitUntilCompleted``, METAL.md §1).
        A handle that is not a live command buffer counts as ended: the caller's next message names the problem.
        Nothing is sent or checked: it only waits. Raises ``DeviceClosedError`` on a closed device (nothing there
        would ever end).

        Where it may (``_may_drive``: a ``timeout_s`` of at least ``kernel_timeout_s``, so the kernel watchdog
        ends a kernel that would keep it before the deadline), the calling thread runs the GPU's steps itself
        instead of blocking (``GPU.drive``): no thread hand-off at the commit nor at the end. Else the worker
        thread runs them and this thread blocks."""
        if self.closed:
            raise self._closed_error("wait_command_buffers")
        deadline = clock() + timeout_s
        with self._lock:
            objects = self._objects
            targets: list[CommandBuffer] = []
            for h in handles:
                obj = objects.get(h) if type(h) is int else None
                if isinstance(obj, CommandBuffer) and obj.status < MTL.StatusCompleted:
                    targets.append(obj)
            if not targets:
                return True
            self.gpu.waited(targets)
            if self._may_drive(timeout_s):
                ended = self.gpu.drive(targets, deadline)
                if ended is not None:
                    return ended
            self.gpu.wake()
            events = [self.gpu.end_waiters.setdefault(cb, threading.Event()) for cb in targets]
        for ev in events:  # set by ``GPU._finish`` (the lock is not held here: the GPU thread runs meanwhile)
            if not ev.wait(max(0.0, deadline - clock())):
                return False
        return True

    def _may_drive(self, timeout_s: float) -> bool:
        """Whether a host thread waiting ``timeout_s`` seconds for command buffers runs the GPU's steps itself
        (``GPU.drive``): with autorun, while the worker thread naps (a worker at work, a pipelining host's, goes on
        with it: a host taking turns with it costs both more hand-offs) or while the GPU is ``lazy`` (short kernels:
        the host runs what the worker is not running at the moment), when the wait is at least the kernel watchdog
        (``kernel_timeout_s``: a step is not cut short, and a kernel that does not end is ended by the watchdog
        within it; a batch of kernels that each end in time can still take this thread past the deadline, by at
        most that batch), and only on the OpenCL kernel runner without Oclgrind's checks and with no fault armed
        (a test's kernel runner may block on the host; checked and injected runs keep the worker's timing)."""
        runner = self._runner
        gpu = self.gpu
        worker = gpu.thread
        return (self.autorun and (gpu.napping or gpu.lazy) and timeout_s >= self.kernel_timeout_s and not self.checked
                and (runner is None or type(runner) is KernelRunner) and gpu.injected_fault is None
                and not gpu.faulty and (worker is None or worker.ident != threading.get_ident()))

    # ---- what a waited-for command buffer is doing (a Session names it in a timeout or a GPU error)

    @property
    def running_kernel(self) -> tuple[str, str, int] | None:
        """The kernel running on the simulated GPU now: (its function's name, the dispatch, e.g. ``ICB command 0 of
        MTLIndirectCommandBuffer 0x... (k)``, the handle of its command buffer); None when none runs. A Session
        names it when a wait times out (real Metal cannot tell which kernel runs)."""
        return self.gpu.running

    def queue_of(self, handle: int) -> int | None:
        """The handle of the command queue that made the command buffer ``handle`` (None: not a live command buffer
        of this device). A Session names the queue of a failed or pending command buffer with it."""
        with self._lock:
            cb = self._objects.get(handle)
            return cb.queue.handle if isinstance(cb, CommandBuffer) else None

    def blocked_on(self, handle: int) -> str | None:
        """What the command buffer ``handle`` waits for on the simulated GPU now (``the updateFence: of ...``,
        ``MTLSharedEvent ... to reach 3 (encodeWaitForEvent:value:)``); None when it is not waiting (or not a
        command buffer of this device). A Session names it when a wait times out (real Metal cannot tell)."""
        with self._lock:
            cb = self._objects.get(handle)
            gate = getattr(cb, "gate", None) if isinstance(cb, CommandBuffer) else None
            return None if gate is None else str(gate.what)
