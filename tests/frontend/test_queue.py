"""The Queue builder: the layout of the queue graph it builds, and a clear QueueError for each kind of bad input."""
from __future__ import annotations

import pytest
from lowering_cases import N, SAXPY, SCALE

from mtlir.ir.dtypes import dtypes
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj
from mtlir.ir.ops import Ops
from mtlir.frontend.nodes import QueueError, buffer, buffer_variable, timeline, timeline_value, view, placeholder_name
from mtlir.frontend.checks import exec_parts
from mtlir.frontend.queue import Queue
from mtlir.ir.uop import UOp


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


def test_exec_remembers_only_the_checks_that_passed() -> None:
    # each distinct size tuple and value is checked once per queue; a value equal to a good one but of another type
    # (True == 1), and a bad one met twice, are still refused every time
    x, y = buffer("x", 4096), buffer("y", 4096)
    q = Queue(DeviceSpec("Apple9"))
    q.exec(SAXPY, [x, y], [1], grid=(4,), threadgroup=(32,))
    q.exec(SAXPY, (x, y), (1,), grid=4, threadgroup=[32, 1])  # the same sizes written otherwise: the same EXEC
    assert q.ops[0] is q.ops[1]
    with pytest.raises(QueueError, match="command 2 .*variable 'n' must be an int or a UOp, got True"):
        q.exec(SAXPY, [x, y], [True], grid=(4,), threadgroup=(32,))
    with pytest.raises(QueueError, match="command 2 .*grid.x: a size must be an int or an expression"):
        q.exec(SAXPY, [x, y], [1], grid=(True,), threadgroup=(32,))
    for _ in range(2):
        with pytest.raises(QueueError, match="command 2 .*above Metal's maximum of 1024 threads per threadgroup"):
            q.exec(SAXPY, [x, y], [1], grid=(4,), threadgroup=(64, 32))
    assert q.ncommands == 2 and len(q.ops) == 2


def test_a_timestamp_slot_taken_twice_is_refused_naming_both_commands() -> None:
    a, b = buffer("a", 64), buffer("b", 64)
    q = Queue().timestamp(0).exec(SCALE, [a, b]).timestamp(1).exec(SCALE, [b, a])
    with pytest.raises(QueueError, match=r"^timestamp after command 2: slot 0 is already taken by the timestamp after "
                                         r"command 0; .*\(the first would be lost\)"):
        q.timestamp(0)
    q.timestamp(2)  # the refused one left nothing behind
    assert [u.arg for u in q.submit().src if u.op is Ops.TIMESTAMP] == [0, 1, 2]


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


# ---- limits Metal and MSL set, refused when the queue is built (not at link or run time)

_M40 = UOp.variable("m", 1, 2**40, dtypes.int64)
_F = UOp.variable("f", 0, 4, dtypes.float32)


