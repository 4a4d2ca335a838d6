"""Pointers to vectors in the forms ``access`` does not see as a name or a dereference (``guard``): a
parenthesised pointer indexed or followed by ``->`` (``pointer_group``: ``((device float4*)(a + 1))[i]``,
``(c ? p : q)[i]``, ``(&p[1])->y``), ``&p[i]`` kept an address, comparisons of pointers into one buffer
(``for (device float4* q = p; q < p + 2; ++q)``), and the refusal of arrays of vector pointers and pointers to
them, in the translations with and without checks alike; with the one ``Bound`` a pointer expression's tracked
names share (``_bound_of``).
"""
from __future__ import annotations

from mtlir.runtime.sim.msl.guard.bound import _HOW, _SPACES, Bound
from mtlir.runtime.sim.msl.guard.scan import _is_cast, _operand_end, _pointee, _pointer_names, _unary, group_start
from mtlir.runtime.sim.msl.guard.vector import VectorAccess, checked, vector_access
from mtlir.runtime.sim.msl.lex import ID, PUNCT, RAW, Token
from mtlir.runtime.sim.msl.names import VECTORS
from mtlir.runtime.sim.msl.rewrite import Ctx, TokenMatch, at, group_end, refuse, rewrite, tok

__all__ = ["pointer_group"]


def _bound_of(ts: list[Token], names: list[int], ctx: Ctx, where: Token, what: str) -> Bound:
    """The one Bound the tracked names at ``names`` share; refuses none, several, or an unassigned variable."""
    assert ctx.guard is not None
    ptrs = ctx.guard.ptrs
    bounds = {ptrs[ts[j].text] for j in names}
    if None in bounds:
        name = next(ts[j].text for j in names if ptrs[ts[j].text] is None)
        refuse(where, name, f"the pointer variable `{name}` is used in {what} before it is initialised or "
                            f"assigned from a buffer, so its accesses cannot be bounds-checked ({_HOW})")
    if len(bounds) != 1:
        which = ", ".join(sorted({ts[j].text for j in names}))
        refuse(where, which, f"{what} mixes the buffer pointers {which}: the translator cannot tell which "
                             f"buffer it points into, so it cannot bounds-check it ({_HOW})")
    b = bounds.pop()
    assert b is not None
    return b


def _checking(ctx: Ctx) -> bool:
    return ctx.guard is not None and ctx.guard.checked


_COMPARE = frozenset({"<", ">", "<=", ">=", "==", "!="})


def _compared(ts: list[Token], i: int, ctx: Ctx) -> bool:
    """True when the tracked name at ``i`` is (the first term of) the left operand of a comparison whose two operands
    are pointers into the one same buffer: ``q < p + 2``, ``r != (device float4*)(a + 8)``, the operands grown
    through sums, parentheses and casts. Such a comparison reads no memory and gives what it gives on Metal (the
    buffer's layout is the same); the names of both operands are then let through (``Guard.allow``). Comparing
    pointers into two buffers, or a pointer with anything else, stays refused."""
    assert ctx.guard is not None
    s, e = i, i + 1
    while True:
        while at(ts, e).text in ("+", "-"):
            e = _operand_end(ts, e + 1, ctx)
        if at(ts, s - 1).text == "(" and group_end(ts, s - 1) == e:
            s, e = s - 1, e + 1
        elif at(ts, s - 1).text == ")" and _is_cast(ts, group_start(ts, s - 1), ctx):
            s = group_start(ts, s - 1)
        else:
            break
    if at(ts, e).text not in _COMPARE:
        return False
    r = _operand_end(ts, e + 1, ctx)
    while at(ts, r).text in ("+", "-"):
        r = _operand_end(ts, r + 1, ctx)
    names = _pointer_names(ts, s, e, ctx)
    other = _pointer_names(ts, e + 1, r, ctx)
    ptrs = ctx.guard.ptrs
    bounds = {ptrs[ts[j].text] for j in names + other}
    if not other or len(bounds) != 1 or None in bounds:
        return False
    ctx.guard.allow([ts[j] for j in names + other])
    return True


def _address_of_element(ts: list[Token], i: int, ctx: Ctx) -> bool:
    """True when the name at ``i`` is ``p`` of ``&p[e]`` with nothing after the ``]`` that accesses the vector
    (``.x``, ``[j]``): an address, ``p + e``; for a vector pointer it stays one (the checked ``&(*(...))`` with
    checks), not a load whose address cannot be taken."""
    if i == 0 or ts[i - 1].text != "&" or not _unary(ts, i - 1, ctx) or at(ts, i + 1).text != "[":
        return False
    return at(ts, group_end(ts, i + 1) + 1).text not in (".", "->", "[")


