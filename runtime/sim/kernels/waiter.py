"""Waiting for an OpenCL event with a timeout (``EventWaiter``): ``clWaitForEvents`` has none, so a helper thread
blocks in it while the caller waits on a lock with its timeout. No polling, no sleeping: the caller wakes when the
event completes (one thread hand-off each way, about 20 µs here), and a kernel that never ends still lets the caller
go after the timeout (the helper thread stays blocked in OpenCL: a daemon, it does not keep the process alive).
"""
from __future__ import annotations

import queue
import threading
from typing import Any

__all__ = ["EventWaiter"]


class EventWaiter:
    """One helper thread (started at the first wait) that waits for the events handed to it, in order."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Any, threading.Lock, list[BaseException]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def wait(self, event: Any, timeout_s: float) -> bool:
        """Wait until ``event`` (a ``pyopencl.Event``) completes: True; False when ``timeout_s`` seconds passed
        first (the helper thread goes on waiting for it; later waits queue behind it). Raises what the event's
        wait raised (``pyopencl.Error``: the command failed)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="mtlir-sim-opencl-wait", daemon=True)
            self._thread.start()
        done = threading.Lock()
        done.acquire()
        failed: list[BaseException] = []
        self._work.put((event, done, failed))
        if not done.acquire(timeout=max(timeout_s, 0.0)):
            return False
        if failed:
            raise failed[0]
        return True

    def _run(self) -> None:
        while True:
            event, done, failed = self._work.get()
            try:
                event.wait()
            except BaseException as e:  # handed to the caller, who raises it
                failed.append(e)
            finally:
                done.release()
