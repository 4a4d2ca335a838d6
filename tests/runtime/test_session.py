"""The Session's waits and GPU times (issue 8): a wait returns only once the timeline has reached the value, past its
timeout it names the value and the last value signaled; a GPU time of 0.0 is "not available", durations are integer
nanoseconds, one span per command buffer. The simulated device holds the GPU (``autorun=False``, ``step``) and fails
a submit (``inject_fault``); a RecordingBridge stands in for a device reporting odd times."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from progbuild import submit_program

from mtlir.errors import DeviceError, GPUExecutionError, WaitTimeoutError
from mtlir.metal import MTL, Prototype
from mtlir.runtime.bridge.recording import RecordingBridge
from mtlir.runtime.session import Session
from mtlir.runtime.submission import GpuSpan, gpu_seconds, seconds_to_ns
from mtlir.runtime.sim.device import SimDevice

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"


def _held() -> tuple[SimDevice, Session]:
    """A session on a simulated device whose GPU runs only when the test says so."""
    prog = submit_program("x86_64", kernels=2, family="Apple7")
    dev = SimDevice("x86_64", family="Apple7", autorun=False)
    return dev, Session(prog, dev, timeout_s=5.0)


# ---- waits


def test_a_wait_for_a_value_between_two_submits_waits_for_the_later_one() -> None:
    dev, s = _held()
    with dev, s:
        s.submit(n=4, timeline=1)
        dev.run_until_idle()
        s.submit(n=4, timeline=3)  # the GPU holds it: the timeline stays at 1
        t0 = time.monotonic()
        with pytest.raises(WaitTimeoutError, match=r"timed out after 0\.2 s waiting for timeline value 2 \(the last "
                                                   r"value signaled is 1\); command buffer statuses: submit 1 "
                                                   r"\(value 3\): Committed") as e:
            s.wait(2, timeout_s=0.2)
        assert time.monotonic() - t0 >= 0.2 and s.timeline_value() == 1
        assert isinstance(e.value, DeviceError) and isinstance(e.value, TimeoutError)
        dev.run_until_idle()
        assert [r.value for r in s.wait(2, timeout_s=5.0)] == [3] and s.timeline_value() == 3
        assert s.wait(2, timeout_s=0.0) == []  # reached, nothing in flight: at once


def test_a_wait_steps_with_the_gpu_and_returns_only_once_the_value_is_signaled() -> None:
    dev, s = _held()
    with dev, s:
        s.submit(n=4, timeline=1)
        dev.run_until_idle()
        rec = s.submit(n=4, timeline=3)
        while dev.step():  # one GPU operation at a time: the wait returns exactly when the event reaches 3
            if s.timeline_value() < 3:
                with pytest.raises(WaitTimeoutError, match="waiting for timeline value 2"):
                    s.wait(2, timeout_s=0.0)
        assert s.wait(2, timeout_s=0.0) == [rec]


def test_a_value_skipped_by_a_failed_submit_is_not_reached_before_the_next_one_signals() -> None:
    dev, s = _held()
    with dev, s:
        s.submit(n=4)
        dev.run_until_idle()
        dev.inject_fault(MTL.ErrorPageFault)
        s.submit(n=4)  # value 2: its command buffer fails, Metal skips its signal (METAL.md §3 rule 6)
        dev.run_until_idle()
        with pytest.raises(GPUExecutionError, match=r"submit 1 \(timeline value 2\)"):
            s.wait(timeout_s=5.0)
        with pytest.raises(ValueError, match=r"wait\(2\): no submit will signal timeline value 2: every submit that "
                                             r"could have signaled it has ended without doing so .* the last value "
                                             r"signaled is 1"):
            s.wait(2, timeout_s=5.0)
        s.submit(n=4)  # value 3, held by the GPU
        with pytest.raises(WaitTimeoutError, match=r"waiting for timeline value 2 \(the last value signaled is 1\)"):
            s.wait(2, timeout_s=0.05)
        dev.run_until_idle()
        assert [r.value for r in s.wait(2, timeout_s=5.0)] == [3] and s.timeline_value() == 3


def test_a_wait_for_a_value_no_submit_signals_names_the_last_value_signaled() -> None:
    dev, s = _held()
    with dev, s:
        s.submit(n=4)
        dev.run_until_idle()
        s.wait(timeout_s=5.0)
        s.submit(n=4, timeline=5)  # in flight: the timeline is still at 1
        with pytest.raises(ValueError, match=r"wait\(6\): no submit signals timeline value 6: the highest timeline "
                                             r"value submitted is 5, and the last value signaled is 1$"):
            s.wait(6, timeout_s=5.0)
        dev.run_until_idle()
        assert [r.value for r in s.wait(5, timeout_s=5.0)] == [5]


class FailAfterCommit(SimDevice):
    """A simulated device whose ``commit`` raises once armed, after committing: the submit fails with its command
    buffer (and the signal of its value) committed; the session keeps it in flight with no value of its own."""

    armed = False

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        out = super().msg_send(proto, args)
        if self.armed and args[1] == self.sel_registerName("commit"):
            self.armed = False
            raise RuntimeError("boom after commit")
        return out


def test_a_failed_submit_that_signals_the_value_ends_the_wait_before_the_next_submit() -> None:
    prog = submit_program("x86_64", kernels=2, family="Apple7")
    with FailAfterCommit("x86_64", family="Apple7", autorun=False) as dev, \
            Session(prog, dev, serialize=False, timeout_s=5.0) as s:
        s.submit(n=4)
        dev.run_until_idle()
        dev.armed = True
        with pytest.raises(RuntimeError, match="boom after commit"):
            s.submit(n=4)  # value 2 skipped by the session, though its command buffer signals it
        with pytest.raises(WaitTimeoutError, match=r"waiting for timeline value 2 \(the last value signaled is 1\)"):
            s.wait(2, timeout_s=0.0)
        dev.run_until_idle()  # before the next submit patches what it reads (METAL.md §3 rule 15)
        rec = s.submit(n=4)
        assert rec.value == 3 and [r.value for r in s.inflight] == [None, 3]  # the timed-out wait finished 1
        assert [r.value for r in s.wait(2, timeout_s=0.0)] == [None] and s.timeline_value() == 2
        assert [r.value for r in s.inflight] == [3]  # not needed for 2: the failed submit signaled it
        dev.run_until_idle()
        assert [r.value for r in s.wait(timeout_s=5.0)] == [3]


# ---- GPU times


class Clock(RecordingBridge):
    """A RecordingBridge whose command buffers report the GPU times ``times`` (GPUStartTime, GPUEndTime)."""

    def __init__(self, start: Any, end: Any) -> None:
        super().__init__()
        self.times = {"GPUStartTime": start, "GPUEndTime": end}

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        out = super().msg_send(proto, args)
        return self.times.get(self.selector_name(args[1]), out)


@pytest.mark.parametrize("start, end", [(12345.0001, 0.0), (0.0, 12345.0001), (0.0, 0.0), (12345.0001, 12.0),
                                        (float("nan"), 1.0), (1.0, float("inf")), (-1.0, 1.0)])
def test_a_gpu_time_that_is_not_available_is_none_never_a_negative_duration(start: float, end: float) -> None:
    with Session(submit_program(), Clock(start, end)) as s:
        s.submit(n=1)
        (done,) = s.wait(timeout_s=1.0)
    (span,) = done.spans
    assert span.ns is None and done.gpu_ns is None
    assert done.gpu_times == [(gpu_seconds(start), gpu_seconds(end))]
    assert None in done.gpu_times[0] or done.gpu_times[0][1] < done.gpu_times[0][0]


def test_durations_are_integer_nanoseconds() -> None:
    with Session(submit_program(), Clock(12345.000100, 12345.000350)) as s:
        s.submit(n=1)
        (done,) = s.wait(timeout_s=1.0)
    assert done.spans == [GpuSpan(0, 12345_000_100_000, 12345_000_350_000)]
    assert done.spans[0].ns == done.gpu_ns == 250_000  # exactly 250 us, not 12345.00035 - 12345.0001 in floats
    assert seconds_to_ns(1e6 + 0.123456789) == 1_000_000_123_456_789  # the nearest nanosecond at any clock value
    assert seconds_to_ns(None) is None and gpu_seconds(0.0) is None and gpu_seconds(True) is None


def test_a_submit_without_timestamps_reports_one_span_per_command_buffer_not_per_kernel() -> None:
    from mtlir.cli.lower import lower_trace
    from mtlir.frontend.trace import load_trace
    trace = load_trace(TRACES / "mlp.apple7.json")
    program = lower_trace(trace, trace.device(), "x86_64", keep_stages=False).program
    with SimDevice("x86_64", family="Apple7") as dev, \
            Session(program, dev, initial=trace.initial_data(), timeout_s=60) as s:
        s.submit(**trace.values)
        (done,) = s.wait(timeout_s=60)
    assert len(trace.dispatches) == 5 and len(done.spans) == len([cb for cb in done.cbs if cb]) == 1
    (span,) = done.spans
    assert span.ns is not None and span.ns > 0 and done.gpu_ns == span.ns and done.timestamps == {}


def test_a_profiled_submit_reports_one_span_per_command() -> None:
    from lowering_cases import small_queue

    from mtlir.metal import DeviceSpec
    from mtlir.passes import lower
    program = lower(small_queue(DeviceSpec("Apple7"), timestamps=True), target="x86_64").program
    with SimDevice("x86_64", family="Apple7") as dev, Session(program, dev, timeout_s=60) as s:
        s.submit(n=64)
        (done,) = s.wait(timeout_s=60)
    assert [span.cb for span in done.spans] == [0, 1, 2]
    assert all(span.ns is not None and span.ns >= 0 for span in done.spans)
    assert sorted(done.timestamps) == list(range(6))
    stamps = [done.timestamps[i] for i in range(6)]
    assert all(t is not None for t in stamps) and stamps == sorted(stamps)  # type: ignore[type-var]
