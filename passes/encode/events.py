"""Checking a read SUBMIT's events once every queue is read: waits that can never complete (on a queue of the
program's timeline, or a queue's own timeline) and signals whose value does not go up (METAL.md §3 rule 12); and
the notes on signals only a Program's first submit can make (``replay_notes``: a constant value).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mtlir.ir.bounds import bounds, expr_text
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp
from mtlir.frontend.nodes import timeline_name
from mtlir.passes.encode.commands import EncodeError, QueueRange
from mtlir.passes.symbolic import simplify

if TYPE_CHECKING:
    from mtlir.passes.encode.submit import SubmitReader

__all__ = ["check_events", "replay_notes"]


def _of(name: str | None) -> str:
    return "" if name is None else f" of queue {name!r}"


def _goes_down(prev: UOp, value: UOp, equal: bool = False) -> bool:
    """Whether ``value`` is below ``prev`` (``equal``: or equal to it) for every value of their variables (by their
    bounds, or as a constant difference of the same expression)."""
    if prev.op is Ops.CONST and value.op is Ops.CONST:  # the usual signal values: no bounds to compute
        return bool(value.arg < prev.arg or (equal and value.arg == prev.arg))
    if bounds(value)[1] < bounds(prev)[0] or (equal and bounds(value)[1] <= bounds(prev)[0]):
        return True
    (base0, k0), (base1, k1) = _offset(prev), _offset(value)
    return base0 is base1 and (k1 < k0 or (equal and k1 == k0))


def _previous_submit(value: UOp) -> UOp | None:
    """``value`` as a previous submit signaled it at the most: the timeline variable (``timeline``, the last value
    + 1 by default, and increasing from submit to submit) one lower; None when ``value`` does not use it."""
    base, k = _offset(value)
    if base.op is not Ops.DEFINE_VAR or base.arg[0] != "timeline":
        return None
    d = k - 1
    return simplify(base + d if d >= 0 else base - (-d))


def _offset(u: UOp) -> tuple[UOp, int]:
    """``u`` as ``base + k`` with ``k`` a constant (``v - 1``: ``(v, -1)``)."""
    if u.op in (Ops.ADD, Ops.SUB) and u.src[1].op is Ops.CONST:
        base, k = _offset(u.src[0])
        return base, k + int(u.src[1].arg) * (1 if u.op is Ops.ADD else -1)
    return u, 0


def check_events(reader: SubmitReader) -> None:
    """Refuse what can never complete, once every queue is read: a wait on the timeline of a queue of the program
    for a value no queue signals (no signal of that event, or every signal's largest value below the wait's
    smallest), and signals of one event on one queue whose value goes down (Metal ignores the smaller one: a
    wait for it may never end, METAL.md §3 rule 12). A wait on an event that is no queue's timeline (a
    ``shared_event``) is left to the host, which may signal it. Raises ``EncodeError`` naming the queue op."""
    timelines = {timeline_name(q.name) for q in reader.queues}
    const = Ops.CONST
    signaled: dict[UOp, list[UOp]] = {}
    for q in reader.queues:
        last: dict[UOp, UOp] = {}
        for pos, kind, value, ev in q.marks:
            if kind != "signal":
                continue
            prev = last.get(ev)
            if prev is not None and prev.op is const and value.op is const and value.arg > prev.arg:
                pass  # two constants going up (the usual signals): neither check below can fail
            elif prev is not None and _goes_down(prev, value):
                raise EncodeError(f"signal after command {pos - q.first}{_of(q.name)}: {ev.arg.name} goes down "
                                  f"from {expr_text(prev)} to {expr_text(value)}; an event's value only "
                                  "increases, Metal ignores the smaller one (METAL.md §3 rule 12)")
            elif prev is not None and _goes_down(prev, value, equal=True):
                raise EncodeError(f"signal after command {pos - q.first}{_of(q.name)}: {ev.arg.name} does not go "
                                  f"up from {expr_text(prev)} to {expr_text(value)} (the same value again); an "
                                  "event's value only increases, a value it already has is refused (METAL.md "
                                  "§3 rule 12)")
            last[ev] = value
            signaled.setdefault(ev, []).append(value)
    for q in reader.queues:
        for pos, kind, value, ev in q.marks:
            if kind != "wait" or ev.arg.name not in timelines:
                continue
            values = signaled.get(ev, [])
            where = f"wait after command {pos - q.first}{_of(q.name)}: {ev.arg.name} >= {expr_text(value)}"
            if not values:
                raise EncodeError(f"{where}: no queue of the program signals {ev.arg.name}, so the wait can "
                                  "never complete")
            top = max(bounds(v)[1] for v in values)
            if bounds(value)[0] > top:
                raise EncodeError(f"{where}: the queues signal {ev.arg.name} up to {top} at most, so the wait "
                                  "can never complete")
    for qname, pos, value, ev, nbefore in reader.own_waits:
        _check_own_wait(reader, qname, pos, value, ev, nbefore, signaled.get(ev, []))


def replay_notes(reader: SubmitReader) -> list[str]:
    """The lowering's notes on signals only the first submit of the Program can make: a signal of a constant value
    (one per queue and event, the first), which every submit sends again and Metal ignores from the second submit
    on (the event already has that value, METAL.md §3 rule 12), so a wait for it passes at once and orders nothing
    (strict mode refuses it at the second submit; faithful mode runs on, as Metal does)."""
    notes = []
    for q in reader.queues:
        seen: set[UOp] = set()
        for pos, kind, value, ev in q.marks:
            if kind == "signal" and value.op is Ops.CONST and ev not in seen:
                seen.add(ev)
                notes.append(f"encode: signal after command {pos - q.first}{_of(q.name)}: {ev.arg.name} gets the "
                             f"constant {value.arg} at every submit; from the second submit on Metal ignores it (the "
                             "event has that value already, METAL.md §3 rule 12) and a wait for it passes at once: "
                             "signal a value that grows per submit (timeline_value(), or an expression of it)")
    return notes


def _check_own_wait(reader: SubmitReader, qname: str | None, pos: int, value: UOp, ev: UOp, nbefore: int,
                    values: list[UOp]) -> None:
    """Refuse a wait on a queue's own timeline (which lowers to nothing) for a value that nothing before it can
    have signaled: neither a signal of that event earlier on the queue in the same submit nor the previous
    submit's signals (the timeline variable one lower: ``wait(q.timeline, v - 1)`` is fine, ``v`` or ``v + 5``
    before the ``signal(q.timeline, v)`` is not). Left alone when another queue signals the event too."""
    if bounds(value)[0] == 0:
        return                                   # an event starts at 0
    where = f"wait after command {pos}{_of(qname)}: {ev.arg.name} >= {expr_text(value)}"
    if not values:
        raise EncodeError(f"{where}: no queue of the program signals {ev.arg.name}, so the wait can never "
                          "complete")
    mine = next(q for q in reader.queues if q.name == qname)
    if any(e is ev and kind == "signal" for q in reader.queues if q is not mine for _, kind, _, e in q.marks):
        return
    earlier = [v for _, kind, v, e in mine.marks[:nbefore] if kind == "signal" and e is ev]
    previous = [v if (p := _previous_submit(v)) is None else p for v in values]
    if all(_goes_down(value, v) for v in earlier + previous):
        reach = ", ".join(dict.fromkeys(expr_text(v) for v in earlier + previous))
        raise EncodeError(f"{where}: the queue's own timeline is at most {reach} there (its signals before the "
                          "wait in this submit and the previous submit's), so the wait can never complete (a "
                          "wait on the own timeline is encoded as nothing: the fence orders the queue)")
