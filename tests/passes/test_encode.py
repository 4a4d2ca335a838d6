"""encode: the argument layout (ICB bindings, the variables buffer), what link builds vs what a submit patches,
resources, warm-up, chunking, command buffers per signal and per timestamp, rebound inputs, the direct path, the
errors; and a property test: messages per ICB submit depend only on the distinct pipelines (before Apple9), the
symbolic commands and the chunking, never on the number of kernels otherwise."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lowering_cases import N, SAXPY, SCALE, count_messages, message_lines, small_queue

from mtlir.ir.dtypes import dtypes
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj
from mtlir.ir.ops import Ops
from mtlir.passes import lower
from mtlir.passes.encode.commands import EncodeError
from mtlir.program.instructions import Call, Store
from mtlir.program.payloads import IcbCommand, IcbSpec, Stamp
from mtlir.program.program import Program
from mtlir.frontend.nodes import buffer, buffer_variable, timeline_value, view
from mtlir.frontend.queue import Queue
from mtlir.ir.uop import UOp


def objects(p: Program, kind: str) -> list[Obj]:
    return [o for o in p.objects.values() if o.kind == kind]


def icb_spec(p: Program) -> IcbSpec:
    (icb,) = objects(p, "icb")
    return icb.payload[0]


def test_icb_spec_holds_every_command_as_data() -> None:
    p = lower(small_queue(DeviceSpec("Apple7"), symbolic=True)).program
    spec = icb_spec(p)
    assert spec.commands == (
        IcbCommand("pipeline:saxpy", (("buffer:x", 0, 0), ("buffer:y", 256, 1), ("varbuf", 0, 2)), (0, 1, 1),
                   (32, 1, 1), False, True, (("n", 2),), (), (8192, 4096, 0)),  # barriers: none before command 0
        IcbCommand("pipeline:scale", (("buffer:y", 0, 0), ("buffer:z", 0, 1)), (2, 2, 1), (16, 2, 1), True, False,
                   (), (), (8192, 4096)),
        IcbCommand("pipeline:saxpy", (("buffer:z", 0, 0), ("buffer:x", 0, 1), ("varbuf", 0, 2)), (8, 1, 1),
                   (32, 1, 1), True, False, (("n", 2),), (), (4096, 8192, 0)))  # extents: view/buffer bytes
    assert [o.name for o in spec.pipelines] == ["pipeline:saxpy", "pipeline:scale"]
    assert spec.pipelines[0].payload == (SAXPY,)
    assert [(o.name, o.payload[0]) for o in spec.buffers] == [("buffer:x", 8192), ("buffer:y", 8192),
                                                              ("buffer:z", 4096), ("varbuf", 256)]
    assert spec.max_bind_count == 3


def test_variables_get_one_256_byte_slot_each() -> None:
    k = Kernel("k2", "k2", "", (KernelParam(None, 0), KernelParam("a", 1, "int32"), KernelParam("b", 2, "uint32")))
    m = UOp.variable("m", 0, 9)
    q = Queue(DeviceSpec("Apple9"))
    x = buffer("x", 64)
    q.exec(k, [x], [N, 7]).exec(k, [x], [N * 1, N + 1]).exec(k, [x], [m, 7]).signal(q.timeline, 1)
    p = lower(q.submit()).program
    spec = icb_spec(p)
    # N (the same after simplification), 7 as uint32, N + 1 as uint32, m: four slots
    assert [c.bindings[1:] for c in spec.commands] == [(("varbuf", 0, 1), ("varbuf", 256, 2)),
                                                       (("varbuf", 0, 1), ("varbuf", 512, 2)),
                                                       (("varbuf", 768, 1), ("varbuf", 256, 2))]
    (varbuf,) = [o for o in spec.buffers if o.kind == "varbuf"]
    assert varbuf.payload == (1024, ((256, "uint32", 7),))  # the constant is written once, at link
    patches = p.instrs[:p.patch_end()]
    stores = [ins for ins in patches if type(ins) is Store]
    assert [s.dtype for s in stores] == [dtypes.int32, dtypes.uint32, dtypes.int32]  # N, N + 1, m: every submit
    assert not any(type(ins) is Call for ins in patches)


def test_resources_are_exactly_the_bound_buffers() -> None:
    y = buffer("y", 4096)
    q = Queue(DeviceSpec("Apple9", residency_set=False))
    q.exec(SCALE, [view(y, 0, 64), view(y, 1024, 64)]).exec(SAXPY, [buffer("x", 64), y], [N]).signal(q.timeline, 1)
    p = lower(q.submit()).program
    (res,) = objects(p, "resources")
    assert res.payload == ("buffer:y", "buffer:x", "varbuf")  # a view counts as its buffer; each once
    uses = [c for c in p.calls() if c.selector == "useResources:count:usage:"]
    assert len(uses) == 1 and p.consts[uses[0].args[1]] == 3 and p.consts[uses[0].args[2]] == 3
    assert not objects(lower(small_queue(DeviceSpec("Apple9", residency_set=True))).program, "resources")


def _queue(n: int, device: DeviceSpec, kernels: list[Kernel] | None = None) -> UOp:
    """``n`` commands cycling through ``kernels`` (default: scale) on two buffers, then a signal."""
    ks = kernels or [SCALE]
    x, y = buffer("x", 4096), buffer("y", 4096)
    q = Queue(device)
    for i in range(n):
        k = ks[i % len(ks)]
        q.exec(k, [x, y], [N] if k.var_params else [])
    q.signal(q.timeline, timeline_value())
    return q.submit()


def test_chunking_sends_one_execute_per_max_range_commands() -> None:
    p = lower(_queue(10, DeviceSpec("Apple9")), pipeline="encode{max-range=4},symbolic,abi{target=arm64},linearize")
    assert [m for m in message_lines(p.program) if "executeCommandsInBuffer" in m] == [
        "encoder executeCommandsInBuffer:withRange: icb 0 4", "encoder executeCommandsInBuffer:withRange: icb 4 4",
        "encoder executeCommandsInBuffer:withRange: icb 8 2"]


def test_apple_maximum_range_is_16384() -> None:
    p = lower(_queue(16385, DeviceSpec("Apple9"))).program
    assert [m for m in message_lines(p) if "executeCommandsInBuffer" in m] == [
        "encoder executeCommandsInBuffer:withRange: icb 0 16384",
        "encoder executeCommandsInBuffer:withRange: icb 16384 1"]


def test_encoded_graph_does_not_grow_with_the_queue() -> None:
    sizes = [len(lower(_queue(n, DeviceSpec("Apple7"), [SCALE, SAXPY]), pipeline="encode").result.toposort())
             for n in (2, 50, 500)]
    assert sizes[0] == sizes[1] == sizes[2]


def test_signals_close_command_buffers() -> None:
    x, y = buffer("x", 64), buffer("y", 64)
    q = Queue(DeviceSpec("Apple9"))
    q.exec(SCALE, [x, y]).signal(q.timeline, 1).signal(q.timeline, 2).exec(SCALE, [y, x]).exec(SCALE, [x, y])
    q.wait(q.timeline, 2)  # on the queue's own timeline: lowers to nothing
    p = lower(q.submit()).program
    assert message_lines(p) == [
        "queue commandBuffer", "cmdbuf retain", "cmdbuf computeCommandEncoder", "encoder waitForFence: fence",
        "encoder executeCommandsInBuffer:withRange: icb 0 1", "encoder updateFence: fence", "encoder endEncoding",
        "cmdbuf encodeSignalEvent:value: event 1", "cmdbuf commit",
        "queue commandBuffer", "cmdbuf retain", "cmdbuf encodeSignalEvent:value: event 2", "cmdbuf commit",
        "queue commandBuffer", "cmdbuf retain", "cmdbuf computeCommandEncoder", "encoder waitForFence: fence",
        "encoder executeCommandsInBuffer:withRange: icb 1 2", "encoder updateFence: fence", "encoder endEncoding",
        "cmdbuf commit"]
    (slots,) = objects(p, "cbslots")
    assert slots.payload == (3, ())


def test_a_wait_on_an_event_placeholder_of_another_name_is_refused() -> None:
    q = Queue()
    q.exec(SCALE, [buffer("x", 64), buffer("y", 64)]).wait(UOp(Ops.OBJECT, dtypes.id, (), Obj("event", "other")), 1)
    with pytest.raises(EncodeError, match=r"wait after command 1: the event must be an event placeholder \('event' or "
                                          r"'event:<name>'"):
        lower(q.submit())


@pytest.mark.parametrize("icb", [True, False])
def test_timestamps_name_the_command_buffer_and_time(icb: bool) -> None:
    x, y = buffer("x", 64), buffer("y", 64)
    q = Queue(DeviceSpec("Apple9", icb=icb))
    q.timestamp(10).exec(SCALE, [x, y]).timestamp(11).timestamp(12).exec(SCALE, [y, x]).exec(SCALE, [x, y])
    q.signal(q.timeline, timeline_value()).timestamp(13)
    p = lower(q.submit()).program
    (slots,) = objects(p, "cbslots")
    assert slots.payload == (3, (Stamp(10, 0, "GPUStartTime"), Stamp(11, 0, "GPUEndTime"),
                                 Stamp(12, 1, "GPUStartTime"), Stamp(13, 2, "GPUEndTime")))
    lines = message_lines(p)
    # both paths loop over the first two one-command buffers (the last one signals)
    assert lines[0] == "for 2" and lines.count("end") == 1
    body = lines[1:lines.index("end")]
    assert body.count("queue commandBuffer") == 1 and count_messages(p) == 2 * len(body) + len(lines) - len(body) - 2
    if icb:
        assert "encoder executeCommandsInBuffer:withRange: icb * 1" in body
    else:  # scale(x, y) then scale(y, x): the buffers come from tables, the pipeline is one
        assert "encoder setBuffer:offset:atIndex: * 0 1" in body
        assert "encoder setComputePipelineState: pipeline:scale" in body
        assert {o.name: tuple(b.name for b in o.payload) for o in objects(p, "table")} == {
            "table:direct-buffer0:0": ("buffer:x", "buffer:y"), "table:direct-buffer1:0": ("buffer:y", "buffer:x")}


def test_timestamp_without_commands_is_refused() -> None:
    q = Queue()
    q.timestamp(0).signal(q.timeline, 1)
    with pytest.raises(EncodeError, match="timestamp slot 0: the submit has no command to time"):
        lower(q.submit())


def test_rebound_inputs_are_bound_per_submit() -> None:
    inp = buffer_variable("inp")
    x = buffer("x", 4096)
    q = Queue(DeviceSpec("Apple7", residency_set=False))
    q.exec(SCALE, [x, x]).exec(SCALE, [view(inp, 512, 64), x]).signal(q.timeline, 1)
    p = lower(q.submit()).program
    spec = icb_spec(p)
    assert spec.commands[1].bindings == (("buffer:x", 0, 1),) and spec.commands[1].rebound == (0,)
    lines = message_lines(p)
    assert lines[0] == "icb[1] setKernelBuffer:offset:atIndex: inp 512 0"
    assert "encoder useResources:count:usage: scratch:inputs 1 3" in lines
    assert "inp" in p.variables and p.variables["inp"][1:] == (1, 2**64 - 1)


def test_each_encoder_lists_only_the_buffer_variables_its_commands_bind() -> None:
    """The second useResources:count:usage: of an encoder lists the buffer variables its own commands bind, not
    every one of the submit: per command buffer its own array; in a profiled loop whose iterations bind different
    ones, one array of the distinct lists and two tables (offset, count) indexed by the counter."""
    inp, inp2, x = buffer_variable("inp"), buffer_variable("inp2"), buffer("x", 4096)
    q = Queue(DeviceSpec("Apple7", residency_set=False))
    q.exec(SCALE, [inp, x]).signal(q.timeline, 1).exec(SCALE, [x, x]).signal(q.timeline, 2)
    q.exec(SCALE, [x, inp2]).exec(SCALE, [inp2, inp]).signal(q.timeline, 3)
    p = lower(q.submit()).program
    uses = [line for line in message_lines(p) if "useResources" in line]
    assert uses == ["encoder useResources:count:usage: resources:0 1 3",          # x
                    "encoder useResources:count:usage: scratch:inputs:0 1 3",     # inp
                    "encoder useResources:count:usage: resources:1 1 3",          # x; no buffer variable
                    "encoder useResources:count:usage: resources:2 1 3",
                    "encoder useResources:count:usage: scratch:inputs:2 2 3"]     # inp2, inp
    assert {o.name: o.payload for o in objects(p, "scratch")} == {"scratch:inputs:0": (8,), "scratch:inputs:2": (16,)}
    stores = [ins for ins in p.instrs[:p.patch_end()] if type(ins) is Store]
    assert len(stores) == 3 and not any(o.name == "scratch:inputs" for o in objects(p, "scratch"))

    q = Queue(DeviceSpec("Apple7", residency_set=False))
    q.timestamp(0).exec(SCALE, [x, x]).exec(SCALE, [inp, x]).exec(SCALE, [x, inp2]).exec(SCALE, [inp, inp2])
    q.signal(q.timeline, 1)
    p = lower(q.submit()).program
    tables = {o.name: tuple(o.payload) for o in objects(p, "table")}
    assert tables == {"table:input-offsets:0": (0, 0, 1), "table:input-counts:0": (0, 1, 1)}
    assert {o.name: o.payload for o in objects(p, "scratch") if "inputs" in o.name} == {
        "scratch:inputs:0": (16,), "scratch:inputs:3": (16,)}  # the loop's [inp, inp2]; the last command's
    lines = message_lines(p)
    assert "encoder useResources:count:usage: * * 3" in lines[lines.index("for 3"):lines.index("end")]
    assert "encoder useResources:count:usage: resources:3 0 3" not in lines  # it binds buffer variables only
    assert lines[-8] == "encoder useResources:count:usage: scratch:inputs:3 2 3"


@pytest.mark.parametrize("build, message", [
    (lambda q, x: q.exec(SCALE, [view(x, 2, 16), x]), "command 0 (scale): buffer parameter 0 is bound at byte offset 2, "
                                                       "not a multiple of its element size 4"),
    (lambda q, x: q.exec(SCALE, [x, x]).exec(Kernel("scale", "other", "", SCALE.params), [x, x]),
     "command 1: two different kernels share the program key 'scale'"),
    (lambda q, x: q.exec(SCALE, [x, buffer("x", 128)]), "two buffers are named 'x', of 4096 and 128 bytes"),
    (lambda q, x: q.exec(Kernel("wide", "wide", "", (KernelParam(None, 31),)), [x]), "buffer indices go up to 30"),
])
def test_queues_encode_cannot_lower(build, message: str) -> None:  # type: ignore[no-untyped-def]
    q = Queue()
    build(q, buffer("x", 4096))
    q.signal(q.timeline, 1)
    with pytest.raises(EncodeError) as e:
        lower(q.submit())
    assert message in str(e.value)


def test_hand_built_graphs_are_checked_too() -> None:
    good = small_queue(DeviceSpec("Apple9"))
    ex = good.src[0]
    with pytest.raises(EncodeError, match="command 0: an EXEC's sources are"):
        lower(good.replace(src=(ex.replace(src=ex.src[1:]), *good.src[1:])))
    with pytest.raises(EncodeError, match=r"command 0 \(saxpy\): the kernel takes 2 buffers and 1 variables"):
        lower(good.replace(src=(ex.replace(src=ex.src[:-1]), *good.src[1:])))
    bad_view = UOp(Ops.BUFFER_VIEW, dtypes.id, (buffer("x", 8192),), (8192, 4))
    with pytest.raises(EncodeError, match=r"buffer parameter 0: view \[8192, 8196\) runs past the end"):
        lower(good.replace(src=(ex.replace(src=(*ex.src[:3], bad_view, *ex.src[4:])), *good.src[1:])))
    with pytest.raises(EncodeError, match="nothing to encode"):
        lower(UOp(Ops.SUBMIT, dtypes.void, (UOp(Ops.TIMESTAMP, dtypes.void, (), 0),), DeviceSpec()))
    with pytest.raises(EncodeError, match="CONST is not a queue op"):
        lower(UOp(Ops.SUBMIT, dtypes.void, (UOp.const(dtypes.int32, 1),), DeviceSpec()))
    with pytest.raises(EncodeError, match="a SUBMIT's arg is the DeviceSpec"):
        lower(good.replace(arg="Apple9"))


def _hand_built(kernel: Kernel, grid: tuple, tg: tuple, args: list[UOp]) -> UOp:
    """A submit of one EXEC built without the Queue builder (so only encode checks it), then a signal."""
    ex = UOp(Ops.EXEC, dtypes.void, (UOp(Ops.KERNEL, dtypes.void, (), kernel), UOp.struct(dtypes.MTLSize, *grid),
                                     UOp.struct(dtypes.MTLSize, *tg), *args))
    sig = UOp(Ops.SIGNAL, dtypes.void, (Queue().timeline, UOp.const(dtypes.uint64, 1)))
    return UOp(Ops.SUBMIT, dtypes.void, (ex, sig), DeviceSpec())


_X, _Y = buffer("x", 4096), buffer("y", 4096)
_SIZED = Kernel("sized", "sized", "", (KernelParam(None, 0, "float32", 1024), KernelParam(None, 1)))


@pytest.mark.parametrize("grid, tg, args, kernel, message", [
    ((1, 1, 1), (2000, 1, 1), [_X, _Y, N], SAXPY,
     "command 0 (saxpy): threadgroup (2000, 1, 1) can have 2000 threads, above Metal's maximum of 1024"),
    ((1, 1, 1), (32, 32, 2), [_X, _Y, N], SAXPY, "threadgroup (32, 32, 2) can have 2048 threads"),
    ((2**31, 1, 1), (4, 1, 1), [_X, _Y, N], SAXPY,
     "command 0 (saxpy): grid.x x threadgroup.x = 2147483648 x 4 can be 8589934592 threads, above 2**32-1"),
    ((UOp.const(dtypes.uint64, 2**64 - 1), 1, 1), (1, 1, 1), [_X, _Y, N], SAXPY,
     "command 0 (saxpy): grid.x: size 18446744073709551615 is above 2**32-1"),
    ((1, 1, 1), (1, 1, 1), [_X, _Y, UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("m", 1, 2**40))], SAXPY,
     "command 0 (saxpy): variable parameter 2: variable 'm' has bounds [1, 1099511627776], which do not fit its "
     "dtype int32"),
    ((1, 1, 1), (1, 1, 1), [_X, _Y, UOp.variable("m", 1, 2**40, dtypes.int64).cast(dtypes.int32)], SAXPY,
     "command 0 (saxpy): variable parameter 2: value m in [1, 1099511627776]"),
    ((1, 1, 1), (1, 1, 1), [_X, _Y, UOp.const(dtypes.int64, 2**32 + 64)], SAXPY,
     "variable parameter 2: value 4294967360 does not fit the parameter's type int32"),
    ((1, 1, 1), (1, 1, 1), [_X, _Y, UOp.variable("f", 0, 1, dtypes.float32).cast(dtypes.int32)], SAXPY,
     "found DEFINE_VAR<float32> 'f'"),
    # raw-constructor CONSTs (a parsed graph): the value must be an int of the dtype's range
    ((1, 1, 1), (1, 1, 1), [_X, _Y, UOp(Ops.CONST, dtypes.int32, (), 2.5)], SAXPY,
     "command 0 (saxpy): variable parameter 2: CONST<int32> 2.5 is a float, not an int"),
    ((1, 1, 1), (1, 1, 1), [_X, _Y, UOp(Ops.CONST, dtypes.int32, (), 2**40)], SAXPY,
     "variable parameter 2: CONST<int32> 1099511627776 does not fit its dtype"),
    ((1, 1, 1), (1, 1, 1), [view(_X, 0, 1024), _Y], _SIZED,
     "command 0 (sized): buffer parameter 0 takes 4096 bytes (KernelParam.elements), but the view bound to it holds "
     "1024"),
])
def test_encode_refuses_what_would_fail_at_run_time(grid: tuple, tg: tuple, args: list[UOp], kernel: Kernel,
                                                    message: str) -> None:
    with pytest.raises(EncodeError) as e:
        lower(_hand_built(kernel, grid, tg, args))
    assert message in str(e.value)


def test_encode_checks_threads_of_each_grid_and_threadgroup_pair() -> None:
    """The largest grid and the largest threadgroup seen may belong to different commands: both are fine here."""
    ok = _hand_built(SCALE, (2**30, 1, 1), (1, 1, 1), [_X, _Y])
    ex2 = UOp(Ops.EXEC, dtypes.void, (ok.src[0].src[0], UOp.struct(dtypes.MTLSize, 2, 1, 1),
                                      UOp.struct(dtypes.MTLSize, 1024, 1, 1), _X, _Y))
    assert lower(ok.replace(src=(ok.src[0], ex2, ok.src[1]))).program
    bad = UOp(Ops.EXEC, dtypes.void, (ok.src[0].src[0], UOp.struct(dtypes.MTLSize, 2**30, 1, 1),
                                      UOp.struct(dtypes.MTLSize, 8, 1, 1), _X, _Y))
    with pytest.raises(EncodeError, match=r"command 2 \(scale\): grid.x x threadgroup.x = 1073741824 x 8"):
        lower(ok.replace(src=(ok.src[0], ex2, bad, ok.src[1])))


# ---- the property test

_KERNELS = [Kernel(f"k{i}", f"k{i}", "", (KernelParam(None, 0), KernelParam(None, 1), KernelParam("n", 2, "int32")))
            for i in range(5)]


@st.composite
def queues(draw: st.DrawFn) -> tuple[UOp, int, int, int, DeviceSpec, int]:
    device = DeviceSpec(draw(st.sampled_from(["Apple7", "Apple8", "Mac2", "Apple9"])), draw(st.booleans()))
    ncmds = draw(st.integers(1, 40))
    x, y = buffer("x", 1 << 16), buffer("y", 1 << 16)
    q = Queue(device)
    used: list[Kernel] = []
    symbolic = 0
    for i in range(ncmds):
        k = draw(st.sampled_from(_KERNELS))
        used.append(k)
        sym = draw(st.booleans())
        symbolic += sym
        grid = ((N + 7) // 8,) if sym else (draw(st.integers(1, 9)),)
        q.exec(k, [view(x, 256 * draw(st.integers(0, 8)), 256), y], [draw(st.sampled_from([N, 3]))], grid, (8,))
    q.signal(q.timeline, timeline_value())
    max_range = draw(st.sampled_from([1, 3, 7, 16384]))
    return q.submit(), len(dict.fromkeys(used)), symbolic, ncmds, device, max_range


@settings(max_examples=60, deadline=None)
@given(queues())
def test_messages_per_icb_submit(case: tuple[UOp, int, int, int, DeviceSpec, int]) -> None:
    graph, pipelines, symbolic, ncmds, device, max_range = case
    p = lower(graph, pipeline=f"encode{{max-range={max_range}}},abi{{target=arm64}},linearize").program
    warmup = 2 * pipelines if device.needs_warmup else 0
    resources = 0 if device.residency_set else 1
    # commandBuffer, retain, computeCommandEncoder, waitForFence:, updateFence:, endEncoding, encodeSignalEvent:, commit
    fixed = 8
    assert count_messages(p) == fixed + resources + warmup + symbolic + math.ceil(ncmds / max_range)


def test_direct_path_commands_travel_as_data() -> None:
    """The direct path's per-command messages are one MSGS node per encoder (data, not a node per message), so the
    encoded graph does not grow with the queue, and abi makes it one CALLS."""
    device = DeviceSpec("Apple7", residency_set=False, icb=False)
    graphs = [lower(_queue(n, device, [SCALE, SAXPY]), pipeline="encode").result for n in (2, 50, 500)]
    assert len({len(g.toposort()) for g in graphs}) == 1
    batch, tail = [u for u in graphs[2].toposort() if u.op is Ops.MSGS]  # the encoder's, the command buffer's
    # waitForFence; scale: pipeline, 2 buffers, dispatch; saxpy: + setBytes; updateFence, endEncoding
    assert len(batch.arg) == 1 + 500 // 2 * (4 + 5) + 2
    assert batch.arg[0] == ("waitForFence:", (1,)) and batch.src[1].arg.name == "fence"
    assert batch.arg[1] == ("setComputePipelineState:", (2,)) and batch.src[2].arg.name == "pipeline:scale"
    assert [m[0] for m in tail.arg] == ["encodeSignalEvent:value:", "commit"] and tail.src[0].src[1] is batch
    abi = lower(_queue(50, device, [SCALE, SAXPY]), pipeline="encode,symbolic,abi{target=arm64}").result
    assert not any(u.op in (Ops.MSG, Ops.MSGS) for u in abi.toposort())
    calls, _ = [u for u in abi.toposort() if u.op is Ops.CALLS]
    assert len(calls.arg) == 25 * 9 + 3 and all(c[0] == "objc_msgSend" for c in calls.arg)


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_direct_path_messages_are_the_same_as_one_node_per_message(target: str) -> None:
    """The golden direct path, also with symbolic sizes: the MSGS lowers to exactly the messages METAL.md §1 lists."""
    q = small_queue(DeviceSpec("Apple7", residency_set=False, icb=False), symbolic=True)
    lines = message_lines(lower(q, target=target).program)
    assert lines[4:9] == ["encoder setComputePipelineState: pipeline:saxpy",
                          "encoder setBuffer:offset:atIndex: buffer:x 0 0",
                          "encoder setBuffer:offset:atIndex: buffer:y 256 1",
                          "encoder setBytes:length:atIndex: contents:varbuf 4 2",
                          "encoder dispatchThreadgroups:threadsPerThreadgroup: * [32,1,1]"]


def test_each_encoder_lists_only_the_buffers_its_commands_bind() -> None:
    """A submit split by a signal: each encoder's useResources:count:usage: names its own commands' buffers and the
    variables buffer, not the whole submit's (METAL.md §1 step 4)."""
    x, y, z = buffer("x", 64), buffer("y", 64), buffer("z", 64)
    q = Queue(DeviceSpec("Apple7", residency_set=False))
    q.exec(SCALE, [x, y]).signal(q.timeline, 1).exec(SAXPY, [z, y], [N]).signal(q.timeline, 2)
    lines = [m for m in message_lines(lower(q.submit()).program) if "useResources" in m]
    assert lines == ["encoder useResources:count:usage: resources:0 3 3",
                     "encoder useResources:count:usage: resources:1 3 3"]
    p = lower(q.submit()).program
    assert {o.name: o.payload for o in objects(p, "resources")} == {
        "resources:0": ("buffer:x", "buffer:y", "varbuf"), "resources:1": ("buffer:z", "buffer:y", "varbuf")}