def _group_pointer(ts: list[Token], i: int, ctx: Ctx) -> tuple[list[Token], str, str, Bound | None] | None:
    """The parenthesised pointer to vectors at ``i`` (``(c ? p : q)``, ``((device float4*)(a + 1))``, ``(&p[1])``):
    its OpenCL tokens, vector type, memory and the ``Bound`` of the one buffer its tracked names point into (None:
    a threadgroup or thread pointer the checks do not track); None when the translator cannot type it as a pointer
    to vectors. Refuses a device pointer from no buffer (with checks) and pointers into two buffers."""
    close = group_end(ts, i)
    got = _pointee(ts, i + 1, close, ctx)
    if got is None:
        return None
    vector, space = got
    names = _pointer_names(ts, i + 1, close, ctx)
    bound: Bound | None = None
    if names:
        bound = _bound_of(ts, names, ctx, ts[i], "this pointer")
        assert ctx.guard is not None
        ctx.guard.allow([ts[j] for j in names])
        space = bound.space
    elif _checking(ctx) and any(t.kind == ID and t.text in _SPACES for t in ts[i + 1:close]):
        refuse(ts[i], "(...)[i]", "an access through a device or constant pointer that does not come from a buffer "
                                  f"parameter: the simulated device cannot bounds-check it ({_HOW})")
    if space is None:
        return None
    return [tok("("), *rewrite(ts, ctx, i + 1, close), tok(")")], vector, space, bound


def pointer_group(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """A parenthesised pointer to vectors indexed or followed by ``->``: ``((device float4*)(a + 1))[i]``,
    ``(c ? p : q)[i].x = e``, ``(&p[1])->y``, ``(e, p)[i]``: the vector access at ``(X) + (i)`` or ``(X)``
    (``vector.vector_access``; the pointer ``X`` evaluated once, checked against the one buffer its tracked names
    point into, as for ``p[i]``). Declines a cast, call arguments, and a group the translator cannot type as a
    pointer to vectors; refuses a device pointer from no buffer, and pointers into two buffers."""
    g = ctx.guard
    if g is None or _is_cast(ts, i, ctx):
        return None
    close = group_end(ts, i)
    nxt = at(ts, close + 1)
    before = at(ts, i - 1)
    if nxt.kind != PUNCT or nxt.text not in ("[", "->") or before.text in (")", "]") or (
            before.kind == ID and before.text not in ("return", "case", "sizeof", "else", "do")):
        return None
    typed = _group_pointer(ts, i, ctx)
    if typed is None:
        return None
    pointer, vector, space, bound = typed
    member: int | None = close + 1
    end = close + 1
    if nxt.text == "[":
        bracket = group_end(ts, close + 1)
        index = rewrite(ts, ctx, close + 2, bracket)
        pointer += [tok("+", PUNCT, " "), tok("(", PUNCT, " "), *index, tok(")")]
        member, end = None, bracket + 1
        if before.text == "&" and _unary(ts, i - 1, ctx) and at(ts, end).text not in (".", "->", "["):
            a, check = checked(bound, False, ctx)  # `&(X)[i]`: an address, `&(*(...))`, not a load
            return end - i, [tok(f"(*({{ __auto_type {a} = (", RAW), *pointer, tok(f"); {check}; }}))", RAW)]
    k, out = vector_access(ts, i, end, VectorAccess(tuple(pointer), vector, space, bound), ctx, member)
    return k - i, out


def _refuse_pointer_array(ts: list[Token], i: int, j: int, ctx: Ctx) -> None:
    """Refuses ``device float4* ps[2]`` and ``thread device float4** pp`` (the address space at ``i``, what follows
    the first ``*`` at ``j``): an array of pointers to vectors, a pointer to pointers to vectors, in the
    translations with and without checks alike. The translator tracks pointer variables by name:
    it could neither check an access through ``ps[k]`` nor type it as a vector (it would dereference the vector
    pointer, which faults on NVIDIA's OpenCL when the vector is not aligned to its size)."""
    name = at(ts, j)
    if ctx.scope == "program" or not any(t.kind == ID and t.text in VECTORS for t in ts[i + 1:j]):
        return
    if name.kind == PUNCT and name.text == "*":
        refuse(name, "**", "a pointer to a pointer to vectors: the translator follows vector pointers only as named "
                           "variables, so it could neither check nor type an access through it")
    if name.kind == ID and at(ts, j + 1).text == "[":
        refuse(name, name.text, f"`{name.text}` is an array of pointers to vectors: the translator follows vector "
                                "pointers only as named variables (declare one pointer variable per pointer)")
