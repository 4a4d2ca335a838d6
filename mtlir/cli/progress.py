"""Progress of long runs on a terminal: a tqdm bar on stderr while ``mtlir run`` submits (``--repeat``) and a
running clock while a large queue lowers.

tqdm is imported when a bar is made, not with the command line (which starts sooner). Shown only when stderr is a terminal and the command does not print ``--json`` (``wanted``), and only for what
lasts longer than ``DELAY_S`` (a short run draws nothing); the bar is removed when it ends (``leave=False``), so the
listing and the summary read as without it.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["wanted", "submit_bar", "activity", "DELAY_S"]

DELAY_S = 0.5  # nothing is drawn for what ends sooner


def wanted(stream: TextIO, json_mode: bool) -> bool:
    """Whether to draw progress on ``stream``: a terminal (``isatty``), and not a ``--json`` command."""
    if json_mode:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a file
        return False


def submit_bar(total: int, stream: TextIO, enabled: bool) -> tqdm[Any]:
    """A bar over ``total`` submits on ``stream`` (``update(1)`` per submit); a disabled one draws nothing."""
    from tqdm import tqdm
    return tqdm(total=total, desc="submits", unit="submit", file=stream, disable=not enabled, leave=False,
                delay=DELAY_S, mininterval=0.2, dynamic_ncols=True)


@contextlib.contextmanager
def activity(desc: str, stream: TextIO, enabled: bool) -> Iterator[None]:
    """While the block runs, ``desc: 12.3s`` on ``stream``, redrawn every 0.2 s by a thread (the block itself, one
    call such as the lowering, cannot report steps); nothing when not ``enabled`` or the block ends within
    ``DELAY_S``."""
    if not enabled:
        yield
        return
    from tqdm import tqdm
    bar = tqdm(total=None, desc=desc, file=stream, leave=False, delay=DELAY_S, bar_format="{desc}: {elapsed}",
               dynamic_ncols=True)
    done = threading.Event()

    def tick() -> None:
        while not done.wait(0.2):
            bar.update(0)  # draws once DELAY_S has passed (refresh() would draw at once)
    thread = threading.Thread(target=tick, name="mtlir-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        bar.close()
