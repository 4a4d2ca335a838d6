"""Hypothesis strategies of random valid queues (``queue_spec.QueueSpec``) for the differential fuzzing.

A queue: 3 or 4 int32 buffers of 64 to 128 elements (up to 2 of them buffer variables: inputs bound per submit,
alternating between two MTLBuffers), 0 to 2 run-time variables ``n0``, ``n1`` (bounds within [1, 64]), 1 to 6
commands: dispatches of the kernels of ``msl_library`` over random views (any buffer, any offset; views of one
buffer overlap freely across commands, so their order matters; within one dispatch the output overlaps no input,
except the elementwise kernel in place, whose threads each read and write their own element), each dispatch's
element count an int or a variable; or blits (a copy between views that do not overlap, a fill). Between them:
waits on the queue's timeline, signals of shared events and later waits on them, or (a profiled submit: never with
shared events or blits, which encode refuses) timestamps; 1 or 2 submits, each with its own values of the
variables; a random target (Apple7/Apple9, residency set or not, ICB or direct path, arm64/x86_64), the simulated
device strict or faithful, the compiled executor or the interpreter.

A blit's offsets and size may be run-time (a variable added to a view's first element, a variable element count).
A queue may use 2 or 3 command queues (never profiled: timestamps stay single-queue), each command on a random one,
committed in a random order: wherever a command touches bytes (one of the two writing) that a command of another
queue touched before it in the drawn order, and no wait orders them yet, the later one's queue waits for the
earlier one's (``synchronize``: a shared event signaled right after the earlier command, or the earlier queue's
timeline when that command ends its queue), so the drawn order is one the GPU may run and any it may run gives the
same bytes (``queue_spec.schedule``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from msl_library import LIBRARY
from queue_spec import Op, QueueSpec, Target, View

MAX_N = 64  # the largest element count of a dispatch: every buffer holds at least this many elements


def targets() -> st.SearchStrategy[Target]:
    """Every lowering target (family, residency set, ICB, ABI), strict or faithful, either executor."""
    return st.builds(Target, st.sampled_from(["Apple7", "Apple9"]), st.booleans(), st.booleans(),
                     st.sampled_from(["arm64", "x86_64"]), st.booleans(), st.sampled_from(["compiled", "interpreter"]))


def _view(draw: Any, sizes: tuple[int, ...], need: int, buffers: list[int]) -> View:
    """A view of at least ``need`` elements of one of ``buffers``."""
    b = draw(st.sampled_from(buffers))
    first = draw(st.integers(0, sizes[b] - need))
    return View(b, first, draw(st.integers(need, sizes[b] - first)))


def _overlaps(a: View, b: View) -> bool:
    return a.buffer == b.buffer and a.first < b.first + b.elems and b.first < a.first + a.elems


@st.composite
def dispatches(draw: Any, sizes: tuple[int, ...], variables: dict[str, tuple[int, int]]) -> Op:
    """One dispatch of a library kernel on views of the buffers (``sizes`` elements each)."""
    lib = draw(st.sampled_from(LIBRARY))
    n: int | str = draw(st.sampled_from(sorted(variables)) if variables and draw(st.booleans())
                        else st.integers(1, MAX_N))
    hi = variables[n][1] if isinstance(n, str) else n
    every = list(range(len(sizes)))
    ins = [_view(draw, sizes, 1 if lib.gathers and j == 0 else hi, every) for j in range(lib.inputs)]
    if lib.kernel.key == "ew" and draw(st.booleans()):
        out = ins[0]  # in place
    else:
        out = _view(draw, sizes, lib.outs(hi), every)
        if any(_overlaps(out, v) for v in ins):
            free = [b for b in every if all(v.buffer != b for v in ins)]  # 3+ buffers, 2 inputs at most
            out = _view(draw, sizes, lib.outs(hi), free)
    return Op("exec", lib.kernel.key, out, tuple(ins), n)


def _span(v: View, shift: str, variables: dict[str, tuple[int, int]]) -> View:
    """The elements a blit operand may touch for any value of its run-time ``shift``."""
    return View(v.buffer, v.first, v.elems + (variables[shift][1] if shift else 0))


@st.composite
def blits(draw: Any, sizes: tuple[int, ...], variables: dict[str, tuple[int, int]]) -> Op:
    """A copy between two views that do not overlap for any value of the variables (Metal leaves an overlapping
    copy undefined), or a fill; offsets and size constants or run-time (``Op.shift``, ``Op.src_shift``,
    ``Op.count``)."""
    every = list(range(len(sizes)))
    names = sorted(variables)
    count = draw(st.sampled_from(names)) if names and draw(st.booleans()) else ""
    elems = variables[count][1] if count else draw(st.integers(1, MAX_N))  # the most elements it moves

    def operand(choices: list[int]) -> tuple[View, str]:
        shift = draw(st.sampled_from(names)) if names and draw(st.booleans()) else ""
        room = elems + (variables[shift][1] if shift else 0)
        fits = [b for b in choices if sizes[b] >= room]
        if not fits:  # no buffer holds the view shifted by the variable's maximum: a constant offset
            shift, room, fits = "", elems, choices
        b = draw(st.sampled_from(fits))
        return View(b, draw(st.integers(0, sizes[b] - room)), elems), shift

    out, shift = operand(every)
    if draw(st.booleans()):
        return Op("fill", out=out, slot=draw(st.integers(0, 255)), shift=shift, count=count)
    src, src_shift = operand(every)
    if _overlaps(_span(out, shift, variables), _span(src, src_shift, variables)):
        src, src_shift = operand([b for b in every if b != out.buffer])
    return Op("copy", out=out, ins=(src,), shift=shift, src_shift=src_shift, count=count)


def _touches(op: Op, variables: dict[str, tuple[int, int]]) -> list[tuple[View, bool]]:
    """The elements a command may touch, as (view, written): a dispatch its views, a blit its operands' spans."""
    assert op.out is not None
    if op.kind == "exec":
        return [(op.out, True), *((v, False) for v in op.ins)]
    return [(_span(op.out, op.shift, variables), True), *((_span(v, op.src_shift, variables), False) for v in op.ins)]


