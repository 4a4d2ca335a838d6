"""Deadlocks of event waits and queue capacity: work that can only go on once work it blocks has run.

``find_deadlock`` runs the committed command buffers forward on paper, queue by queue in commit order, with the
events' values as the GPU alone could raise them (its encoded ``encodeSignalEvent:value:`` steps; fence waits are
taken as passable). Command buffers that never get past an ``encodeWaitForEvent:value:`` are stuck. Two shapes are
deadlocks:

- a wait cycle (METAL.md §3 rule 17): stuck queue heads whose every wait can only be satisfied by a signal that a
  stuck command buffer encoded (one behind the waiter on its own queue, or on a queue whose head waits in turn), and
  by no command buffer still being encoded;
- queue capacity (rule 7): the host is blocked in ``commandBuffer`` on a queue with maxCommandBufferCount command
  buffers not completed, and none of them can complete without work the host would encode after that call.

A wait that no command buffer signals is not a deadlock: the host may still ``setSignaledValue:``; but a host
blocked in ``commandBuffer`` signals nothing, so the capacity check assumes no other host thread will (the
simulator cannot see one coming; such a program gets the diagnosis in strict mode, and a wait in faithful mode).
Strict mode raises the description at ``commit`` or ``commandBuffer``; faithful mode hangs as Metal does, and the
GPU watchdog ends the stuck command buffers with the same description (docs/simulator.md).
"""
from __future__ import annotations

from collections.abc import Iterable

from mtlir.metal import MTL

from mtlir.runtime.sim.objects import CommandBuffer, CommandQueue, SharedEvent, SignalStep, WaitStep
from mtlir.runtime.sim.rules.rule import Rule

__all__ = ["Deadlock", "find_deadlock", "may_deadlock"]


class Deadlock:
    """A diagnosed deadlock: the ``rule`` it breaks (7: capacity, 17: a wait cycle), its ``description`` (the
    queues, command buffers, events and values) and ``members``, the stuck queue heads the watchdog ends."""

    __slots__ = ("rule", "description", "members")

    def __init__(self, rule: Rule, description: str, members: frozenset[CommandBuffer]) -> None:
        self.rule, self.description, self.members = rule, description, members


def may_deadlock(cb: CommandBuffer) -> bool:
    """Cheap test before ``find_deadlock`` at a commit: ``cb`` or an earlier pending command buffer of its queue has
    a wait for a value its event has not reached (a new deadlock always has such a wait on the committed queue)."""
    return any(isinstance(s, WaitStep) and s.event.value < s.value
               for c in (*cb.queue.pending, cb) for s in c.steps)


