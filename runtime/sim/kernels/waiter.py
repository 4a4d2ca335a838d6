"""Waiting for an OpenCL event with a timeout (``EventWaiter``): ``clWaitForEvents`` has none, so a helper thread
blocks in it while the caller waits on a lock with its timeout. No polling, no sleeping: the caller wakes when the
event completes (one thread hand-off each way, about 20 µs here), and a kernel that never ends still lets the caller
go after the timeout (the helper thread stays blocked in OpenCL: a daemon, it does not keep the process alive).
On a GPU the caller may first watch the event's status itself for ``spin_s`` seconds (``clGetEventInfo``, no
sleep): a batch of short kernels completes within that, and the two hand-offs (~40 µs each on the H200's host) are
saved; a longer batch goes on to the helper thread. A wait given ``progress`` times out only when that long passes
without progress (the simulated GPU's watchdog: one kernel running past ``gpu_timeout_s``, not a long batch).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["EventWaiter"]


class EventWaiter:
    """One helper thread (started at the first wait beyond the spin) that waits for the events handed to it, in
    order."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Any, Callable[[], Any] | None, threading.Lock, list[BaseException]]] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def wait(self, event: Any, timeout_s: float, spin_s: float = 0.0, then: Callable[[], Any] | None = None,
             progress: Callable[[], object] | None = None, start: object = None) -> bool:
        """Wait until ``event`` (a ``pyopencl.Event``) completes, then call ``then()`` (None: nothing) and wait for
        the event it returns (None: none): True; False when ``timeout_s`` seconds passed first (the helper thread
        goes on waiting, and calls ``then`` when the event completes; later waits queue behind it). ``spin_s``
        (seconds, 0: none): watch the events' status on the calling thread that long first (only where the device
        is not the CPU the watching would take time from). ``progress`` (None: none): the timeout is then one
        without progress, not in all: ``progress()`` (e.g. the position of the kernel running in a batch) is read
        every quarter of ``timeout_s``, and a new value starts the ``timeout_s`` again, so a batch of kernels that
        each end in time is never cut short, and one kernel running ``timeout_s`` (to within a quarter of it) is.
        ``start`` (None: asked of ``progress()`` as the wait begins): what ``progress()`` gives now, when the caller
        knows it (a batch just enqueued runs its first kernel): the call is saved (a status query of an event
        running on PoCL costs tens of µs of CPU).
        Raises what the events' waits or ``then`` raised (``pyopencl.Error``: a command failed)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        if spin_s > 0:
            end = time.perf_counter() + min(spin_s, timeout_s)
            while True:
                status = event.command_execution_status  # CL_COMPLETE is 0; an error is below 0
                if status <= 0:
                    if status < 0:
                        event.wait()  # raises the command's error
                    if then is None:
                        return True
                    event, then = then(), None
                    if event is None:
                        return True
                    continue
                if time.perf_counter() >= end:
                    break
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="mtlir-sim-opencl-wait", daemon=True)
            self._thread.start()
        done = threading.Lock()
        done.acquire()
        failed: list[BaseException] = []
        self._work.put((event, then, done, failed))
        if progress is None:
            if not done.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                return False
        else:
            mark = progress() if start is None else start
            while not done.acquire(timeout=max(min(deadline - time.monotonic(), timeout_s / 4), 0.0)):
                now, seen = time.monotonic(), progress()
                if seen != mark:
                    mark, deadline = seen, now + max(timeout_s, 0.0)
                elif now >= deadline:
                    return False
        if failed:
            raise failed[0]
        return True

    def _run(self) -> None:
        while True:
            event, then, done, failed = self._work.get()
            try:
                event.wait()
                if then is not None:
                    after = then()
                    if after is not None:
                        after.wait()
            except BaseException as e:  # handed to the caller, who raises it
                failed.append(e)
            finally:
                done.release()
