"""Linked.release() with work in flight, on the simulated device: every object is treated by Metal's lifetime table
(docs/simulator.md, "Object lifetimes") whatever its kind: the ICB, and a pipeline the encoder binds for the warm-up,
are kept alive by the command buffer that encoded them; the buffers and (on Apple9, without the warm-up) the
pipeline that only ICB commands reach are a use-after-free: refused and kept for a later release() in strict mode,
freed with the command buffer failing in InvalidResource in faithful mode."""
from __future__ import annotations

import re

import numpy as np
import pytest
from progbuild import submit_program

from mtlir.errors import BridgeError, LinkError
from mtlir.metal import MTL
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.kernels.pyrunner import PyKernel, PyKernelArg, PyKernelRunner

MODES = [pytest.param(True, id="strict"), pytest.param(False, id="faithful")]


def _add1(a: dict[int, np.ndarray], grid: tuple[int, int, int], tg: tuple[int, int, int]) -> None:
    n = int(a[2][0])
    a[0][:n] = a[1][:n] + 1


def _runner() -> PyKernelRunner:
    """add1(dst, src, n) of progbuild.submit_program as a Python kernel: dst[:n] = src[:n] + 1."""
    return PyKernelRunner([PyKernel("add1", (PyKernelArg("dst", "buffer", 0), PyKernelArg("src", "buffer", 1),
                                             PyKernelArg("n", "constant", 2, "int32")), _add1)])


def _alive(dev: SimDevice, handle: int) -> bool:
    try:
        dev.object(handle)
    except BridgeError:
        return False
    return True


@pytest.mark.parametrize("family", ["Apple7", "Apple9"])
@pytest.mark.parametrize("strict", MODES)
def test_release_in_flight_follows_the_lifetime_table(strict: bool, family: str) -> None:
    prog = submit_program("x86_64", kernels=2, family=family)
    icb_only = ["buffer:0", "buffer:1", "varbuf"] + (["pipeline:add1"] if family == "Apple9" else [])
    dev = SimDevice("x86_64", strict=strict, family=family, autorun=False, kernel_runner=_runner(), timeout_s=2.0)
    with dev:  # the Session only submits: its objects are released under it
        s = Session(prog, dev, initial={"buffer:1": np.arange(64, dtype=np.float32).tobytes()})
        (cb,) = s.submit(n=8).cbs
        handles = dict(s.linked.handles)
        if strict:
            with pytest.raises(LinkError) as e:
                s.linked.release()
            refused = sorted(set(re.findall(r"(\S+): release: MTL", str(e.value))))
            assert refused == sorted(icb_only)  # every kind by the same table: each names why
            assert "an indirect command buffer does not retain" in str(e.value)
            assert f"{len(icb_only)} refused, kept: call release() again" in str(e.value)
            assert sorted(name for _, _, name in s.linked.cleanup) == sorted(icb_only)
            assert all(_alive(dev, handles[name]) for name in icb_only)
        else:
            s.linked.release()  # Metal without its validation layer frees them at once
            assert not any(_alive(dev, handles[name]) for name in icb_only)
        assert _alive(dev, handles["icb"])  # encoded directly: its command buffer keeps it until it completes
        if family == "Apple7":
            assert _alive(dev, handles["pipeline:add1"])  # bound on the encoder for the warm-up: kept the same way
        dev.run_until_idle()
        assert not _alive(dev, handles["icb"])  # freed when its command buffer completed
        if family == "Apple7":
            assert not _alive(dev, handles["pipeline:add1"])
        m = s.messenger
        if strict:
            assert m.send(cb, "status") == MTL.StatusCompleted
            s.linked.release()  # the second call gives back what was refused
        else:  # the answer is never silently wrong: the command buffer reached a freed buffer
            assert m.send(cb, "status") == MTL.StatusError
            assert m.send(m.send(cb, "error"), "code") == MTL.ErrorInvalidResource
        m.send(cb, "release")  # the session's reference (its event is gone: it cannot wait any more)
        assert s.linked.cleanup == [] and dev.live_objects() == {}


def test_a_write_into_a_linked_buffer_is_checked_in_bytes() -> None:
    """Session.write of a memoryview of float32 (4 bytes an element): the range checked is its bytes (it was len(),
    the elements: 192 bytes at offset 128 of a 256-byte buffer passed; on real Metal a memmove past the buffer)."""
    data = np.full(48, 2.0, np.float32).data  # 48 elements, 192 bytes
    with SimDevice("x86_64", kernel_runner=_runner()) as dev:
        s = Session(submit_program("x86_64"), dev)
        with pytest.raises(ValueError, match=r"buffer:0: bytes \[128, 320\) are outside its 256 bytes"):
            s.write("buffer:0", data, 128)  # type: ignore[arg-type]
        s.write("buffer:0", data, 64)  # type: ignore[arg-type]
        assert s.read("buffer:0") == bytes(64) + data.tobytes()
        s.close()