def test_a_profiled_loop_warms_up_only_the_pipeline_of_its_command() -> None:
    """The profiled ICB loop (one command buffer per command): each iteration binds its own command's pipeline,
    read from a link-time table indexed by the loop counter, and lists its own buffers."""
    kernels = [Kernel(f"k{i}", f"k{i}", "", (KernelParam(None, 0), KernelParam(None, 1))) for i in range(3)]
    bufs = [buffer(f"b{i}", 64) for i in range(4)]
    q = Queue(DeviceSpec("Apple7", residency_set=False))
    for i in range(6):
        q.timestamp(i).exec(kernels[i % 3], [bufs[i % 4], bufs[(i + 1) % 4]])
    p = lower(q.signal(q.timeline, 1).submit()).program
    lines = message_lines(p)
    body = lines[lines.index("for 5") + 1:lines.index("end")]
    assert body.count("encoder setComputePipelineState: *") == 1 and len(body) == 11  # one warm-up pair
    assert "encoder useResources:count:usage: * * 3" in body
    tables = {o.name: o.payload for o in objects(p, "table")}
    assert [o.name for o in tables["table:pipelines:0"]] == [f"pipeline:k{i % 3}" for i in range(5)]
    assert [o.payload for o in tables["table:resources:0"]] == [(f"buffer:b{i % 4}", f"buffer:b{(i + 1) % 4}")
                                                                for i in range(5)]
    assert tuple(tables["table:resource-counts:0"]) == (2,) * 5
    assert count_messages(p) == 6 * 11 + 1  # per command buffer: open 4, use, warm-up 2, execute, close 2, commit; a signal
    one = Queue(DeviceSpec("Apple7", residency_set=False))  # one pipeline, the same buffers: no table at all
    for i in range(3):
        one.timestamp(i).exec(kernels[0], bufs[:2])
    p1 = lower(one.signal(one.timeline, 1).submit()).program
    assert not objects(p1, "table") and "encoder setComputePipelineState: pipeline:k0" in message_lines(p1)


