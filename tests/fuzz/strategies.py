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
"""
from __future__ import annotations

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


@st.composite
def blits(draw: Any, sizes: tuple[int, ...]) -> Op:
    """A copy between two views that do not overlap (Metal leaves an overlapping copy undefined), or a fill."""
    every = list(range(len(sizes)))
    elems = draw(st.integers(1, MAX_N))
    out = _view(draw, sizes, elems, every)
    out = View(out.buffer, out.first, elems)
    if draw(st.booleans()):
        return Op("fill", out=out, slot=draw(st.integers(0, 255)))
    src = _view(draw, sizes, elems, every)
    src = View(src.buffer, src.first, elems)
    if _overlaps(out, src):
        src = View(next(b for b in every if b != out.buffer), 0, elems)
    return Op("copy", out=out, ins=(src,))


@st.composite
def queue_specs(draw: Any) -> QueueSpec:
    """A random valid queue (module docstring)."""
    sizes = tuple(draw(st.lists(st.integers(MAX_N, 2 * MAX_N), min_size=3, max_size=4)))
    variables = {}
    for name in ("n0", "n1")[:draw(st.integers(0, 2))]:
        lo = draw(st.integers(1, MAX_N))
        variables[name] = (lo, draw(st.integers(lo, MAX_N)))
    profiled = draw(st.booleans()) and draw(st.booleans())
    ops: list[Op] = []
    signaled: list[int] = []
    slots = iter(draw(st.permutations(range(8))))
    for _ in range(draw(st.integers(1, 6))):
        blit = not profiled and draw(st.integers(0, 3)) == 0  # encode refuses blits in a profiled submit
        ops.append(draw(blits(sizes) if blit else dispatches(sizes, variables)))
        extra = draw(st.sampled_from(["none", "none", "wait", "event"]))
        if profiled and extra != "none":
            ops.append(Op("timestamp", slot=next(slots)))
        elif extra == "wait":
            ops.append(Op("wait"))
        elif extra == "event":
            if signaled and draw(st.booleans()):
                ops.append(Op("event-wait", slot=draw(st.sampled_from(signaled))))
            elif len(signaled) < 3:
                signaled.append(len(signaled))
                ops.append(Op("signal", slot=signaled[-1]))
    submits = tuple(draw(st.lists(st.fixed_dictionaries({k: st.integers(lo, hi) for k, (lo, hi) in variables.items()}),
                                  min_size=1, max_size=2)))
    inputs = tuple(sorted(draw(st.sets(st.integers(0, len(sizes) - 1), max_size=2))))
    return QueueSpec(sizes, draw(st.integers(0, 2**16)), variables, tuple(ops), submits, draw(targets()), inputs)
