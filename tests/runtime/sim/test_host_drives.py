"""Which thread runs a committed command buffer on the simulated GPU (docs/simulator.md, "Who runs the GPU"): a commit
does not wake the worker thread; a host thread that waits at least the kernel watchdog runs the command buffer's steps
itself (``GPU.drive``: no thread hand-off per submit), with the same results; a shorter wait leaves them to the worker;
work nobody waits for still starts on its own, and a pipelining host's command buffers run on the worker."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from progbuild import submit_program

from mtlir.metal import MTL
from mtlir.program.program import Program
from mtlir.runtime.session import Session
from mtlir.runtime.sim import gpu as gpu_module
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.objects import CommandBuffer


def _device(kernel_timeout_s: float, **kw: float) -> tuple[SimDevice, list[tuple[int, str]]]:
    """A SimDevice whose GPU records (command buffer handle, thread name) at every step it advances, but the start
    a committing thread makes up to the command buffer's first kernels (``starting``: recorded in ``dev.starts``)."""
    dev = SimDevice("x86_64", family="Apple7", kernel_timeout_s=kernel_timeout_s, **kw)
    steps: list[tuple[int, str]] = []
    starts: list[tuple[int, str]] = []
    advance = dev.gpu._advance

    def recorded(cb: CommandBuffer, starting: bool = False) -> None:
        (starts if starting else steps).append((cb.handle, threading.current_thread().name))
        advance(cb, starting)

    dev.gpu._advance = recorded  # type: ignore[method-assign]
    dev.starts = starts  # type: ignore[attr-defined]
    return dev, steps


@pytest.fixture
def program() -> Iterator[Program]:
    yield submit_program("x86_64", kernels=2, family="Apple7")


def _status(dev: SimDevice, handle: int) -> int:
    obj = dev.object(handle)
    assert isinstance(obj, CommandBuffer)
    return obj.status


def _run(dev: SimDevice, steps: list[tuple[int, str]], program: Program, timeout_s: float) -> tuple[bytes, bytes]:
    with dev, Session(program, dev, timeout_s=timeout_s) as s:
        s.submit(n=4)  # the first commit starts the worker thread, which may take it
        s.wait()
        time.sleep(0.02)  # the worker naps
        steps.clear()
        for n in (8, 64, 13):
            s.submit(n=n)
            s.wait()
        return s.read("buffer:0"), s.read("buffer:1")


def test_a_wait_of_at_least_the_kernel_watchdog_runs_the_steps_on_the_waiting_thread(program: Program) -> None:
    dev, steps = _device(kernel_timeout_s=5.0)
    got = _run(dev, steps, program, timeout_s=5.0)
    # (the worker's nap may end between a commit and its wait and take that one: rare, so not asserted against)
    assert threading.current_thread().name in {name for _, name in steps}
    ref_dev, ref_steps = _device(kernel_timeout_s=60.0)  # a wait shorter than the watchdog: the worker runs them
    assert _run(ref_dev, ref_steps, program, timeout_s=5.0) == got
    assert ref_steps and {name for _, name in ref_steps} == {"mtlir-sim-gpu"}


def test_work_nobody_waits_for_starts_on_its_own(program: Program) -> None:
    dev, steps = _device(kernel_timeout_s=5.0)
    with dev, Session(program, dev, timeout_s=5.0) as s:
        s.submit(n=8)  # the worker thread starts here, with the first commit
        s.wait()
        time.sleep(0.02)  # it naps
        sub = s.submit(n=8)  # this commit does not wake it: its nap ends within 10 ms
        (cb,) = sub.cbs
        deadline = time.monotonic() + 5.0
        while _status(dev, cb) < MTL.StatusCompleted and time.monotonic() < deadline:
            time.sleep(0.001)  # no message, no wait: only the worker can run it
        assert _status(dev, cb) == MTL.StatusCompleted
        assert {name for h, name in steps if h == cb} == {"mtlir-sim-gpu"}
        s.wait()