def _conflict(a: Op, b: Op, variables: dict[str, tuple[int, int]]) -> bool:
    """Whether commands ``a`` and ``b`` may touch a common element, one of them writing it."""
    touched = _touches(b, variables)
    return any((wa or wb) and _overlaps(va, vb) for va, wa in _touches(a, variables) for vb, wb in touched)


def synchronize(draw: Any, ops: list[Op], variables: dict[str, tuple[int, int]], nqueues: int) -> list[Op]:
    """``ops`` (commands on random queues, and the waits and signals drawn with them) with the waits that order
    every two conflicting commands of different queues as drawn: before a command, its queue waits for each
    conflicting earlier command of another queue that nothing orders before it yet, on a shared event signaled
    right after that command (one per command, shared by every wait on it) or, when that command is the last
    operation of its queue, on that queue's timeline. What orders what is tracked with vector clocks (per queue,
    the index of the last command of each queue known to be done)."""
    first_slot = 1 + max((op.slot for op in ops if op.kind in ("signal", "event-wait")), default=-1)
    slots = iter(range(first_slot, 1 << 20))
    commands = [i for i, op in enumerate(ops) if op.kind in ("exec", "copy", "fill")]
    last = {op.queue: i for i, op in enumerate(ops)}  # the last operation of each queue, in the drawn order
    before: dict[int, list[Op]] = {}
    after: dict[int, Op] = {}
    clock: dict[int, list[int]] = {}  # a command's clock once run
    queue_clock = [[-1] * nqueues for _ in range(nqueues)]  # what each queue knows is done
    event_clock: dict[int, list[int]] = {}

    def join(into: list[int], other: list[int]) -> None:
        into[:] = [max(x, y) for x, y in zip(into, other)]

    for j, op in enumerate(ops):
        q = queue_clock[op.queue]
        if op.kind == "signal":
            event_clock[op.slot] = list(q)
        elif op.kind == "event-wait" and op.slot in event_clock:
            join(q, event_clock[op.slot])
        if j not in commands:
            continue
        for i in reversed([i for i in commands if i < j]):
            p = ops[i].queue
            if p == op.queue or q[p] >= i or not _conflict(ops[i], op, variables):
                continue
            if last[p] == i and draw(st.booleans()):
                wait = Op("queue-wait", slot=p, queue=op.queue)
            else:
                if i not in after:
                    after[i] = Op("signal", slot=next(slots), queue=p)
                wait = Op("event-wait", slot=after[i].slot, queue=op.queue)
            before.setdefault(j, []).append(wait)
            join(q, clock[i])
        q[op.queue] = j
        clock[j] = list(q)
    out: list[Op] = []
    for j, op in enumerate(ops):
        out += before.get(j, [])
        out.append(op)
        if j in after:
            out.append(after[j])
    return out


@st.composite
def queue_specs(draw: Any) -> QueueSpec:
    """A random valid queue (module docstring)."""
    sizes = tuple(draw(st.lists(st.integers(MAX_N, 2 * MAX_N), min_size=3, max_size=4)))
    variables = {}
    for name in ("n0", "n1")[:draw(st.integers(0, 2))]:
        lo = draw(st.integers(1, MAX_N))
        variables[name] = (lo, draw(st.integers(lo, MAX_N)))
    nqueues = draw(st.sampled_from([1, 1, 2, 3]))
    profiled = nqueues == 1 and draw(st.booleans()) and draw(st.booleans())
    ops: list[Op] = []
    signaled: list[int] = []
    slots = iter(draw(st.permutations(range(8))))
    for _ in range(draw(st.integers(1, 6))):
        blit = not profiled and draw(st.integers(0, 3)) == 0  # encode refuses blits in a profiled submit
        op = draw(blits(sizes, variables) if blit else dispatches(sizes, variables))
        queue = draw(st.integers(0, nqueues - 1))
        ops.append(replace(op, queue=queue))
        extra = draw(st.sampled_from(["none", "none", "wait", "event"]))
        if profiled and extra != "none":
            ops.append(Op("timestamp", slot=next(slots)))
        elif extra == "wait":
            ops.append(Op("wait", queue=queue))
        elif extra == "event":
            if signaled and draw(st.booleans()):
                ops.append(Op("event-wait", slot=draw(st.sampled_from(signaled)), queue=queue))
            elif len(signaled) < 3:
                signaled.append(len(signaled))
                ops.append(Op("signal", slot=signaled[-1], queue=queue))
    used = sorted({op.queue for op in ops})  # queues numbered in order, none without operations
    ops = [replace(op, queue=used.index(op.queue)) for op in ops]
    order: tuple[int, ...] = ()
    if len(used) > 1:
        ops = synchronize(draw, ops, variables, len(used))
        order = tuple(draw(st.permutations(range(len(used)))))
    submits = tuple(draw(st.lists(st.fixed_dictionaries({k: st.integers(lo, hi) for k, (lo, hi) in variables.items()}),
                                  min_size=1, max_size=2)))
    inputs = tuple(sorted(draw(st.sets(st.integers(0, len(sizes) - 1), max_size=2))))
    return QueueSpec(sizes, draw(st.integers(0, 2**16)), variables, tuple(ops), submits, draw(targets()), inputs,
                     order)
