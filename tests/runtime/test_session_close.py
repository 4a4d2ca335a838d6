"""``Session.close`` while a submit nobody waited for is still in flight (an injected hang: its kernel runs until the
GPU watchdog, ``gpu_timeout_s``): close waits at most its timeout, raises no GPU error of that submit, keeps alive
what a command buffer in flight still reaches through its ICB (rule 14: a ``ResourceWarning`` names it) and releases
it at a later close; after ``SimDevice.close()`` it sends nothing (no ``LinkError``)."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import mtlir
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice

MLP = Path(__file__).resolve().parents[2] / "examples" / "traces" / "mlp.apple7.json"


def _hung(gpu_timeout_s: float) -> tuple[SimDevice, Session]:
    trace = mtlir.load_trace(str(MLP))
    program = mtlir.lower(trace.queue(mtlir.DeviceSpec("Apple7")), target="x86_64").program
    dev = SimDevice(family="Apple7", gpu_timeout_s=gpu_timeout_s)
    s = Session(program, dev, initial=trace.initial_data(), timeout_s=30.0)
    dev.inject("0:hang")
    s.submit()
    return dev, s


def test_close_raises_no_gpu_error_of_a_submit_nobody_waited_for() -> None:
    dev, s = _hung(0.1)
    with dev, warnings.catch_warnings():
        warnings.simplefilter("error")  # and nothing is kept alive: the watchdog ended the command buffer
        s.close()  # the hang ends in Error, Timeout at the watchdog: not close's error
        assert s.closed and not s.inflight and not s.linked.cleanup


def test_close_past_its_timeout_keeps_what_the_icb_reaches_then_a_later_close_releases_it() -> None:
    dev, s = _hung(1.0)
    with dev:
        with pytest.warns(ResourceWarning, match=r"kept alive.*buffer:\d+.*deallocated while MTLCommandBuffer"):
            s.close(timeout_s=0.05)  # the command buffer still runs: no LinkError
        assert s.linked.cleanup and not s.inflight
        dev.run_until_idle(10.0)  # the watchdog ends it
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            s.close()
        assert not s.linked.cleanup


def test_close_after_the_device_closed_sends_nothing() -> None:
    dev, s = _hung(30.0)
    dev.close()
    assert dev.closed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.close()  # no LinkError, no wait for a command buffer that will never run
        s.close()
    assert s.closed and not s.inflight
