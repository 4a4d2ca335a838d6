"""The simulated GPU's watchdog for a kernel that runs too long: a real OpenCL kernel still running after
``kernel_timeout_s`` ends its command buffer in Error, Timeout (2), naming the kernel, as Metal's watchdog does, instead
of the host waiting its own (much longer) timeout; the kernel runner then refuses later kernels with a clear error.
The timeout is one without progress (``EventWaiter.wait``'s ``progress``): a batch of kernels that each end in time is
not cut short."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

import mtlir
from mtlir.errors import GPUExecutionError
from mtlir.metal import MTL
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.kernels.waiter import EventWaiter

MLP = Path(__file__).resolve().parents[4] / "examples" / "traces" / "mlp.apple7.json"
ANCHOR = "int alu0 = (lidx1+(gidx0<<1)+(lidx0*10));\\n"
# one thread of E_5_8_2 runs a long dependent chain (about half a second on a CPU): far past a 0.05 s watchdog,
# yet it ends, so the test leaves no CPU busy behind it
SPIN = ("  if (alu0 == 0) { float acc = 0.0f; for (int i = 0; i < 300000000; i++) { acc = acc * 0.999f + "
        "(*(data1_80+(i&7))); } if (acc == 12345.0f) { *(data0_80+1) = acc; } }\\n")


def test_a_kernel_running_past_kernel_timeout_s_ends_its_command_buffer_with_timeout(tmp_path: Path) -> None:
    text = MLP.read_text()
    assert ANCHOR in text
    path = tmp_path / "spin.json"
    path.write_text(text.replace(ANCHOR, ANCHOR + SPIN, 1))
    trace = mtlir.load_trace(str(path))
    program = mtlir.lower(trace.queue(mtlir.DeviceSpec("Apple7")), target="x86_64").program
    dev = SimDevice(family="Apple7", kernel_timeout_s=0.05)
    s = Session(program, dev, initial=trace.initial_data(), timeout_s=60.0)
    with dev, s:
        s.submit()
        with pytest.raises(GPUExecutionError, match=r"GPU watchdog: kernel 'E_5_8_2'.* did not finish within 0\.05 s "
                                                    r"\(kernel_timeout_s\).*cannot stop it") as info:
            s.wait()  # not the session's 60 s: the watchdog ends the command buffer
        assert info.value.code == MTL.ErrorTimeout
        assert dev.kernel_running  # the kernel may still run: a program ending now must not wait for its queue
        s.submit()  # the OpenCL queue is still busy with that kernel: later kernels fail at once, saying why
        with pytest.raises(GPUExecutionError, match="blocked by an earlier kernel that never finished"):
            s.wait()


class _Event:
    """An OpenCL event stand-in that completes when the test says (``finish``)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.command_execution_status = 1  # CL_SUBMITTED: not complete

    def wait(self) -> None:
        assert self.done.wait(10.0)


def test_the_timeout_with_progress_is_one_without_progress() -> None:
    w = EventWaiter()
    ev, marks = _Event(), iter(range(10**6))
    # progress every read: the 0.02 s timeout never passes without progress; the event completes after 0.2 s
    threading.Timer(0.2, ev.done.set).start()
    assert w.wait(ev, 0.02, progress=lambda: next(marks))
    stuck = _Event()
    assert not w.wait(stuck, 0.02, progress=lambda: 0)  # no progress: it times out
    stuck.done.set()


def test_a_known_start_is_not_asked_of_progress() -> None:
    """``start`` is what ``progress()`` would give as the wait begins (the runner: its batch's first launch): a
    batch that ends before the first look never asks (a status query of a running event costs CPU on PoCL); a
    kernel stuck at the start still times out, and progress past it still starts the timeout again."""
    w = EventWaiter()
    asked: list[int] = []

    def progress() -> int:
        asked.append(1)
        return 0
    quick = _Event()
    quick.done.set()
    assert w.wait(quick, 5.0, progress=progress, start=0) and asked == []
    stuck = _Event()
    assert not w.wait(stuck, 0.02, progress=progress, start=0) and asked  # looked, saw no progress, timed out
    stuck.done.set()
    ev, marks = _Event(), iter(range(1, 10**6))
    threading.Timer(0.2, ev.done.set).start()
    assert w.wait(ev, 0.02, progress=lambda: next(marks), start=0)  # progress at every look: never cut short