class _Run:
    """The committed command buffers run forward with the events' GPU-reachable values."""

    def __init__(self, queues: Iterable[CommandQueue]) -> None:
        self.queues = list(dict.fromkeys(queues))
        self.values: dict[SharedEvent, int] = {}
        self.pos: dict[CommandBuffer, int] = {}
        self.head: dict[CommandQueue, int] = {q: 0 for q in self.queues}
        self.completed: set[CommandBuffer] = set()
        progress = True
        while progress:
            progress = False
            for q in self.queues:
                while self.head[q] < len(q.pending):
                    cb = q.pending[self.head[q]]
                    moved, done = self._advance(cb)
                    progress |= moved
                    if not done:
                        break
                    self.completed.add(cb)
                    self.head[q] += 1
                    progress = True

    def value(self, ev: SharedEvent) -> int:
        return self.values.get(ev, ev.value)

    def _advance(self, cb: CommandBuffer) -> tuple[bool, bool]:
        i, moved = self.pos.get(cb, 0), False
        while i < len(cb.steps):
            s = cb.steps[i]
            if isinstance(s, WaitStep) and self.value(s.event) < s.value:
                break
            if isinstance(s, SignalStep) and not s.fired and s.value > self.value(s.event):
                self.values[s.event] = s.value
                moved = True
            i += 1
        self.pos[cb] = i
        return moved, i == len(cb.steps)

    def stuck_heads(self) -> dict[CommandBuffer, WaitStep]:
        """Each queue's first command buffer that does not complete, with the wait it stops at."""
        out: dict[CommandBuffer, WaitStep] = {}
        for q in self.queues:
            if self.head[q] < len(q.pending):
                cb = q.pending[self.head[q]]
                step = cb.steps[self.pos[cb]]
                assert isinstance(step, WaitStep)
                out[cb] = step
        return out

    def signallers(self, wait: WaitStep) -> list[tuple[CommandBuffer, int]]:
        """The stuck command buffers that encoded a signal reaching the wait's value, with that value."""
        found: list[tuple[CommandBuffer, int]] = []
        for q in self.queues:
            for cb in q.pending[self.head[q]:]:
                for s in cb.steps[self.pos.get(cb, 0):]:
                    if isinstance(s, SignalStep) and s.event is wait.event and s.value >= wait.value:
                        found.append((cb, s.value))
                        break
        return found

    def describe_wait(self, cb: CommandBuffer, wait: WaitStep) -> str:
        ev = wait.event
        text = (f"{cb.describe()} of {cb.queue.describe()} waits for {ev.describe()} to reach {wait.value} "
                f"(it is {ev.value})")
        by = self.signallers(wait)
        if by:
            names = []
            for sig, value in by:
                head = sig.queue.pending[self.head[sig.queue]]
                where = ("after that wait" if sig is cb else "behind it on the same queue" if head is cb
                         else f"behind {head.describe()} on {sig.queue.describe()}" if head is not sig
                         else f"on {sig.queue.describe()} after its own wait")
                names.append(f"{sig.describe()} ({value}, {where})")
            text += ", a value only " + " and ".join(names) + " signals"
        elif any(v >= wait.value for v in ev.uncommitted):
            text += ", a value only a command buffer not yet committed signals"
        else:
            text += ", a value no command buffer signals (only the host's setSignaledValue: could)"
        return text


def find_deadlock(queues: Iterable[CommandQueue], blocked: CommandQueue | None = None) -> Deadlock | None:
    """The deadlock among the committed work of ``queues``, or None. ``blocked``: a queue the host is blocked on in
    ``commandBuffer`` (maxCommandBufferCount command buffers not completed): a deadlock when none of them can
    complete (rule 7). Otherwise a wait cycle (rule 17), or None (a wait on the host is not a deadlock)."""
    run = _Run([*queues, *([blocked] if blocked is not None else [])])
    heads = run.stuck_heads()
    if blocked is not None and not any(cb in run.completed for cb in blocked.live):
        uncommitted = sum(1 for cb in blocked.live if cb.status < MTL.StatusCommitted)
        parts = [run.describe_wait(cb, w) for cb, w in heads.items()]
        if uncommitted:
            parts.append(f"{uncommitted} of them not committed")
        return Deadlock(Rule.IN_FLIGHT_LIMIT,
                        f"deadlock: commandBuffer on {blocked.describe()} blocks until one of its "
                        f"{len(blocked.live)} command buffers (maxCommandBufferCount {blocked.max_count}) completes, "
                        "and none can without work encoded after it: " + "; ".join(parts),
                        frozenset(heads))
    dead = {cb for cb, w in heads.items()
            if run.signallers(w) and not any(v >= w.value for v in w.event.uncommitted)}
    changed = True
    while changed:
        changed = False
        for cb in list(dead):
            if any(sig.queue.pending[run.head[sig.queue]] not in dead for sig, _ in run.signallers(heads[cb])):
                dead.discard(cb)
                changed = True
    if not dead:
        return None
    ordered = sorted(dead, key=lambda c: c.seq)
    queues_named = ", ".join(dict.fromkeys(c.queue.describe() for c in ordered))
    return Deadlock(Rule.DEADLOCK,
                    f"deadlock of {queues_named}: " + "; ".join(run.describe_wait(c, heads[c]) for c in ordered)
                    + "; none of them can go on", frozenset(dead))
