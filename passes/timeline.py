"""The timeline read: the tiny Program the runtime runs to read the timeline's value, lowered with each submit.

The timeline is the device's MTLSharedEvent (METAL.md §1, host side): reading its value is ``signaledValue``
(uint64), one message on the event placeholder. ``timeline_read(device)`` is that message as typed messages (the
stage ``encode`` produces), ``timeline_read_program(device, target)`` the same lowered through the passes that
follow encode (``abi``, ``linearize``): its one result, ``results["timeline"]``, is the value. ``lower`` puts it
into every Program that uses the event (``Program.timeline_read``), so the runtime reads the timeline over the
objects it linked without calling back into the passes.
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

__all__ = ["TIMELINE_RESULT", "timeline_read", "timeline_read_program", "uses_timeline"]

TIMELINE_RESULT = "timeline"  # the name of the read's result (``Program.results``)


def timeline_read(device: DeviceSpec) -> UOp:
    """The host read of the timeline as typed messages: ``SINK(MSG<uint64> 'signaledValue' (OBJECT event))``,
    the root's arg ``device``, the message tagged ``TIMELINE_RESULT`` (linearize makes it the Program's result of
    that name)."""
    read = UOp(Ops.MSG, dtypes.uint64, (timeline(),), "signaledValue", TIMELINE_RESULT)
    return UOp(Ops.SINK, dtypes.void, (read,), device)


def timeline_read_program(device: DeviceSpec, target: str = "arm64") -> Program:
    """The Program that reads the timeline's value (``signaledValue``) on ``device`` for ``target`` (``arm64`` or
    ``x86_64``), lowered by ``abi`` and ``linearize`` like a submit's messages;
    ``program.results["timeline"]`` is the register of the value. Raises ``ValueError`` for an unknown target.

    Lowered once per (device, target) and kept: lowering it again for every submit's Program was ~60 µs, about a
    tenth of the fixed cost of lowering a queue. Each call returns a copy of its own (its instruction list and
    tables new, a few µs): a ``Program`` is mutable, and one handed to several Programs was changed through one of
    them (a test's, rebinding its ``objects``), which broke every Program lowered after it in the process."""
    key = (device, target)
    got = _READS.get(key)
    if got is None:
        pipeline = PassPipeline((Abi(target), Linearize()), start="messages")
        got = pipeline.run(timeline_read(device), keep_stages=False).program
        if len(_READS) < 64:  # a handful of devices in practice: the cache stays small
            _READS[key] = got
    return dataclasses.replace(got, instrs=list(got.instrs), consts=dict(got.consts), objects=dict(got.objects),
                               selectors=dict(got.selectors), variables=dict(got.variables), names=dict(got.names),
                               results=dict(got.results))


_READS: dict[tuple[DeviceSpec, str], Program] = {}  # (device, target) -> the timeline read, lowered once


def uses_timeline(program: Program) -> bool:
    """Whether ``program`` has the default queue's event placeholder (``event``: it signals or waits on that
    timeline), so the runtime reads the timeline to know when its submits are done. (Other queues' timelines,
    ``event:<name>``, are read by the host with ``signaledValue`` on the linked event.)"""
    return any(o.kind == "event" and o.name == "event" for o in program.objects.values())
