"""Views whose byte offset is a run-time variable of the submit (frontend ``view(buf, UOp, nbytes)``): lowered once,
the offset bound per submit on the ICB path (``setKernelBuffer:offset:atIndex:`` patched) and the direct path
(``setBuffer:offset:atIndex:``); a misaligned offset or one past the buffer is refused by the device as Metal's
API validation does (METAL.md §1, §3 rule 8)."""
from __future__ import annotations

import numpy as np
import pytest

from mtlir.errors import MetalValidationError
from mtlir.frontend.nodes import QueueError, buffer, buffer_variable, timeline_value, view
from mtlir.frontend.queue import Queue
from mtlir.ir.dtypes import dtypes
from mtlir.ir.uop import UOp
from mtlir.metal import DeviceSpec, Kernel, KernelParam
from mtlir.passes import lower
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice

SAXPY = """#include <metal_stdlib>
using namespace metal;
kernel void saxpy(device float* y, device float* x, constant int& n, constant int& a,
                  uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 32 + lid.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""
KERNEL = Kernel("saxpy", "saxpy", SAXPY, (KernelParam(None, 0), KernelParam(None, 1), KernelParam("n", 2, "int32"),
                                          KernelParam("a", 3, "int32")))
N = 64


def _program(device: DeviceSpec) -> object:
    off = UOp.variable("off", 0, 2**20, dtypes.uint64)
    y, x = buffer("y", 4 * N), buffer_variable("x")
    q = Queue(device)
    q.exec(KERNEL, [y, view(x, off, 4 * N)], [N, 2], grid=(N // 32,), threadgroup=(32,))
    return lower(q.signal(q.timeline, timeline_value()).submit(), target="x86_64", keep_stages=False).program


def _device(device: DeviceSpec) -> SimDevice:
    return SimDevice("x86_64", family=device.family, residency_sets=device.residency_set, icb=device.icb)


@pytest.mark.parametrize("icb", [True, False], ids=["icb", "direct"])
def test_a_view_offset_bound_per_submit(icb: bool) -> None:
    device = DeviceSpec("Apple7", residency_set=True, icb=icb)
    program = _program(device)
    assert "off" in program.variables  # type: ignore[attr-defined]
    data = np.arange(4 * N, dtype=np.float32)
    with _device(device) as dev, Session(program, dev) as s:
        x = s.linked.new_buffer("x", data.nbytes, data.tobytes())
        expect = np.zeros(N)
        for elem in (0, 5, 3 * N, 17):  # one lowering, the offset changes per submit
            s.submit(x=x, off=4 * elem)
            s.wait(timeout_s=60)
            expect += 2 * data[elem:elem + N]
            np.testing.assert_allclose(np.frombuffer(s.read("buffer:y"), np.float32), expect)


@pytest.mark.parametrize("icb", [True, False], ids=["icb", "direct"])
@pytest.mark.parametrize("off, match", [(6, r"not a multiple of 4"), (16 * N, r"must be < \[buffer length\]")])
def test_a_bad_view_offset_is_refused_by_the_device(icb: bool, off: int, match: str) -> None:
    device = DeviceSpec("Apple7", residency_set=True, icb=icb)
    with _device(device) as dev, Session(_program(device), dev) as s:
        x = s.linked.new_buffer("x", 16 * N, bytes(16 * N))
        with pytest.raises(MetalValidationError, match=match):
            s.submit(x=x, off=off)
            s.wait(timeout_s=60)


def test_a_variable_offset_is_refused_where_it_cannot_be() -> None:
    off = UOp.variable("off", 0, 64, dtypes.uint64)
    with pytest.raises(QueueError, match="needs a buffer variable"):
        view(buffer("y", 256), off, 16)
    with pytest.raises(QueueError, match="below 0"):
        view(buffer_variable("x"), UOp.variable("o", -4, 64, dtypes.int32), 16)
    v = view(view(buffer_variable("x"), off, 64), 8, 16)  # a view of a variable view keeps the variable
    assert len(v.src) == 2 and v.arg == (0, 16)