COPY = """#include <metal_stdlib>
using namespace metal;
kernel void KEY(device float* y, device float* x, uint3 gid [[threadgroup_position_in_grid]],
                uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 32 + lid.x;
  y[i] = x[i] * MUL;
}
"""


@pytest.mark.parametrize("family", ["Apple7", "Apple9"])
def test_a_profiled_loop_runs_on_the_strict_simulated_device(family: str) -> None:
    """Two pipelines and four buffers in a profiled loop, no residency set, on the simulated device in strict
    mode: a command whose pipeline was not warmed up (rule 16) or whose buffer is not resident (rule 10) raises."""
    import numpy as np

    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    kernels = [Kernel(key, key, COPY.replace("KEY", key).replace("MUL", mul),
                      (KernelParam(None, 0), KernelParam(None, 1))) for key, mul in (("twice", "2.0f"), ("neg", "-1.0f"))]
    a, b, c, d = (buffer(name, 128) for name in "abcd")
    device = DeviceSpec(family, residency_set=False)
    q = Queue(device)
    for i, (k, dst, src) in enumerate([(0, b, a), (1, c, b), (0, d, c)]):
        q.timestamp(i).exec(kernels[k], [dst, src], grid=(1,), threadgroup=(32,))
    program = lower(q.signal(q.timeline, timeline_value()).submit(), target="x86_64", keep_stages=False).program
    x = np.arange(32, dtype=np.float32)
    with SimDevice("x86_64", family=family, residency_sets=False) as dev, \
            Session(program, dev, initial={"buffer:a": x.tobytes()}) as s:
        s.submit(timeline=1)
        s.wait(timeout_s=60)
        np.testing.assert_array_equal(np.frombuffer(s.read("buffer:d"), np.float32), x * -4)