def test_a_pipelining_host_leaves_its_command_buffers_to_the_worker(program: Program) -> None:
    """Kernels that run long enough to overlap (``overlap_s`` 0: any): a commit behind work in flight wakes the
    worker, and a wait while it is awake blocks instead of taking turns with it: both command buffers run on the
    worker thread."""
    dev, steps = _device(kernel_timeout_s=5.0, overlap_s=0.0)
    with dev, Session(program, dev, timeout_s=5.0) as a, Session(program, dev, timeout_s=5.0) as b:
        a.submit(n=8)
        a.wait()  # the worker thread is running from here on
        time.sleep(0.02)  # and napping
        first = a.submit(n=16)  # nothing else in flight: the worker naps on
        second = b.submit(n=16)  # behind the first: the worker is woken, for both
        a.wait()
        b.wait()
        for sub in (first, second):
            assert {name for h, name in steps if h == sub.cbs[0]} == {"mtlir-sim-gpu"}


def _pipelined(dev: SimDevice, steps: list[tuple[int, str]], program: Program,
               batch_s: float) -> tuple[set[str], bytes]:
    """Two Sessions' commits in a row (a pipelining host), the recent kernel batches said to take ``batch_s``
    seconds, then a wait for both: the threads that ran them, and the results. The worker's naps last 5 s from the
    first one on (``_START_S``): on a loaded machine a 10 ms nap could end between a commit and the wait and take
    the work, which is allowed but not what is tested here."""
    with dev, Session(program, dev, timeout_s=5.0) as a, Session(program, dev, timeout_s=5.0) as b:
        a.submit(n=8)
        a.wait()  # the worker thread is running from here on (the first batch built the kernel: a long one)
        time.sleep(0.05)  # its 10 ms nap ends with nothing to do: it naps again, for 5 s
        dev.gpu.batch_s = batch_s
        steps.clear()
        first = a.submit(n=16)
        second = b.submit(n=16)
        assert dev.gpu.lazy == (batch_s < dev.gpu.overlap_s)
        a.wait()
        b.wait()
        return {name for h, name in steps if h in (first.cbs[0], second.cbs[0])}, a.read("buffer:0")


