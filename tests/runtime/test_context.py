"""DeviceContext (runtime/context.py): buffers of one device never pass for another's."""
from __future__ import annotations

import pytest

from mtlir.frontend.nodes import buffer, buffer_variable, timeline_value
from mtlir.frontend.queue import Queue
from mtlir.metal import DeviceSpec, Kernel, KernelParam
from mtlir.passes import lower
from mtlir.runtime.context import ContextError, DeviceContext
from mtlir.runtime.sim.device import SimDevice

MSL = """#include <metal_stdlib>
using namespace metal;
kernel void cp(device uchar* y, device uchar* x, uint3 lid [[thread_position_in_threadgroup]]) {
  y[lid.x] = x[lid.x] + 10;
}
"""


def test_a_buffer_of_another_device_is_refused_naming_it() -> None:
    spec = DeviceSpec("Apple9")
    k = Kernel("cp", "cp", MSL, (KernelParam(None, 0, "uint8", 64), KernelParam(None, 1, "uint8", 64)))
    q = Queue(spec)
    q.exec(k, [buffer_variable("y"), buffer("w", 64)], [], grid=(1,), threadgroup=(64,))
    q.signal(q.timeline, timeline_value())
    program = lower(q.submit(), target="x86_64").program
    sim_a, sim_b = SimDevice("x86_64"), SimDevice("x86_64")
    a, b = DeviceContext(sim_a, name="A", spec=spec), DeviceContext(sim_b, name="B", spec=spec)
    try:
        a.alloc(64)
        theirs = b.alloc(64)  # the same position in B as A's first buffer: it used to get the same handle
        with pytest.raises(ContextError, match=rf"A: buffer:w is handle {theirs.handle:#x}, which is no live buffer "
                                               "of this device"):
            a.session(program, shared_extra={"buffer:w": theirs.handle})
    finally:
        a.close()
        b.close()
        sim_a.close()
        sim_b.close()