# ---- runs of like signaling command buffers as one loop (spans.fold_signal_runs)


def _signal_runs(device: DeviceSpec, n: int, every: int, kernels: list[Kernel]) -> UOp:
    """``n`` commands cycling through ``kernels`` over views of two buffers, a constant signal after every
    ``every`` of them, then the timeline's signal."""
    x, y = buffer("x", 1 << 16), buffer("y", 1 << 16)
    q = Queue(device)
    for i in range(n):
        k = kernels[i % len(kernels)]
        q.exec(k, [view(x, 256 * i, 256), y if i % 3 else x], [N] if k.var_params else [])
        if (i + 1) % every == 0 and i + 1 < n:
            q.signal(q.timeline, i + 1)
    q.signal(q.timeline, timeline_value())
    return q.submit()


def _loops(program: Program) -> int:
    return sum(line.startswith("for ") for line in message_lines(program))


def _recorded(program: Program) -> list[tuple[object, str, list[object]]]:
    """The messages of one submit, a ``resources`` array as the buffers it lists (a loop shares one array among
    the iterations that list the same buffers, where the unrolled command buffers have one each)."""
    import mtlir.runtime as runtime
    arrays = objects(program, "resources") + [o for t in objects(program, "table") for o in t.payload
                                              if isinstance(o, Obj) and o.kind == "resources"]
    lists = {o.name: o.payload for o in arrays}
    with runtime.Session(program, runtime.RecordingBridge(target=program.target)) as s:
        return [(m["receiver"], m["selector"], [lists.get(a, a) if isinstance(a, str) else a for a in m["args"]])
                for m in s.record_submit(**{k: v for k, v in (("n", 5), ("timeline", 100)) if k in program.variables})]


