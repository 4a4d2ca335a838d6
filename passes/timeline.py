"""``lower-timeline``: a host read of the timeline becomes a ``signaledValue`` message on the shared event.

The timeline is the device's MTLSharedEvent (METAL.md §1, host side): reading its value is ``signaledValue``
(uint64). In the graph a host read is a LOAD of the event placeholder; sources after the first order the read after
those side effects, and stay as an AFTER on the receiver::

    LOAD<uint64> (OBJECT event, deps...)   ->   MSG<uint64> 'signaledValue' (AFTER(OBJECT event, deps...))

``timeline_read_program(device, target)`` is the tiny Program the runtime runs to read the timeline: its one
result, ``results["timeline"]``, is the value.
"""
from __future__ import annotations

from dataclasses import dataclass

from mtlir.ir.dtypes import dtypes
from mtlir.metal import DeviceSpec, Obj
from mtlir.ir.ops import Ops
from mtlir.passes.pipeline import Pass, PassContext, register
from mtlir.program.program import Program
from mtlir.frontend.queue import timeline
from mtlir.ir.rewrite import graph_rewrite
from mtlir.ir.upat import PatternMatcher, UPat
from mtlir.ir.uop import UOp

__all__ = ["LowerTimeline", "TIMELINE", "timeline_read", "timeline_read_program"]


def read_event(ld: UOp, ev: UOp) -> UOp | None:
    """A LOAD of the event placeholder -> ``signaledValue`` on it (the module docstring)."""
    if not isinstance(ev.arg, Obj) or ev.arg.kind != "event" or not ld.dtype.is_int:
        return None
    msg = UOp(Ops.MSG, dtypes.uint64, (ev.after(*ld.src[1:]),), "signaledValue", ld.tag)
    return msg if ld.dtype is dtypes.uint64 else msg.cast(ld.dtype)


# a LOAD of the event placeholder becomes signaledValue on the shared event
TIMELINE = PatternMatcher([
    (UPat(Ops.LOAD, src=(UPat(Ops.OBJECT, dtypes.id, name="ev"),), allow_any_len=True, name="ld"), read_event),
])


def timeline_read(device: DeviceSpec, name: str = "timeline") -> UOp:
    """The graph of a host read of the timeline: ``SINK(LOAD<uint64>(event), arg=device)``, the LOAD tagged
    ``name`` (the Program's result name)."""
    return UOp(Ops.SINK, dtypes.void, (UOp(Ops.LOAD, dtypes.uint64, (timeline(),), None, name),), device)


def timeline_read_program(device: DeviceSpec, target: str = "arm64") -> Program:
    """The Program that reads the timeline's value (``signaledValue``) on ``device`` for ``target``, lowered
    through the same passes as a submit; ``program.results["timeline"]`` is the register of the value."""
    from mtlir.passes import lower
    return lower(timeline_read(device), target=target, keep_stages=False).program


@register
@dataclass(frozen=True)
class LowerTimeline(Pass):
    """Host reads of the timeline -> ``signaledValue`` messages (module docstring)."""

    name = "lower-timeline"
    takes = ("messages",)

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        """``graph`` with every host read of the timeline made a ``signaledValue`` message."""
        return graph_rewrite(graph, TIMELINE, name="lower-timeline")
