"""``no_hang(seconds)``: a bound on one call of a parser under fuzzing (issue 13: "never a hang"). A call still
running after ``seconds`` (far above what any input should cost) fails the test with ``AssertionError`` naming
the bound, through SIGALRM on the main thread (where pytest runs the tests); elsewhere, or without SIGALRM, it does
nothing."""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def no_hang(seconds: float = 30.0, what: str = "the call") -> Iterator[None]:
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: FrameType | None) -> None:
        raise AssertionError(f"{what} ran for more than {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
