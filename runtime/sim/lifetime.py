"""Object lifetimes on the simulated device: what happens when an object's last reference goes.

``SimDevice`` keeps the object table and the retain counts (``retain``, ``release``); at zero ``release`` calls
``dealloc`` here. A command buffer holds what was encoded into it (retainedReferences YES) until it ends or is
deallocated uncommitted (``release_references``); an uncommitted one never runs, so its fence updates and signals
are undone. The lifetime table of docs/simulator.md, the rules of METAL.md §3 (2: endEncoding before release, 14: a
resource freed while a command buffer reaches it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mtlir.metal import MTL
from mtlir.runtime.sim.objects import (Buffer, ClassObject, CommandBuffer, Encoder, NSError, NSString, Pipeline,
                                       SignalStep, SimObject)
from mtlir.runtime.sim.rules.checks import check_release
from mtlir.runtime.sim.rules.rule import Rule, assertion
from mtlir.runtime.sim.waiting import notify_waiters

if TYPE_CHECKING:
    from mtlir.runtime.sim.device import SimDevice

__all__ = ["dealloc", "release_references"]


def release_references(dev: SimDevice, cb: CommandBuffer) -> None:
    """``cb`` lets go of the objects encoded into it (``retained``), newest first: when it completes, or when it
    is deallocated uncommitted (retainedReferences YES; docs/simulator.md, object lifetimes). A release that
    deallocates an object an in-flight command buffer still reaches through ICB commands fails that command
    buffer (and, in strict mode, raises at the host's next call: ``check_release``)."""
    held, cb.retained = cb.retained, {}
    for obj in reversed(held):
        if obj.rc > 1 and obj.alive and not isinstance(obj, ClassObject):
            obj.rc -= 1  # another reference stays (``SimDevice.release``): nothing to check, no message to build
        else:
            dev._release_internal(obj, f"the release of its references by {cb.describe()}")


def dealloc(dev: SimDevice, obj: SimObject, call: str, at_host: bool = True) -> None:
    """``obj``'s last reference went (``SimDevice.release``): rule 14 is checked first (``check_release``: strict
    mode raises at the host's call before anything changes), then it is dead and out of the object table
    (``SimDevice.retire``), and what it held goes: an encoder not ended is an assert (rule 2); a command buffer
    never committed is discarded (``_discard_uncommitted``) and lets go of its references; a buffer's and a
    pipeline's kept launches are forgotten (``Executor.forget``), a buffer's host memory and a string's C copy
    released; an NSError releases its description. Raises ``MetalValidationError`` (rules 2 and 14)."""
    check_release(dev, obj, call, at_host)  # rule 14: strict raises at the host's call before anything changes
    obj.rc, obj.alive = 0, False
    dev.retire(obj)
    if isinstance(obj, Encoder):
        if not obj.ended:
            raise assertion(Rule.END_ENCODING_BEFORE_RELEASE, f"{call} of {obj.describe()}",
                            "Command encoder released without endEncoding")
    elif isinstance(obj, CommandBuffer):
        if obj.status < MTL.StatusCommitted:
            obj.queue.live.discard(obj)
            _discard_uncommitted(obj)
            release_references(dev, obj)
            notify_waiters(dev._cv)
        if obj.error is not None:
            dev._release_internal(obj.error)
        obj.steps = []  # its encoders point back at it (``Encoder.cb``): the cycle goes with the last reference,
        obj.open_encoder = None  # so refcounting frees both, not the cyclic GC (14 objects per submit before)
    elif isinstance(obj, Buffer):
        dev.gpu.executor.forget(obj)
        if obj.region is not None:
            dev.memory.release(obj.region)
    elif isinstance(obj, Pipeline):
        dev.gpu.executor.forget(obj)
    elif isinstance(obj, NSString):
        if obj.cstr is not None:
            dev.memory.release(obj.cstr)
    elif isinstance(obj, NSError):
        dev._release_internal(obj.description)


def _discard_uncommitted(cb: CommandBuffer) -> None:
    """A command buffer released without commit never runs (what Metal does with it): its encoders' fence updates
    never happen, so a fence updated last by one of them goes back to its previous updater and a wait already
    encoded on one of them does not block (``done``); its encoded signals are forgotten (rule 12 checks values
    that will really be signaled)."""
    for step in cb.steps:
        if isinstance(step, Encoder):
            step.discarded = step.done = True
            for fence in step.fence_updates:
                if fence.last_update is step:
                    prev = step.fence_prev.get(fence)
                    while prev is not None and prev.discarded:
                        prev = prev.fence_prev.get(fence)
                    fence.last_update = prev
        elif isinstance(step, SignalStep):
            step.event.settled(step.value, committed=False)