@pytest.mark.parametrize("family, residency", [("Apple7", False), ("Apple7", True), ("Apple9", False)])
@pytest.mark.parametrize("every, kernels", [(2, [SCALE, SAXPY]), (3, [SCALE]), (1, [SAXPY, SCALE, SCALE])])
def test_signal_runs_are_one_loop_sending_the_unrolled_messages(monkeypatch: pytest.MonkeyPatch, family: str,
                                                                residency: bool, every: int,
                                                                kernels: list[Kernel]) -> None:
    """A command buffer per ``every`` commands, each closed by a constant signal, is one loop over tables (signal
    values, pipelines, resources) whose run sends exactly the messages the unrolled command buffers send."""
    import mtlir.passes.encode.encode as encode_mod
    import mtlir.passes.encode.spans as spans_mod
    device = DeviceSpec(family, residency_set=residency)
    looped = lower(_signal_runs(device, 24, every, kernels), target="arm64").program
    monkeypatch.setattr(encode_mod, "MIN_LOOP", 10**9)
    monkeypatch.setattr(spans_mod, "MIN_LOOP", 10**9)
    unrolled = lower(_signal_runs(device, 24, every, kernels), target="arm64").program
    assert _loops(looped) == 1 and _loops(unrolled) == 0
    assert len(looped.instrs) < len(unrolled.instrs) // 3
    tables = {o.name: tuple(o.payload) for o in objects(looped, "table")}
    assert tables["table:signals:0"] == tuple(range(every, 24, every))
    assert objects(looped, "cbslots")[0].payload == objects(unrolled, "cbslots")[0].payload
    assert _recorded(looped) == _recorded(unrolled)


