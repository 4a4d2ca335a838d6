"""Strict mode's rule 9 check (``checks._dry_run``) runs a group of concurrent ICB commands in both orders at
``commit``, while an earlier command buffer may still be running and writing the buffers they read. Both orders
must start from one snapshot of the memory: with a snapshot per order, bytes that neither order writes differed
and two commands that only read a shared buffer were called a race (found by the fuzzing: its regression
tests/fuzz/regressions/queue-68068806.json failed 38 of 200 replays in one process, a gather of the previous command
buffer still writing the buffer two concurrent reductions read)."""
from __future__ import annotations

import numpy as np

from mtlir.metal import MTL
from mtlir.runtime.sim.kernels.pyrunner import PyKernel, PyKernelArg, PyKernelRunner
from simscene import Scene

class Writer:
    """Stands for a kernel of an earlier command buffer, still running: each time a ``copy`` runs, the real
    storage of ``target`` (once set) gains 1 in its first element."""

    def __init__(self) -> None:
        self.target: np.ndarray | None = None

    def copy(self, a: dict[int, np.ndarray], grid: tuple[int, int, int], tg: tuple[int, int, int]) -> None:
        n = grid[0] * tg[0]
        a[0][:n] = a[1][:n]
        if self.target is not None:
            self.target[0] += 1


def test_commands_that_only_read_a_buffer_being_written_are_no_race() -> None:
    writer = Writer()
    buf, const = "buffer", "constant"
    runner = PyKernelRunner([
        PyKernel("fill", (PyKernelArg("out", buf, 0), PyKernelArg("value", const, 1, "int32")), lambda a, g, t: None),
        PyKernel("add1", (PyKernelArg("data", buf, 0),), lambda a, g, t: None),
        PyKernel("copy", (PyKernelArg("dst", buf, 0), PyKernelArg("src", buf, 1)), writer.copy),
    ])
    s = Scene(strict=True, runner=runner)
    try:
        src, a, b = s.buffer(64), s.buffer(64), s.buffer(64)
        s.floats(src)[:4] = 5
        writer.target = s.floats(src)  # the real storage: the dry run's kernels see copies of it
        icb = s.icb(2)
        s.command(icb, 0, "copy", [(a, 0), (src, 0)], barrier=False)
        s.command(icb, 1, "copy", [(b, 0), (src, 0)], barrier=False)
        s.residency(src, a, b)
        cb = s.submit_icb(icb, 0, 2)  # strict: the dry run at commit; src changes between its two orders
        assert s.floats(src)[0] == 9  # the stand-in ran for both commands in both orders: src changed under them
        writer.target = None
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted
        assert (s.floats(a)[:4] == [9, 5, 5, 5]).all() and (s.floats(b)[:4] == [9, 5, 5, 5]).all()
    finally:
        s.close()