def test_short_kernels_run_on_the_host_that_waits_long_ones_on_the_worker(program: Program,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU is ``lazy`` while its recent kernel batches ran shorter than ``overlap_s``: a pipelining host's
    commits then leave the worker asleep and its next wait runs them (no hand-off per commit); batches as long as
    ``overlap_s`` wake the worker at each commit (their kernels overlap the host's Python). Same results."""
    monkeypatch.setattr(gpu_module, "_START_S", 5.0)
    # the policy pinned by overlap_s (inf: always lazy, 0: never), so that one batch slowed by a loaded machine
    # during the wait (the running average moves by a quarter of it) cannot switch it half-way
    dev, steps = _device(kernel_timeout_s=5.0, overlap_s=float("inf"))
    threads, got = _pipelined(dev, steps, program, batch_s=0.0)
    assert threads == {threading.current_thread().name}
    dev, steps = _device(kernel_timeout_s=5.0, overlap_s=0.0)
    threads, ref = _pipelined(dev, steps, program, batch_s=1.0)
    assert threads == {"mtlir-sim-gpu"} and ref == got


def test_the_gpu_learns_how_long_its_kernel_batches_run() -> None:
    dev = SimDevice("x86_64", family="Apple7", overlap_s=0.001)
    with dev:
        assert dev.gpu.lazy  # nothing ran yet
        for _ in range(8):
            dev.gpu.kernels_ran(0.01)
        assert not dev.gpu.lazy and dev.gpu.batch_s > 0.001
        for _ in range(16):
            dev.gpu.kernels_ran(0.0001)
        assert dev.gpu.lazy


def test_overlap_s_is_seconds() -> None:
    from mtlir.errors import ArgumentError
    with SimDevice("x86_64", overlap_s=float("inf")) as dev:
        dev.gpu.kernels_ran(100.0)
        assert dev.gpu.lazy  # inf: always lazy
        dev.gpu.overlap_s = 0
        assert not dev.gpu.lazy and dev.gpu.overlap_s == 0.0
    with SimDevice("x86_64", overlap_s=np.float32(0.001)) as dev:  # numpy's numbers too
        assert dev.gpu.overlap_s == pytest.approx(0.001)
        dev.gpu.overlap_s = 10 ** 400  # beyond a float: inf
        assert dev.gpu.overlap_s == float("inf")
        dev.gpu.overlap_s = -0.0
        assert str(dev.gpu.overlap_s) == "0.0"
    for bad, error in ((-1.0, ArgumentError), (float("nan"), ArgumentError), ("0.5", TypeError), (True, TypeError),
                       (-10 ** 400, ArgumentError), (None, TypeError)):
        with pytest.raises(error, match="overlap_s"):
            SimDevice("x86_64", overlap_s=bad)  # type: ignore[arg-type]


def test_the_timeouts_are_seconds() -> None:
    """Every wait has a timeout: a SimDevice refuses one that is not a finite number of seconds >= 0, naming it."""
    from mtlir.errors import ArgumentError
    with SimDevice("x86_64", timeout_s=np.float64(2.5), gpu_timeout_s=0, kernel_timeout_s=10 ** 3) as dev:
        assert (dev.timeout_s, dev.gpu_timeout_s, dev.kernel_timeout_s) == (2.5, 0.0, 1000.0)
    for name in ("timeout_s", "gpu_timeout_s", "kernel_timeout_s"):
        for bad, error in ((-1.0, ArgumentError), (float("nan"), ArgumentError), (float("inf"), ArgumentError),
                           (10 ** 400, ArgumentError), ("5", TypeError), (True, TypeError), (None, TypeError)):
            with pytest.raises(error, match=name):
                SimDevice("x86_64", **{name: bad})  # type: ignore[arg-type]


def test_lazy_work_nobody_waits_for_still_starts_for_a_host_polling_an_event(program: Program) -> None:
    """A lazy GPU's committed work starts without any wait: a host spinning on the timeline event's value (a
    lockless getter that does not wake the worker) sees it reach the value within the worker's nap."""
    dev, steps = _device(kernel_timeout_s=5.0)
    with dev, Session(program, dev, timeout_s=5.0) as s:
        s.submit(n=8)
        s.wait()
        time.sleep(0.02)
        dev.gpu.batch_s = 0.0
        s.submit(n=8)
        sub = s.submit(n=8)  # (after a wait for the first: a Session rewrites its variables) lazy: no wake
        assert dev.gpu.unwoken and sub.value is not None
        deadline = time.monotonic() + 5.0
        while s.event_value("event") < sub.value and time.monotonic() < deadline:
            time.sleep(0.001)
        assert s.event_value("event") == sub.value
        assert {name for h, name in steps if h == sub.cbs[0]} == {"mtlir-sim-gpu"}
        s.wait()


def test_an_interrupted_step_ends_its_command_buffer_in_error(program: Program) -> None:
    """A KeyboardInterrupt inside a step a host thread runs (``drive``) loses that step: the command buffer ends in
    Error (Internal) instead of looking completed once its closed generator stops."""
    dev = SimDevice("x86_64", family="Apple7", autorun=False)
    with dev, Session(program, dev, timeout_s=5.0) as s:
        (handle,) = s.submit(n=8).cbs
        cb = dev.object(handle)
        assert isinstance(cb, CommandBuffer)

        def interrupted() -> Iterator[None]:
            raise KeyboardInterrupt
            yield

        cb.run = interrupted()
        with pytest.raises(KeyboardInterrupt):
            dev.step()
        assert cb.status == MTL.StatusError and cb.error is not None
        assert "interrupted" in cb.error.description.value
