"""A Session over its life (a new user's findings): after ``SimDevice.close()`` every call to the device, and a
Session's submit, wait and read, raise ``DeviceClosedError`` at once (a wait never sits out its timeout); the default
timeline value is always above what the host signaled and skips a refused one (rule 12 would refuse it for ever); in
strict mode one kernel fault is reported once, its submit released with the error, and a later submit's own bad
argument comes before any wait; ``read`` after ``close()`` is a ``StateError`` like submit and wait."""
from __future__ import annotations

import time
import warnings

import pytest
from progbuild import OVERRUN_MSL, submit_program

from mtlir.errors import ArgumentError, DeviceClosedError, MetalValidationError, StateError
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice


def _session(**dev_kwargs: object) -> tuple[SimDevice, Session]:
    dev = SimDevice("x86_64", family="Apple7", **dev_kwargs)  # type: ignore[arg-type]
    return dev, Session(submit_program("x86_64", kernels=1, family="Apple7"), dev, timeout_s=5.0)


# ---- SimDevice.close


def test_after_the_device_closes_every_call_to_it_raises_naming_the_device() -> None:
    dev, s = _session(autorun=False)  # the GPU runs nothing on its own: the submit below never runs
    s.submit(n=4)
    assert s.messenger.send(s.event, "signaledValue") == 0  # its SEL registered before the close
    dev.close()
    assert dev.closed
    with pytest.raises(DeviceClosedError, match=rf"signaledValue sent to MTLSharedEvent .*SimDevice #{dev.number} "
                                                r"is closed"):
        s.messenger.send(s.event, "signaledValue")
    with pytest.raises(DeviceClosedError, match="objc_autoreleasePoolPush: SimDevice"):
        s.messenger.push()
    with pytest.raises(DeviceClosedError):
        dev.wait_command_buffers(list(s.inflight[0].cbs), 5.0)
    t0 = time.monotonic()
    with pytest.raises(DeviceClosedError, match=rf"wait on a Session: the device, SimDevice #{dev.number}, is "
                                                "closed"):
        s.wait(timeout_s=5.0)  # at once: the work it waits for will never run
    assert time.monotonic() - t0 < 1.0
    for call, what in ((lambda: s.submit(n=4), "submit"), (lambda: s.read("buffer:0"), "read"),
                       (lambda: s.write("buffer:0", b"\0" * 4), "write"), (s.timeline_value, "timeline_value")):
        with pytest.raises(DeviceClosedError, match=f"^{what} on a Session: the device"):
            call()
    assert issubclass(DeviceClosedError, StateError)
    with pytest.raises(DeviceClosedError, match="Session"):
        Session(submit_program("x86_64", kernels=1, family="Apple7"), dev)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.close()  # sends nothing: it would raise
        s.close()
        dev.close()
    assert s.closed and not s.inflight


def test_read_and_write_after_close_are_a_state_error_naming_the_session() -> None:
    dev, s = _session()
    with dev:
        s.submit(n=4)
        s.wait()
        s.close()
        for call in (lambda: s.read("buffer:0"), lambda: s.write("buffer:0", b"\0" * 4),
                     lambda: s.submit(n=4), lambda: s.wait()):
            with pytest.raises(StateError, match="on a closed Session"):
                call()


# ---- the default timeline value


def test_the_default_timeline_value_is_above_what_the_host_signaled() -> None:
    dev, s = _session()
    with dev, s:
        s.submit(n=4)
        s.wait()
        s.signal_event("event", 50)
        assert [s.submit(n=4).value for _ in range(3)] == [51, 52, 53]
        assert [r.value for r in s.wait()] == [53] and s.timeline_value() == 53  # (each submit waits the one before)


def test_a_default_timeline_value_the_device_refused_is_skipped() -> None:
    dev, s = _session()
    with dev, s:
        s.messenger.send(s.event, "setSignaledValue:", 3)  # behind the Session's back: it cannot know
        for value in (1, 2, 3):
            with pytest.raises(MetalValidationError, match=rf"value:{value} .*: {value} is (below|not above) 3"):
                s.submit(n=4)  # strict mode refuses it (rule 12) before anything is committed
        assert s.submit(n=4).value == 4  # not 1 for ever
        assert [r.value for r in s.wait()] == [4]
        with pytest.raises(ArgumentError, match="outside its bounds"):
            s.submit(n=0)  # a value refused before anything is sent uses no timeline value
        assert s.submit(n=4).value == 5


# ---- one fault, one error


def test_a_kernel_fault_in_strict_mode_is_reported_once_and_its_submit_released() -> None:
    dev = SimDevice("x86_64", family="Apple7")
    s = Session(submit_program("x86_64", kernels=1, family="Apple7", msl=OVERRUN_MSL), dev, timeout_s=5.0)
    with dev, s:
        s.submit(n=4)  # in bounds
        s.wait()
        s.submit(n=48)  # writes out[48 + 48]: past the 64 floats
        with pytest.raises(ArgumentError, match="'n' = 0 is outside"):
            s.submit(n=0)  # its own bad value first, not the fault of the submit before it
        with pytest.raises(MetalValidationError, match="out of bounds") as e:
            s.wait()
        assert any("fault of submit 1 (timeline value 2)" in note and "PageFault" in note
                   for note in e.value.__notes__)
        assert not s.inflight  # released with the error: no GPUExecutionError for it later
        assert s.wait() == []
        assert s.submit(n=4).value == 3
        assert [r.value for r in s.wait()] == [3]
