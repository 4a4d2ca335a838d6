"""Integer arithmetic that would wrap in its dtype is refused where it is built into the queue (a user's finding:
an int32 ``m * 65536`` passed to a ``constant int&`` reached the kernel as 0 at m = 65536, and the grid message's
advice ``(m * m).maximum(1)`` dispatched one threadgroup instead of 2.5e9); computed in int64 and cast back, the
value is checked against the parameter's type, and accepted when it fits."""
from __future__ import annotations

import numpy as np
import pytest

from mtlir.ir.dtypes import dtypes
from mtlir.ir.ops import Ops
from mtlir.metal import DeviceSpec, Kernel, KernelParam
from mtlir.frontend.nodes import QueueError, buffer, buffer_variable, timeline_value, view
from mtlir.frontend.queue import Queue
from mtlir.ir.uop import UOp

SETV = Kernel("setv", "setv", """#include <metal_stdlib>
using namespace metal;
kernel void setv(device int* out, constant int& v, uint i [[thread_position_in_grid]]) {
  if (i == 0) { out[0] = v; }
}
""", (KernelParam(None, 0, "int32", 1), KernelParam("v", 1, "int32")))
M = UOp.variable("m", 1, 65536)
i64 = dtypes.int64


@pytest.mark.parametrize("value, node, top", [
    (M * 65536, "m \\* 65536", 2**32),
    (M << 16, "m << 16", 2**32),
    (M * M, "m \\* m", 2**32),
    (M + (2**31 - 1), "m \\+ 2147483647", 2**31 - 1 + 65536),
    ((M * 65536).cast(dtypes.int32), "m \\* 65536", 2**32),          # a cast to the parameter's type is no way out
    ((M * M).alu(Ops.IDIV, 2), "m \\* m", 2**32),                      # nor a division of the wrapped value
])
def test_a_variable_value_that_wraps_in_int32_is_refused(value: UOp, node: str, top: int) -> None:
    with pytest.raises(QueueError, match=rf"^command 0 \(setv\): variable 'v' \(parameter 1\): a variable value"
                                         rf".*{node} can be {top}, above int32's largest value 2147483647 \(its range "
                                         rf"without wrapping is \[\d+, {top}\]\) for m in \[1, 65536\]; int32 "
                                         rf"arithmetic would wrap silently: compute it in int64 "
                                         rf"\(m.cast\(dtypes.int64\) first\) and cast the result to int32"):
        Queue(DeviceSpec("Apple7")).exec(SETV, [buffer("b", 4)], [value], grid=(1,))


def test_a_value_computed_in_int64_is_checked_against_the_parameter() -> None:
    with pytest.raises(QueueError, match=r"value m \* 65536 in \[65536, 4294967296\] \(for m in \[1, 65536\]\) does "
                                         r"not fit the parameter's type int32"):
        Queue().exec(SETV, [buffer("b", 4)], [(M.cast(i64) * 65536).cast(dtypes.int32)], grid=(1,))
    small = UOp.variable("m", 1, 32767)
    Queue().exec(SETV, [buffer("b", 4)], [(small.cast(i64) * 65536).cast(dtypes.int32)], grid=(1,))
    Queue().exec(SETV, [buffer("b", 4)], [small.cast(i64) * 65536], grid=(1,))  # int64 fits int32: written as int32


def test_a_narrowing_cast_inside_a_value_is_checked() -> None:
    # the casts around the value are looked through only where they cannot wrap: an int8 cast can (300 -> 44)
    m64 = UOp.variable("m", 0, 300, i64)
    with pytest.raises(QueueError, match=r"the cast of m to int8 can be 300, above int8's largest value 127"):
        Queue().exec(SETV, [buffer("b", 4)], [m64.cast(dtypes.int8).cast(dtypes.int32)], grid=(1,))
    with pytest.raises(QueueError, match=r"m in \[1, 1099511627776\] .* does not fit the parameter's type int32"):
        Queue().exec(SETV, [buffer("b", 4)], [UOp.variable("m", 1, 2**40, i64).cast(dtypes.int32)], grid=(1,))


def test_a_size_that_wraps_is_refused_without_the_maximum_advice() -> None:
    m = UOp.variable("m", 1, 50000)
    for grid in (m * m, (m * m).maximum(1)):
        with pytest.raises(QueueError) as e:
            Queue().exec(SETV, [buffer("b", 4)], [1], grid=(grid,))
        assert "m * m can be 2500000000, above int32's largest value 2147483647" in str(e.value)
        assert str(e.value).startswith("command 0 (setv): grid.x: a size") and "maximum(1)" not in str(e.value)
    q = Queue()
    q.exec(SETV, [buffer("b", 4)], [1], grid=(m.cast(i64) * m,))  # 2.5e9 threadgroups of one thread: in range
    assert q.ops[0].src[1].src[0].evaluate({"m": 50000}) == 2_500_000_000


def test_offsets_and_byte_counts_that_wrap_are_refused() -> None:
    with pytest.raises(QueueError, match=r"view of 'x': offset m \* 65536 cannot be computed in its dtype: m \* 65536"
                                         r" can be 4294967296"):
        view(buffer_variable("x"), M * 65536, 64)
    with pytest.raises(QueueError, match=r"copy after command 0: source: nbytes: a byte count cannot be computed .*"
                                         r"m \* 65536 can be 4294967296"):
        Queue().copy(buffer("a", 2**33), buffer("c", 2**33), M * 65536)
    Queue().copy(buffer("a", 2**33), buffer("c", 2**33), M.cast(dtypes.uint64) * 65536)


@pytest.mark.parametrize("icb", [True, False])
def test_the_kernel_gets_the_value_computed_in_int64(icb: bool) -> None:
    from mtlir.passes import lower
    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    m = UOp.variable("m", 1, 40000)
    q = Queue(DeviceSpec("Apple7", icb=icb))
    q.exec(SETV, [buffer("b", 4)], [(m.cast(i64) * 65536 - 2**31).cast(dtypes.int32)], grid=(1,), threadgroup=(32,))
    q.signal(q.timeline, timeline_value())
    program = lower(q.submit(), target="arm64", keep_stages=False).program
    with SimDevice("arm64", family="Apple7", icb=icb) as dev, Session(program, dev, timeout_s=60) as s:
        s.submit(m=40000)
        s.wait(timeout_s=60)
        got = int(np.frombuffer(s.read("buffer:b"), np.int32)[0])
    assert got == 40000 * 65536 - 2**31


def test_encode_refuses_a_hand_built_value_that_wraps() -> None:
    from mtlir.passes import lower
    from mtlir.passes.encode.commands import EncodeError
    ex = UOp(Ops.EXEC, dtypes.void, (UOp(Ops.KERNEL, dtypes.void, (), SETV), UOp.struct(dtypes.MTLSize, 1, 1, 1),
                                     UOp.struct(dtypes.MTLSize, 32, 1, 1), buffer("b", 4), M * 65536))
    with pytest.raises(EncodeError, match=r"command 0 \(setv\): variable parameter 1: a variable value cannot "
                                          r"be computed in its dtype: m \* 65536 can be 4294967296"):
        lower(UOp(Ops.SUBMIT, dtypes.void, (ex,), DeviceSpec("Apple7")), target="arm64")
