"""A commit starts its kernels (docs/simulator.md, "Who runs the GPU"): a host thread committing to an idle, lazy GPU
runs the command buffer's first operations itself, up to its first batch of kernels, which it enqueues and leaves
running (``GPU._may_start``, the executor's ``KERNELS_IN_FLIGHT``); the wait finds them running or done. It never
runs a kernel to its end inside the commit (``WOULD_BLOCK``), the lazy policy's batch time leaves out the host's
work in between, results are those of a GPU that did not start early, and closing the device waits for kernels so
started (they work in host memory)."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from progbuild import submit_program

from mtlir.metal import MTL
from mtlir.program.program import Program
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.gpu import GPU
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.objects import CommandBuffer


@pytest.fixture(scope="module")
def program() -> Iterator[Program]:
    yield submit_program("x86_64", kernels=2, family="Apple7")


class _Calls:
    """What the device's kernel runner was asked, with ``gpu.starting`` and the thread at each call."""

    def __init__(self, dev: SimDevice, runner: KernelRunner, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, bool, str]] = []
        for name in ("start", "finish", "run_batch"):
            def call(*args: Any, _name: str = name, _orig: Any = getattr(runner, name), **kw: Any) -> Any:
                self.calls.append((_name, dev.gpu.starting, threading.current_thread().name))
                return _orig(*args, **kw)
            monkeypatch.setattr(runner, name, call)


def _warm(dev: SimDevice, s: Session, n: int) -> KernelRunner:
    """Two submits of ``n`` (the second replays the ICB range kept by the first), and the worker napping: the
    device's kernel runner."""
    for _ in range(2):
        s.submit(n=n)
        s.wait()
    time.sleep(0.02)
    dev.gpu.batch_s = 0.0  # (the first runs' one-time costs forgotten: short kernels, a lazy GPU)
    assert dev.gpu.lazy and dev.gpu.thread is not None
    runner = dev._runner
    assert type(runner) is KernelRunner
    return runner


def test_a_commit_to_an_idle_gpu_leaves_its_kernels_running(program: Program, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = SimDevice("x86_64", family="Apple7", kernel_timeout_s=5.0)
    with dev, Session(program, dev, timeout_s=5.0) as s:
        runner = _warm(dev, s, 8)
        calls = _Calls(dev, runner, monkeypatch).calls
        sub = s.submit(n=8)
        me = threading.current_thread().name
        # the commit enqueued the batch on this thread and returned without waiting for it
        assert calls == [("start", True, me)] and runner._started is not None
        s.wait()
        assert calls == [("start", True, me), ("finish", False, me)] and runner._started is None
        assert sub.gpu_ns is not None and sub.gpu_ns >= 0
        got = s.read("buffer:0"), s.read("buffer:1")
    ref = SimDevice("x86_64", family="Apple7", kernel_timeout_s=5.0)
    monkeypatch.setattr(GPU, "_may_start", lambda self, driving=0: False)
    with ref, Session(program, ref, timeout_s=5.0) as s:
        _warm(ref, s, 8)
        s.submit(n=8)
        s.wait()
        assert (s.read("buffer:0"), s.read("buffer:1")) == got


def test_a_commit_never_waits_for_kernels(program: Program, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range that changed (another ``n``) goes through the full checks, which wait for its kernels: the commit's
    start stops before it, and the wait runs it."""
    dev = SimDevice("x86_64", family="Apple7", kernel_timeout_s=5.0)
    with dev, Session(program, dev, timeout_s=5.0) as s:
        runner = _warm(dev, s, 8)
        calls = _Calls(dev, runner, monkeypatch).calls
        (handle,) = s.submit(n=13).cbs
        assert calls == [] and runner._started is None
        assert dev.blocked_on(handle) is None  # started and stopped before the range, not blocked on a gate
        s.wait()
        assert calls and all(not starting for _, starting, _ in calls)
        assert {name for name, _, _ in calls} == {"run_batch"}


def test_the_lazy_policy_times_a_started_batch_without_the_hosts_work(program: Program) -> None:
    dev = SimDevice("x86_64", family="Apple7", kernel_timeout_s=5.0, overlap_s=0.05)
    with dev, Session(program, dev, timeout_s=5.0) as s:
        _warm(dev, s, 8)
        for _ in range(6):
            s.submit(n=8)
            time.sleep(0.06)  # the host's own work while the kernels run: longer than overlap_s
            s.wait()
        assert dev.gpu.batch_s < 0.05 and dev.gpu.lazy


def test_closing_the_device_waits_for_kernels_started_at_a_commit(program: Program) -> None:
    dev = SimDevice("x86_64", family="Apple7", kernel_timeout_s=5.0)
    with Session(program, dev, timeout_s=5.0) as s:
        runner = _warm(dev, s, 8)
        s.submit(n=8)
        assert runner._started is not None
        dev.close()
        assert runner._started is None and runner.stuck is None


def test_a_wait_starts_the_next_command_buffer_before_it_returns(program: Program) -> None:
    """A pipelining host (two Sessions committed in a row, then a wait for the first): the wait runs the first and
    starts the second up to its kernels, which run while the host goes on; the second's wait takes them."""
    dev = SimDevice("x86_64", family="Apple7", kernel_timeout_s=5.0)
    with dev, Session(program, dev, timeout_s=5.0) as a, Session(program, dev, timeout_s=5.0) as b:
        _warm(dev, a, 8)
        runner = _warm(dev, b, 8)
        first = a.submit(n=8)  # started at its commit
        second = b.submit(n=8)  # behind it: left to the next wait
        assert dev.gpu.unwoken
        a.wait()
        assert runner._started is not None and runner._started is not first  # the second's batch, running
        (handle,) = second.cbs
        assert dev.blocked_on(handle) is None
        b.wait()
        assert runner._started is None and b.read("buffer:0") == a.read("buffer:0")


def test_one_slow_batch_does_not_end_the_lazy_gpu() -> None:
    """``lazy`` reads the median of the recent batches: a burst of load that slows one batch leaves it lazy; a run
    of long batches (kernels worth overlapping) ends it."""
    with SimDevice("x86_64", overlap_s=0.001) as dev:
        gpu = dev.gpu
        for _ in range(8):
            gpu.kernels_ran(0.0001)
        gpu.kernels_ran(1.0)
        assert gpu.lazy and gpu.batch_s == pytest.approx(0.0001)
        for _ in range(4):
            gpu.kernels_ran(0.01)
        assert not gpu.lazy and gpu.batch_s == pytest.approx(0.01)
        gpu.batch_s = 0.0  # as if every recent batch had been that long
        gpu.kernels_ran(1.0)
        assert gpu.lazy


def test_a_seeded_order_is_left_to_the_scheduler(program: Program) -> None:
    """With ``order_seed`` nothing starts at a commit: the shuffled order of the scheduler's steps alone decides."""
    dev = SimDevice("x86_64", family="Apple7", kernel_timeout_s=5.0, order_seed=3)
    with dev, Session(program, dev, timeout_s=5.0) as s:
        _warm(dev, s, 8)
        (handle,) = s.submit(n=8).cbs
        cb = dev.object(handle)
        assert isinstance(cb, CommandBuffer) and cb.status == MTL.StatusCommitted
        s.wait()
        assert cb.status == MTL.StatusCompleted