@pytest.mark.parametrize("kw, message", [
    ({"threadgroup": (2000,)}, "command 1 (saxpy): threadgroup (2000, 1, 1) can have 2000 threads, above Metal's "
                               "maximum of 1024 threads per threadgroup"),
    ({"threadgroup": (32, 32, 2)}, "command 1 (saxpy): threadgroup (32, 32, 2) can have 2048 threads"),
    ({"threadgroup": (N, 2)}, "threadgroup (n, 2, 1) can have 8192 threads (for n in [1, 4096])"),
    ({"grid": (2**64,)}, "command 1 (saxpy): grid.x: size 18446744073709551616 is above 2**32-1"),
    ({"grid": (2**31,), "threadgroup": (2,)}, "command 1 (saxpy): grid.x x threadgroup.x = 2147483648 x 2 can be "
                                              "4294967296 threads, above 2**32-1: MSL thread positions are 32-bit"),
    ({"grid": (1, N * 2**18), "threadgroup": (1, 8)}, "grid.y x threadgroup.y = n * 262144 x 8 can be 8589934592 "
                                                      "threads (for n in [1, 4096])"),
    ({"vars": [_M40]}, "command 1 (saxpy): variable 'n' (parameter 2): value m in [1, 1099511627776] (for m in "
                       "[1, 1099511627776]) does not fit the parameter's type int32"),
    ({"vars": [_M40.cast(dtypes.int32)]}, "variable 'n' (parameter 2): value m in [1, 1099511627776]"),
    ({"vars": [2**32 + 64]}, "command 1 (saxpy): variable 'n' (parameter 2): value 4294967360 does not fit the "
                             "parameter's type int32"),
    ({"vars": [_F.cast(dtypes.int32)]}, "variable 'n' (parameter 2): a variable value must be an integer expression, "
                                        "found DEFINE_VAR<float32> 'f'"),
    ({"grid": (_F.cast(dtypes.int32),)}, "grid.x: a size must be an integer expression, found DEFINE_VAR<float32> 'f'"),
    # a CONST built with the raw constructor skips UOp.const's checks: 2.5 reached the kernel as 2, True as 1, and
    # 2**40 failed only at link with a raw struct error
    ({"vars": [UOp(Ops.CONST, dtypes.int32, (), 2.5)]}, "command 1 (saxpy): variable 'n' (parameter 2): "
                                                        "CONST<int32> 2.5 is a float, not an int"),
    ({"vars": [UOp(Ops.CONST, dtypes.int32, (), True)]}, "variable 'n' (parameter 2): CONST<int32> True is a bool"),
    ({"vars": [UOp(Ops.CONST, dtypes.int32, (), 2**40)]}, "variable 'n' (parameter 2): CONST<int32> 1099511627776 "
                                                          "does not fit its dtype [-2147483648, 2147483647]"),
    ({"vars": [UOp(Ops.CONST, dtypes.int64, (), 3.0) + 1]}, "CONST<int64> 3.0 is a float"),
    ({"grid": (UOp(Ops.CONST, dtypes.uint64, (), 2.5),)}, "grid.x: CONST<uint64> 2.5 is a float, not an int"),
    # hand-built value nodes (mtlir/ir/spec.py): exact_bounds crashed on a one-source ADD (a bare ValueError) and
    # min > max surfaced only after encode
    ({"vars": [UOp(Ops.ADD, dtypes.int32, (N,))]}, "command 1 (saxpy): variable 'n' (parameter 2): a variable value: "
                                                   "ADD takes 2 sources, has 1, at ADD<int32>"),
    ({"vars": [UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("m", 10, 1))]},
     "variable 'n' (parameter 2): a variable value: variable 'm': min 10 > max 1"),
    ({"grid": (UOp(Ops.DEFINE_VAR, dtypes.int32, (), "m"),)}, "grid.x: a size: a DEFINE_VAR's arg is (name, min, max)"),
    ({"vars": [UOp(Ops.MAX, dtypes.int32, (N, N, N))]}, "a variable value: MAX takes 2 sources, has 3"),
    # two variables of one name: one value bound to both (the second's bounds never checked); refused at linearize
    # before, with a message that did not name the dtypes
    ({"vars": [UOp.variable("n", 1, 5) + UOp.variable("n", 1, 1024)]},
     "variable 'n' (parameter 2): variable 'n' is declared twice: int32 in [1, 5] and int32 in [1, 1024]"),
    ({"grid": (UOp.variable("g", 1, 64, dtypes.uint32).cast(dtypes.int32) + UOp.variable("g", 1, 64),)},
     "command 1 (saxpy): grid: variable 'g' is declared twice: "),
    ({"bufs": [buffer("x", 64), buffer("y", 64)], "kernel": "sized"},
     "command 1 (sized): buffer parameter 0 takes 32 elements of float32 (128 bytes), but the buffer 'x' bound to it "
     "holds 64 bytes"),
    ({"bufs": [view(buffer("x", 256), 192, 64), buffer("y", 256)], "kernel": "sized"},
     "buffer parameter 0 takes 32 elements of float32 (128 bytes), but the view of 'x' bound to it holds 64 bytes"),
])
def test_metal_limits_are_refused_when_the_queue_is_built(kw: dict, message: str) -> None:
    sized = Kernel("sized", "sized", "", (KernelParam(None, 0, "float32", 32), KernelParam(None, 1, "float32"),
                                          KernelParam("n", 2, "int32")))
    q = Queue()
    q.exec(SCALE, [buffer("a", 64), buffer("b", 64)])  # so the bad one is command 1
    kernel = sized if kw.get("kernel") == "sized" else SAXPY
    with pytest.raises(QueueError) as e:
        q.exec(kernel, kw.get("bufs", [buffer("x", 4096), buffer("y", 4096)]), kw.get("vars", [N]),
               grid=kw.get("grid", (1,)), threadgroup=kw.get("threadgroup", (32,)))
    assert message in str(e.value)


