"""The timeline read: the tiny Program the runtime runs to read the timeline's value, lowered with each submit.

The timeline is a queue's MTLSharedEvent (METAL.md §1, host side): reading its value is ``signaledValue``
(uint64), one message on the event placeholder. ``timeline_read(device, event)`` is that message as typed messages
(the stage ``encode`` produces), ``timeline_read_program(device, target, event)`` the same lowered through the
passes that follow encode (``abi``, ``linearize``): its one result, ``results["timeline"]``, is the value. ``lower``
puts it into every Program that has a queue's timeline (``Program.timeline_read``), so the runtime reads the
timeline over the objects it linked without calling back into the passes; the event it reads is the Program's
timeline, the one a ``Session`` waits on.

Which event is the Program's timeline (``timeline_event``) is chosen here, once: the default queue's (``event``)
when the Program has it; else the first queue, in the order of the graph's SINK (``queues(p, q)``: ``p``), whose
own timeline (``event:<queue>``) the Program has; never a shared event (``shared_event``), which any queue may
signal and the host may set; None when no queue's timeline is in the Program.
"""
from __future__ import annotations

import dataclasses

from mtlir.ir.dtypes import dtypes
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp
from mtlir.frontend.nodes import timeline
from mtlir.metal import DeviceSpec
from mtlir.passes.pipeline import PassPipeline
from mtlir.passes.abi import Abi
from mtlir.passes.linearize import Linearize
from mtlir.program.program import Program

__all__ = ["TIMELINE_RESULT", "timeline_read", "timeline_read_program", "uses_timeline", "timeline_event",
           "queue_order"]

TIMELINE_RESULT = "timeline"  # the name of the read's result (``Program.results``)


def timeline_read(device: DeviceSpec, event: str = "event") -> UOp:
    """The host read of the timeline as typed messages: ``SINK(MSG<uint64> 'signaledValue' (OBJECT event))``,
    the root's arg ``device``, the message tagged ``TIMELINE_RESULT`` (linearize makes it the Program's result of
    that name). ``event``: the timeline's placeholder name, ``event`` (the default queue's) or ``event:<queue>``."""
    queue = None if event == "event" else event.split(":", 1)[1]
    read = UOp(Ops.MSG, dtypes.uint64, (timeline(queue),), "signaledValue", TIMELINE_RESULT)
    return UOp(Ops.SINK, dtypes.void, (read,), device)


def timeline_read_program(device: DeviceSpec, target: str = "arm64", event: str = "event") -> Program:
    """The Program that reads the value (``signaledValue``) of the timeline ``event`` (``timeline_event``) on
    ``device`` for ``target`` (``arm64`` or ``x86_64``), lowered by ``abi`` and ``linearize`` like a submit's
    messages;
    ``program.results["timeline"]`` is the register of the value. Raises ``ValueError`` for an unknown target.

    Lowered once per (device, target) and kept: lowering it again for every submit's Program was ~60 µs, about a
    tenth of the fixed cost of lowering a queue. Each call returns a copy of its own (its instruction list and
    tables new, a few µs): a ``Program`` is mutable, and one handed to several Programs was changed through one of
    them (a test's, rebinding its ``objects``), which broke every Program lowered after it in the process."""
    key = (device, target, event)
    got = _READS.get(key)
    if got is None:
        pipeline = PassPipeline((Abi(target), Linearize()), start="messages")
        got = pipeline.run(timeline_read(device, event), keep_stages=False).program
        if len(_READS) < 64:  # a handful of devices in practice: the cache stays small
            _READS[key] = got
    return dataclasses.replace(got, instrs=list(got.instrs), consts=dict(got.consts), objects=dict(got.objects),
                               selectors=dict(got.selectors), variables=dict(got.variables), names=dict(got.names),
                               results=dict(got.results))


_READS: dict[tuple[DeviceSpec, str, str], Program] = {}  # (device, target, event) -> the read, lowered once


def uses_timeline(program: Program) -> bool:
    """Whether ``program`` has the default queue's event placeholder (``event``: it signals or waits on that
    timeline), so the runtime reads the timeline to know when its submits are done. (Other queues' timelines,
    ``event:<name>``, are read by the host with ``signaledValue`` on the linked event.)"""
    return any(o.kind == "event" and o.name == "event" for o in program.objects.values())


def queue_order(graph: UOp) -> list[str | None]:
    """The queues of ``graph`` in the order of its SINK (``queues(p, q)``: p, then q), each once, as queue names
    (``None`` for the default queue): a queue graph's SUBMITs by their tag. A graph after encode no longer keeps
    that order (its SINK may hold one chain reaching every queue): there, the queue placeholders (``queue``,
    ``queue:<name>``) in the order the root's sources reach them (toposort order), which ``lower`` uses only for
    a graph given to it already encoded."""
    roots = graph.src if graph.op is Ops.SINK else (graph,)
    seen: dict[str | None, None] = {}
    for r in roots:
        if r.op is Ops.SUBMIT:
            seen.setdefault(r.tag if isinstance(r.tag, str) else None)
            continue
        for u in r.toposort():
            if u.op is Ops.OBJECT and getattr(u.arg, "kind", "") == "queue":
                name = u.arg.name
                seen.setdefault(None if name == "queue" else name.split(":", 1)[1])
    return list(seen)


def timeline_event(graph: UOp, program: Program) -> str | None:
    """The Program's timeline (module docstring): ``event`` when ``program`` has the default queue's timeline,
    else ``event:<queue>`` of the first queue of ``graph`` (the graph ``program`` was lowered from; ``queue_order``)
    whose timeline ``program`` has; never a shared event; None when it has no queue's timeline."""
    events = {o.name for o in program.objects.values() if o.kind == "event"}
    if "event" in events:
        return "event"
    for queue in queue_order(graph):
        if queue is not None and f"event:{queue}" in events:
            return f"event:{queue}"
    return None
