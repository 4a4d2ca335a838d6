"""The timeline read: one ``signaledValue`` message, lowered by abi and linearize; ``lower`` puts it into every
Program that uses the timeline (``Program.timeline_read``), and the runtime's Session reads the timeline with it,
over the objects it linked, without calling back into the passes."""
from __future__ import annotations

import dataclasses

import pytest
from lowering_cases import SAXPY, small_queue

from mtlir.errors import LinkError
from mtlir.frontend.nodes import buffer
from mtlir.frontend.queue import Queue
from mtlir.ir.dtypes import dtypes
from mtlir.ir.ops import Ops
from mtlir.metal import DeviceSpec, Obj, abi_prototype
from mtlir.passes import lower
from mtlir.passes.timeline import timeline_read, timeline_read_program, uses_timeline

DEV = DeviceSpec("Apple7")


def test_the_read_is_one_signaled_value_message() -> None:
    read = timeline_read(DEV)
    assert read.op is Ops.SINK and read.arg == DEV
    (msg,) = read.src
    assert (msg.op, msg.dtype, msg.arg, msg.tag) == (Ops.MSG, dtypes.uint64, "signaledValue", "timeline")
    assert msg.src[0].arg == Obj("event", "event")


def test_timeline_read_program() -> None:
    for target in ("arm64", "x86_64"):
        p = timeline_read_program(DEV, target)
        assert p.target == target and p.device == DEV
        (call,) = p.calls()
        assert call.selector == "signaledValue" and call.proto == abi_prototype("signaledValue", target)
        assert p.objects[call.receiver] == Obj("event", "event")
        assert p.results == {"timeline": call.dst}
        assert p.format(call.pc) == "value = [event signaledValue]"
        assert p.timeline_read is None  # what lower adds, the read itself does not need


@pytest.mark.parametrize("pipeline", [None, "encode,symbolic,abi{target=x86_64},linearize"])
def test_lower_puts_the_read_into_a_program_that_uses_the_timeline(pipeline: str | None) -> None:
    device = DeviceSpec("Apple9", residency_set=False)
    program = lower(small_queue(device), target="x86_64", pipeline=pipeline).program
    assert uses_timeline(program) and program.timeline_read is not None
    assert program.timeline_read.listing() == timeline_read_program(device, "x86_64").listing()
    q = Queue(device).exec(SAXPY, [buffer("x", 64), buffer("y", 64)], [3], grid=(1,), threadgroup=(16,))
    quiet = lower(q.submit(), target="x86_64").program  # no wait, no signal: no event, nothing to read
    assert not uses_timeline(quiet) and quiet.timeline_read is None


def test_the_session_reads_the_timeline_with_the_programs_read() -> None:
    import mtlir.runtime as runtime
    submit = lower(small_queue(DEV), target="arm64").program
    for program, reader in ((submit, "program"), (dataclasses.replace(submit, timeline_read=None), "message")):
        bridge = runtime.RecordingBridge(target="arm64")
        with runtime.Session(program, bridge) as s:
            assert s.timeline_reader == reader
            s.submit(n=3, timeline=41)
            s.wait(timeout_s=5)
            assert s.timeline_value() == 41
    stray = timeline_read_program(DEV, "arm64")
    stray.objects = {r: Obj("event", "another-event") for r in stray.objects}
    with pytest.raises(LinkError, match="placeholder 'another-event' of the other Program was not linked here"):
        runtime.Session(dataclasses.replace(submit, timeline_read=stray), runtime.RecordingBridge(target="arm64"))


def test_the_kept_timeline_read_is_a_copy_per_call() -> None:
    """The read is lowered once per (device, target) and kept; a Program is mutable, so each call gets its own copy:
    the test above rebinds a read's ``objects``, and with one shared read every Program lowered after it in the
    process failed to link (LinkError: placeholder 'another-event' of the other Program)."""
    first = timeline_read_program(DEV, "arm64")
    first.objects = {r: Obj("event", "another-event") for r in first.objects}
    first.instrs.clear()
    second = timeline_read_program(DEV, "arm64")
    assert second.instrs and all(o.name != "another-event" for o in second.objects.values())
    program = lower(small_queue(DEV), target="arm64").program
    assert program.timeline_read is not None and program.timeline_read.instrs


# ---- which event is a Program's timeline (session 6, finding 12)

def _named_queues(first: str, *, shared_first: bool = True, p_timeline: bool = True) -> object:
    """Queues p and q (no default queue) in the SINK's order ``first``-then-the-other; p signals a shared event
    ``aaa`` first (its register comes before every queue's timeline), and its timeline when ``p_timeline``; q waits
    for p and signals its own timeline."""
    from mtlir.frontend.nodes import shared_event, timeline_value
    from mtlir.frontend.queue import queues
    v = timeline_value()
    x, y = buffer("x", 64), buffer("y", 64)
    p, q = Queue(DEV, name="p"), Queue(DEV, name="q")
    if shared_first:
        p.signal(shared_event("aaa"), v)
    p.exec(SAXPY, [x, y], [3], grid=(1,), threadgroup=(16,))
    if p_timeline:
        p.signal(p.timeline, v)
        q.wait(p.timeline, v)
    q.copy(x, y, 64).signal(q.timeline, v)
    return queues(p, q) if first == "p" else queues(q, p)


def _read_event(program: object) -> str:
    read = program.timeline_read  # type: ignore[attr-defined]
    assert read is not None
    return next(o.name for o in read.objects.values() if o.kind == "event")


@pytest.mark.parametrize("first", ["p", "q"])
def test_the_timeline_of_named_queues_is_the_first_queues_own_never_a_shared_event(first: str) -> None:
    """A Program of named queues only waited on whichever event link listed first: the shared event ``aaa`` (and
    register order is not the SINK's order). Now: the first queue's own timeline, in the SINK's order."""
    import mtlir.runtime as runtime
    from mtlir.passes.timeline import queue_order, timeline_event
    graph = _named_queues(first)
    lowered = lower(graph, target="arm64")  # type: ignore[arg-type]
    program = lowered.program
    assert queue_order(graph) == [first, "q" if first == "p" else "p"]  # type: ignore[arg-type]
    assert timeline_event(graph, program) == f"event:{first}" == _read_event(program)  # type: ignore[arg-type]
    assert sorted(queue_order(lowered.stages[1][1])) == ["p", "q"]  # type: ignore[arg-type]
    with runtime.Session(program, runtime.RecordingBridge(target="arm64")) as s:
        assert s.event == s.linked.handles[f"event:{first}"] != s.linked.handles["event:aaa"]
        assert s.timeline_reader == "program"
    with runtime.Session(dataclasses.replace(program, timeline_read=None),
                         runtime.RecordingBridge(target="arm64")) as s:  # by hand: a queue's timeline, not aaa
        assert s.event in (s.linked.handles["event:p"], s.linked.handles["event:q"])


def test_the_default_queues_timeline_wins_and_a_queue_without_its_timeline_is_skipped() -> None:
    from mtlir.passes.timeline import timeline_event
    graph = _named_queues("p", p_timeline=False)  # p signals only the shared event: q's timeline is the first
    program = lower(graph, target="arm64").program  # type: ignore[arg-type]
    assert timeline_event(graph, program) == "event:q" == _read_event(program)  # type: ignore[arg-type]
    assert _read_event(lower(small_queue(DEV), target="arm64").program) == "event"