def test_signal_runs_that_differ_in_shape_stay_unrolled() -> None:
    """A run shorter than MIN_LOOP, command buffers of different widths, a signal value of a run-time variable or
    waits between them leave the command buffers unrolled."""
    from mtlir.passes.encode.spans import MIN_LOOP
    device = DeviceSpec("Apple7", residency_set=False)
    assert not _loops(lower(_signal_runs(device, MIN_LOOP, 1, [SCALE])).program)
    assert _loops(lower(_signal_runs(device, MIN_LOOP + 1, 1, [SCALE])).program) == 1
    x = buffer("x", 4096)
    q = Queue(device)
    for i in range(12):  # widths 1, 2, 1, 2, ...
        q.exec(SCALE, [x, x])
        if i % 3 != 1:
            q.signal(q.timeline, i + 1)
    assert not _loops(lower(q.submit()).program)
    q = Queue(device)
    for i in range(12):
        q.exec(SCALE, [x, x]).signal(q.timeline, N + i)
    assert not _loops(lower(q.submit()).program)


SCALE2 = Kernel("scale2", "scale2", "kernel void scale2(device float* x, device float* y) {}", SCALE.params)


def _profiled_direct(symbolic: bool, stamps: bool = True) -> UOp:
    """24 commands, a timestamp after each (``stamps``), on a device without ICBs: two kernels of one layout over
    views at different offsets of two buffers, constant grids that differ (``symbolic``: saxpy, its grid
    ``(n + 31) // 32`` for all, the variable's slot the same)."""
    x, y = buffer("x", 1 << 16), buffer("y", 1 << 16)
    q = Queue(DeviceSpec("Apple7", icb=False))
    for i in range(24):
        if symbolic:
            q.exec(SAXPY, [view(x, 256 * i, 256), y], [N], grid=((N + 31) // 32,), threadgroup=(32,))
        else:
            q.exec([SCALE, SCALE2][i % 2], [view(x, 256 * i, 256), y if i % 3 else x], grid=(1 + i % 5, 2),
                   threadgroup=(32 if i % 4 else 16,))
        if stamps:
            q.timestamp(i)
    q.signal(q.timeline, timeline_value())
    return q.submit()


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
@pytest.mark.parametrize("symbolic", [False, True])
@pytest.mark.parametrize("stamps", [True, False])
def test_direct_commands_of_one_layout_are_one_loop_sending_the_unrolled_messages(
        monkeypatch: pytest.MonkeyPatch, target: str, symbolic: bool, stamps: bool) -> None:
    """On the direct path a profiled submit's one-command buffers of one layout, or a run of such commands in one
    encoder, are one loop whose messages read what differs (pipeline, buffers, offsets, sizes) from tables; its
    run sends exactly the unrolled messages."""
    import mtlir.passes.encode.encode as encode_mod
    looped = lower(_profiled_direct(symbolic, stamps), target=target).program
    monkeypatch.setattr(encode_mod._Builder, "direct_shape", lambda self, i: i)  # every command its own shape
    unrolled = lower(_profiled_direct(symbolic, stamps), target=target).program
    assert _loops(looped) == 1 and _loops(unrolled) == 0
    assert len(looped.instrs) < len(unrolled.instrs) // (5 if stamps else 2)
    assert objects(looped, "cbslots")[0].payload == objects(unrolled, "cbslots")[0].payload
    assert _recorded(looped) == _recorded(unrolled)


@pytest.mark.parametrize("stamps", [True, False])
def test_direct_commands_of_different_layouts_are_not_one_loop(stamps: bool) -> None:
    x = buffer("x", 4096)
    q = Queue(DeviceSpec("Apple7", icb=False))
    for i in range(6):
        if i % 2:
            q.exec(SAXPY, [x, x], [N])
        else:
            q.exec(SCALE, [x, x])
        if stamps:
            q.timestamp(i)
    assert not _loops(lower(q.submit()).program)


def test_two_runs_in_one_encoder_are_two_loops_and_the_rest_unrolled(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the direct path (no timestamps) runs of one layout of at least MIN_LOOP commands are loops one after the
    other in the encoder; shorter runs stay unrolled between them; the messages are the unrolled ones."""
    import mtlir.passes.encode.encode as encode_mod
    from mtlir.passes.encode.spans import MIN_LOOP
    x, y = buffer("x", 1 << 16), buffer("y", 1 << 16)

    def queue() -> UOp:
        q = Queue(DeviceSpec("Apple7", icb=False))
        for i in range(MIN_LOOP):
            q.exec(SCALE, [view(x, 256 * i, 256), y])
        for i in range(MIN_LOOP):
            q.exec(SAXPY, [y, view(x, 256 * i, 256)], [N + i])
        q.exec(SCALE, [x, y]).exec(SAXPY, [x, y], [N])
        for i in range(MIN_LOOP):
            q.exec(SCALE2, [y, x], grid=(i + 1,))
        q.signal(q.timeline, timeline_value())
        return q.submit()
    looped = lower(queue()).program
    assert _loops(looped) == 3
    monkeypatch.setattr(encode_mod._Builder, "direct_shape", lambda self, i: i)
    assert _recorded(looped) == _recorded(lower(queue()).program)