def test_limits_that_are_met_are_accepted() -> None:
    sized = Kernel("sized", "sized", "", (KernelParam(None, 0, "float32", 32),))
    q = Queue()
    q.exec(SAXPY, [buffer("x", 64), buffer("y", 64)], [2**31 - 1], grid=(2**22 - 1,), threadgroup=(1024,))
    q.exec(SAXPY, [buffer("x", 64), buffer("y", 64)], [N], grid=(N, 1, 1), threadgroup=(8, 8, 16))
    q.exec(sized, [view(buffer("z", 1024), 896, 128)]).exec(sized, [buffer_variable("inp")])  # size known at run
    assert len(q.submit().src) == 4


@pytest.mark.parametrize("call, error, message", [
    (lambda: KernelParam(None, 0, "bogus"), ValueError, "KernelParam(None, 0): unknown element type 'bogus'"),
    (lambda: KernelParam(None, 0, "float32*"), ValueError, "unknown element type 'float32*'"),
    (lambda: KernelParam(None, -1), ValueError, "index -1 is negative"),
    (lambda: KernelParam(None, 1.0), TypeError, "index is the Metal buffer index"),
    (lambda: KernelParam("", 0, "int32"), ValueError, "needs a non-empty name"),
    (lambda: KernelParam(None, 0, "float32", 0), ValueError, "elements 0 is below 1"),
    (lambda: KernelParam(None, 0, "float32", 4.0), TypeError, "elements is an int or None"),
    (lambda: Kernel("k", "k", "", (KernelParam(None, 0), KernelParam("n", 0, "int32"))), ValueError,
     "Kernel 'k': two parameters at buffer index 0"),
    (lambda: Kernel("k", "k", "", ("x",)), TypeError, "parameter 0 is a str, not a KernelParam"),
    (lambda: Kernel("", "k", ""), ValueError, "must be non-empty"),
])
def test_kernels_are_checked_when_constructed(call, error: type, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as e:
        call()
    assert message in str(e.value)


def test_element_types_accept_the_trace_and_msl_names() -> None:
    from mtlir.metal import element_dtype
    assert element_dtype("dtypes.float") is dtypes.float32 and element_dtype("int") is dtypes.int32
    assert element_dtype("half") is dtypes.float16 and element_dtype("uint8") is dtypes.uint8
    assert KernelParam(None, 0, "dtypes.float", 8).element is dtypes.float32
    assert Kernel("k", "k", "", [KernelParam(None, 0)]).params == (KernelParam(None, 0),)  # a list becomes a tuple


# ---- a size that can fall below 1: the hint builds a MAX node, and Python's max() over it is an error

ADD1 = Kernel("add1", "add1", """#include <metal_stdlib>
using namespace metal;
kernel void add1(device float* x, constant int& n,
                 uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 128 + lid.x;
  if (i < n) {
    x[i] = x[i] + 1.0f;
  }
}
""", (KernelParam(None, 0, "float32", 4096), KernelParam("n", 1, "int32")))


def test_a_size_that_can_be_0_hints_at_maximum() -> None:
    q = Queue()
    with pytest.raises(QueueError) as e:
        q.exec(ADD1, [buffer("x", 4 * 4096)], [N], grid=(N // 128,), threadgroup=(128,))
    assert str(e.value) == ("command 0 (add1): grid.x: size n // 128 can be 0, below 1 (for n in [1, 4096]); a size "
                            "must stay in [1, 2**32-1] for every value of its variables: e.g. (n // 128).maximum(1) "
                            "(MAX/MIN nodes; Python's max() and min() cannot compare run-time values)")
    with pytest.raises(QueueError, match=r"size n \* 2097152 can be 8589934592, above 2\*\*32-1 .* e.g. "
                                         r"\(n \* 2097152\).minimum\(2\*\*32 - 1\)"):
        q.exec(ADD1, [buffer("x", 4 * 4096)], [N], grid=(N.cast(dtypes.int64) * 2**21,))
    with pytest.raises(TypeError, match=r"\(n // 128\) < 1: it can be True or False for n in \[1, 4096\]"):
        q.exec(ADD1, [buffer("x", 4 * 4096)], [N], grid=(max(N // 128, 1),), threadgroup=(128,))  # was the constant 1
    q.exec(ADD1, [buffer("x", 4 * 4096)], [N], grid=((N // 128).maximum(1),), threadgroup=(128,))
    grid_x = q.ops[0].src[1].src[0]
    assert [grid_x.evaluate({"n": n}) for n in (1, 127, 128, 4096)] == [1, 1, 1, 32]


def test_following_the_hint_dispatches_every_threadgroup() -> None:
    """The issue's case run on the simulated device: with max(n // 128, 1) the grid was one threadgroup for every n
    and n = 4096 updated 128 of 4096 elements; (n // 128).maximum(1) updates all of them."""
    import numpy as np

    from mtlir.passes import lower
    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    q = Queue(DeviceSpec("Apple7"))
    q.exec(ADD1, [buffer("x", 4 * 4096)], [N], grid=((N // 128).maximum(1),), threadgroup=(128,))
    q.signal(q.timeline, timeline_value())
    program = lower(q.submit(), target="arm64", keep_stages=False).program
    with SimDevice("arm64", family="Apple7") as dev, \
            Session(program, dev, initial={"buffer:x": bytes(4 * 4096)}, timeout_s=60) as s:
        for n in (4096, 200):
            s.submit(n=n)
            s.wait(timeout_s=60)
        got = np.frombuffer(s.read("buffer:x"), np.float32)
    assert (got[:128] == 2).all() and (got[128:] == 1).all()  # n = 200 still runs one threadgroup of 128 threads


def test_named_queues_have_their_own_placeholders_and_join_in_order() -> None:
    """Issue 17: ``Queue(device, name=...)`` owns ``queue:<name>``, ``fence:<name>`` and ``event:<name>``; its SUBMIT
    carries the name as tag; ``queues`` keeps the order; the names are public in ``import mtlir``."""
    import mtlir
    from mtlir.frontend.nodes import shared_event
    from mtlir.frontend.queue import queues
    dev = DeviceSpec("Apple9")
    copy, compute = Queue(dev, name="copy"), Queue(dev)
    assert copy.timeline.arg.name == "event:copy" and compute.timeline.arg.name == "event"
    assert shared_event("go").arg.name == "event:go"
    x = buffer("x", 64)
    copy.fill(x, 0).signal(copy.timeline, 1)
    compute.wait(copy.timeline, 1).fill(x, 1)
    graph = queues(copy, compute)
    assert [s.tag for s in graph.src] == ["copy", None] and graph.arg == dev
    assert mtlir.queues is queues and mtlir.shared_event is shared_event
    with pytest.raises(QueueError, match="identifier"):
        shared_event("no spaces")
    with pytest.raises(QueueError, match="two default queues"):
        queues(Queue(dev), Queue(dev))
    # a named queue's builder errors name it (encode's do: "... of queue 'copy'"; the builder's did not)
    with pytest.raises(QueueError, match=r"^copy after command 0 of queue 'copy': "):
        copy.copy(x, x, -4)
    with pytest.raises(QueueError, match=r"^command 0 of queue 'copy' \(scale\): kernel takes 2 buffers, got 1"):
        copy.exec(SCALE, [x])
    with pytest.raises(QueueError, match=r"^signal after command 0 of queue 'copy': the event must be"):
        copy.signal(x, 1)
