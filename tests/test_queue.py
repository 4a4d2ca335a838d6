"""The Queue builder: the layout of the queue graph it builds, and a clear QueueError for each kind of bad input."""
from __future__ import annotations

import pytest
from lowering_cases import N, SAXPY, SCALE

from mtlir.dtypes import dtypes
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj
from mtlir.ops import Ops
from mtlir.queue import (Queue, QueueError, buffer, buffer_variable, exec_parts, timeline, timeline_value, view,
                         placeholder_name)
from mtlir.uop import UOp


def test_submit_layout() -> None:
    x, y = buffer("x", 4096), buffer("y", 4096)
    q = Queue(DeviceSpec("Apple7"))
    q.exec(SAXPY, [x, view(y, 256, 1024)], [N], grid=((N + 31) // 32,), threadgroup=(32,))
    q.wait(q.timeline, 3).signal(q.timeline, timeline_value()).timestamp(0)
    g = q.submit()
    assert g.op is Ops.SUBMIT and g.arg == DeviceSpec("Apple7")
    assert [s.op for s in g.src] == [Ops.EXEC, Ops.WAIT, Ops.SIGNAL, Ops.TIMESTAMP]
    ex = g.src[0]
    parts = exec_parts(ex)
    assert parts.kernel is SAXPY and ex.src[0].op is Ops.KERNEL
    assert parts.grid.dtype is dtypes.MTLSize and parts.grid.src[1:] == (UOp.const(dtypes.uint64, 1),) * 2
    assert parts.grid.src[0] is ((N + 31) // 32).cast(dtypes.uint64)
    assert parts.threadgroup is UOp.struct(dtypes.MTLSize, 32, 1, 1)
    assert parts.buffers == (x, UOp(Ops.BUFFER_VIEW, dtypes.id, (y,), (256, 1024)))
    assert parts.vars == (N,)
    assert g.src[1].src == (timeline(), UOp.const(dtypes.uint64, 3))
    assert g.src[2].src == (timeline(), timeline_value())
    assert g.src[3].arg == 0
    assert q.timeline is timeline() and q.timeline.arg == Obj("event", "event")


def test_same_graph_twice_is_the_same_node() -> None:
    def build() -> UOp:
        q = Queue()
        q.exec(SCALE, [buffer("a", 64), buffer("b", 64)], [], (2,), (8,)).signal(q.timeline, 1)
        return q.submit()
    assert build() is build()


def test_views_compose_and_name_placeholders() -> None:
    b = buffer("7", 1024)
    v = view(view(b, 256, 512), 128, 64)
    assert v.src == (b,) and v.arg == (384, 64)
    assert placeholder_name(b) == "buffer:7"
    assert placeholder_name(buffer_variable("inp")) == "input:inp"
    iv = view(buffer_variable("inp"), 1 << 20, 64)  # a buffer variable's size is unknown: any offset
    assert iv.arg == (1 << 20, 64)


def test_constant_variables_become_constants_of_the_parameter_type() -> None:
    q = Queue()
    q.exec(SAXPY, [buffer("x", 64), buffer("y", 64)], [5])
    assert exec_parts(q.ops[0]).vars == (UOp.const(dtypes.int32, 5),)


@pytest.mark.parametrize("call, message", [
    (lambda q, x, y: q.exec("saxpy", [x, y], [1]), "must be an mtlir.metal.Kernel"),
    (lambda q, x, y: q.exec(SAXPY, [x], [1]), "takes 2 buffers, got 1"),
    (lambda q, x, y: q.exec(SAXPY, [x, y], []), "takes 1 variables (n), got 0"),
    (lambda q, x, y: q.exec(SAXPY, [x, 3], [1]), "buffer parameter 1 must be a buffer"),
    (lambda q, x, y: q.exec(SAXPY, [x, y], [1.5]), "variable 'n' must be an int or a UOp"),
    (lambda q, x, y: q.exec(SAXPY, [x, y], [UOp.const(dtypes.float32, 1.0)]), "must be an integer"),
    (lambda q, x, y: q.exec(SAXPY, [x, y], [1], grid=(0,)), "grid.x: size 0 is below 1"),
    (lambda q, x, y: q.exec(SAXPY, [x, y], [1], threadgroup=(1, -2)), "threadgroup.y: size -2 is below 1"),
    (lambda q, x, y: q.exec(SAXPY, [x, y], [1], grid=(1, 1, 1, 1)), "expected 1 to 3 sizes"),
    (lambda q, x, y: q.exec(SAXPY, [x, y], [1], grid=(UOp.const(dtypes.float32, 2.0),)), "must be an integer"),
    (lambda q, x, y: q.exec(SAXPY, [x, y], [1], grid=(x,)), "must be an integer"),
    (lambda q, x, y: q.exec(SAXPY, [x, y], [1], grid=(True,)), "must be an int or an expression"),
    (lambda q, x, y: q.signal(x, 1), "must be an event placeholder"),
    (lambda q, x, y: q.wait(q.timeline, -1), "does not fit a uint64"),
    (lambda q, x, y: q.signal(q.timeline, "one"), "must be an int or a uint64 UOp"),
    (lambda q, x, y: q.timestamp(-1), "slot must be an int >= 0"),
])
def test_bad_input_names_the_command_and_argument(call, message) -> None:  # type: ignore[no-untyped-def]
    q = Queue()
    q.exec(SCALE, [buffer("a", 64), buffer("b", 64)])  # so the bad one is command 1
    with pytest.raises(QueueError, match=None) as e:
        call(q, buffer("x", 64), buffer("y", 64))
    assert message in str(e.value)
    if "command" in str(e.value):
        assert "command 1" in str(e.value)


@pytest.mark.parametrize("call, message", [
    (lambda: buffer("", 4), "non-empty string"),
    (lambda: buffer("b", 0), "nbytes must be an int >= 1"),
    (lambda: view(buffer("b", 64), 32, 64), "bytes [32, 96) run past the end of the 64-byte buffer"),
    (lambda: view(view(buffer("b", 64), 32, 16), 8, 16), "run past the end of the 16-byte view"),
    (lambda: view(buffer("b", 64), -4, 4), "offset must be an int >= 0"),
    (lambda: view(buffer("b", 64), 0, 0), "nbytes must be an int >= 1"),
    (lambda: view(UOp.const(dtypes.int32, 1), 0, 4), "is not a buffer"),
    (lambda: Queue().submit(), "the queue is empty"),
    (lambda: Queue("Apple7"), "device must be a DeviceSpec"),  # type: ignore[arg-type]
])
def test_bad_buffers_and_queues(call, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(QueueError) as e:
        call()
    assert message in str(e.value)


def test_a_float_variable_parameter_is_refused() -> None:
    k = Kernel("k", "k", "", (KernelParam(None, 0), KernelParam("n", 1)))  # dtype defaults to float32
    with pytest.raises(QueueError, match="constant int& variables are integers"):
        Queue().exec(k, [buffer("a", 64)], [3])


def test_exec_parts_checks_hand_built_nodes() -> None:
    good = Queue().exec(SCALE, [buffer("a", 64), buffer("b", 64)]).ops[0]
    with pytest.raises(QueueError, match="sources are"):
        exec_parts(UOp(Ops.EXEC, dtypes.void, good.src[1:]), "command 4")
    with pytest.raises(QueueError, match="command 4: kernel 'scale' takes 2 buffers"):
        exec_parts(good.replace(src=good.src[:-1]), "command 4")
    with pytest.raises(QueueError, match="must be an MTLSize STRUCT"):
        exec_parts(good.replace(src=(good.src[0], UOp.const(dtypes.uint64, 1), *good.src[2:])), "command 4")
