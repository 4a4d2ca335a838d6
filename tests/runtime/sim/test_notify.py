"""``waiting.notify_waiters``: the GPU's notifies of the device's condition wake every thread waiting on it, and
cost nothing when none waits (most of them: a host running the steps it waits for waits on nothing)."""
from __future__ import annotations

import threading

from mtlir.runtime.sim.waiting import notify_waiters


def test_a_notify_wakes_the_threads_waiting() -> None:
    cv = threading.Condition(threading.Lock())
    woken: list[bool] = []
    ready = threading.Event()

    def waiter() -> None:
        with cv:
            ready.set()
            woken.append(cv.wait(10.0))  # True: notified, False: timed out

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for t in threads:
        ready.clear()
        t.start()
        assert ready.wait(5.0)
    with cv:  # taken once the last waiter let go of it in ``wait``: both wait now
        notify_waiters(cv)
    for t in threads:
        t.join(5.0)
    assert woken == [True, True]


def test_a_notify_with_no_waiter_does_nothing() -> None:
    cv = threading.Condition(threading.Lock())
    notify_waiters(cv)  # skipped: ``notify_all`` here would raise (the lock is not held)
    with cv:
        notify_waiters(cv)
