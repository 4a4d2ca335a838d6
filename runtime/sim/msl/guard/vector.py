"""Vector accesses through pointers (``guard``): every read or write of a ``float4``/``half2``/... through a pointer
is a ``vloadN``/``vstoreN`` or an access to its elements, never a dereference of a vector pointer.

Metal lets a vector sit at any multiple of its element's size (a buffer offset, a cast ``(device float4*)(p + 1)``);
OpenCL C requires a vector dereference to be aligned to the vector's size (OpenCL C §6.1.5), and NVIDIA's OpenCL
faults on a misaligned one even through an element-aligned typedef (docs/kernels.md, "Vector loads and stores at
any offset"). ``vloadN``/``vstoreN`` need only the element's alignment (OpenCL C §6.15.10) and have ``__global``,
``__local`` and ``__private`` overloads. The forms (``VectorAccess``: the pointer evaluated once, checked against its
bound when there is one):

- a read -> ``vload4(0, (const __global float*)p)``; one component (``p->y``) -> the lvalue of that element;
- ``*p = e`` / ``*p += e`` -> ``vstore4`` of ``e`` / of ``vload4(...) + e``; the value is the stored vector;
- a store into a swizzle, ``p->xy = e``, ``(*p).zw += e`` -> each named element stored on its own (``p[0] =
  v.s0; ...``: the other elements are not written, as on Metal, so a neighbour's store is never undone);
- ``++*p``, ``(*p)--``, ``p->xy++`` -> load, add or subtract one, store; the value is the new or the old vector.
"""
from __future__ import annotations

from dataclasses import dataclass

from mtlir.runtime.sim.msl.guard.bound import Bound
from mtlir.runtime.sim.msl.guard.scan import _ASSIGN, _expression_end
from mtlir.runtime.sim.msl.lex import ID, PUNCT, RAW, Token
from mtlir.runtime.sim.msl.names import VECTORS
from mtlir.runtime.sim.msl.rewrite import Ctx, at, group_end, refuse, rewrite, tok

__all__ = ["VectorAccess", "checked", "swizzle", "vector_load", "vector_element", "vector_access",
           "vector_increment", "SPACE_QUALIFIER"]

SPACE_QUALIFIER = {"global": "__global", "local": "__local", "private": "__private"}
_COMPONENTS = ({c: k for k, c in enumerate("xyzw")}, {c: k for k, c in enumerate("rgba")})


@dataclass(frozen=True)
class VectorAccess:
    """One vector access being translated: ``pointer`` (OpenCL tokens of the pointer expression, evaluated once),
    ``vector`` (its OpenCL storage type: ``float4``, ``ushort2`` for a ``half2``), ``space`` (``global``,
    ``local``, ``private``) and the ``bound`` its accesses are checked against (None: unchecked, a threadgroup or
    thread pointer the checks do not track, or a translation without checks)."""

    pointer: tuple[Token, ...]
    vector: str
    space: str
    bound: Bound | None


def checked(bound: Bound | None, write: bool, ctx: Ctx) -> tuple[str, str]:
    """A new temporary's name and the check of it against ``bound`` (``__MTL_CHK(a, ...)``: the pointer itself, or
    the scratch area when out of range); the bare name when there is nothing to check against (no bound, or a
    translation without checks)."""
    g = ctx.guard
    assert g is not None
    n = g.counter
    g.counter += 1
    a = f"__mtl_a{n}"
    if bound is None or not g.checked:
        return a, a
    ctx.prelude.need_bounds_check()
    code = (f"{2 * int(bound.code) + 1 + int(write)}u" if bound.code.isdigit()
            else f"{bound.code} * 2u + {int(write) + 1}u")
    macro = {"global": "__MTL_CHK", "local": "__MTL_CHK_L", "private": "__MTL_CHK_P"}[bound.space]
    if bound.space != "global":
        g.scratch.add(bound.space)
    return a, f"{macro}({a}, {bound.start}, {bound.length}, {code})"


def swizzle(name: str, vector: str) -> list[int] | None:
    """The elements an MSL swizzle of ``vector`` names (``zx`` -> [2, 0]; ``xyzw`` or ``rgba`` letters, each inside
    the vector); None when ``name`` is no swizzle of it."""
    n = VECTORS[vector][1]
    for letters in _COMPONENTS:
        comps = [letters.get(c, 4) for c in name]
        if 1 <= len(comps) <= 4 and all(k < n for k in comps):
            return comps
    return None


def _pointer_text(acc: VectorAccess, write: bool, ctx: Ctx) -> tuple[Token, str, str]:
    """The opening of a statement expression that evaluates and checks the pointer once, ``({ __auto_type a = (``,
    the text after the pointer's tokens declaring the element pointer ``p`` (``); __global float* p = (__global
    float*)CHECK;``), and ``p``'s name."""
    a, check = checked(acc.bound, write, ctx)
    elem = VECTORS[acc.vector][0]
    sp = SPACE_QUALIFIER[acc.space]
    p = a.replace("_a", "_p")
    return tok(f"({{ __auto_type {a} = (", RAW), f"); {sp} {elem}* {p} = ({sp} {elem}*){check}; ", p


def vector_load(acc: VectorAccess, ctx: Ctx) -> list[Token]:
    """The read of the vector: ``vload4(0, (const __global float*)({ __auto_type a = (P); CHECK; }))``."""
    a, check = checked(acc.bound, False, ctx)
    elem, n = VECTORS[acc.vector]
    head = tok(f"vload{n}(0, (const {SPACE_QUALIFIER[acc.space]} {elem}*)({{ __auto_type {a} = (", RAW)
    return [head, *acc.pointer, tok(f"); {check}; }}))", RAW)]


def vector_element(acc: VectorAccess, k: int, write: bool, ctx: Ctx) -> list[Token]:
    """The lvalue of element ``k`` (``p->y``): ``vector_subscript``'s with the index ``k``, checked as an access of
    that one element, as Metal reads or writes only it (a vector straddling the buffer's end may have its in-bounds
    components read and written: before 2026-12-02, session 8c, the whole vector was checked)."""
    return vector_subscript(acc, [tok(str(k), RAW)], write, ctx)


def vector_subscript(acc: VectorAccess, index: list[Token], write: bool, ctx: Ctx) -> list[Token]:
    """The lvalue of element ``index`` (OpenCL tokens) of the vector, ``p[i][j]``: the element's own address,
    ``(*({ __auto_type a = (__global float*)(P) + (j); CHECK; }))``, checked as an access of one element (an index
    outside the vector, undefined on Metal, is still kept inside the buffer)."""
    a, check = checked(acc.bound, write, ctx)
    elem = VECTORS[acc.vector][0]
    head = tok(f"(*({{ __auto_type {a} = ({SPACE_QUALIFIER[acc.space]} {elem}*)(", RAW)
    return [head, *acc.pointer, tok(") + (", RAW), *index, tok(f"); {check}; }}))", RAW)]


def _gather(p: str, elem: str, comps: list[int] | None, n: int) -> str:
    """The elements ``comps`` of the vector at ``p`` as a value (all of it: ``vloadN``)."""
    if comps is None:
        return f"vload{n}(0, {p})"
    if len(comps) == 1:
        return f"{p}[{comps[0]}]"
    return f"(({elem}{len(comps)})({', '.join(f'{p}[{k}]' for k in comps)}))"


def _scatter(p: str, v: str, comps: list[int] | None, n: int) -> str:
    """The store of ``v`` into the elements ``comps`` of the vector at ``p`` (all of it: ``vstoreN``)."""
    if comps is None:
        return f"vstore{n}({v}, 0, {p});"
    if len(comps) == 1:
        return f"{p}[{comps[0]}] = {v};"
    return " ".join(f"{p}[{k}] = {v}.s{j};" for j, k in enumerate(comps))


def _store(acc: VectorAccess, comps: list[int] | None, op: str, rhs: list[Token], ctx: Ctx) -> list[Token]:
    """``*p op= rhs`` into the whole vector or the elements ``comps``: ``({ ...; float4 v = (rhs); vstore4(v, 0,
    p); v; })``, with ``v = vload4(0, p) + (rhs)`` for a compound operator."""
    head, mid, p = _pointer_text(acc, True, ctx)
    elem, n = VECTORS[acc.vector]
    vtype = acc.vector if comps is None else elem if len(comps) == 1 else f"{elem}{len(comps)}"
    v = p.replace("_p", "_v")
    value = "" if op == "=" else f"{_gather(p, elem, comps, n)} {op[:-1]} "
    tail = f"); {_scatter(p, v, comps, n)} {v}; }})"
    return [head, *acc.pointer, tok(f"{mid}{vtype} {v} = {value}(", RAW), *rhs, tok(tail, RAW)]


def vector_increment(acc: VectorAccess, comps: list[int] | None, op: str, prefix: bool, ctx: Ctx) -> list[Token]:
    """``++*p`` (``prefix``) or ``(*p)--`` of the whole vector or its elements ``comps``: load, add or subtract
    one, store; the value is the new vector (prefix) or the old one."""
    head, mid, p = _pointer_text(acc, True, ctx)
    elem, n = VECTORS[acc.vector]
    vtype = acc.vector if comps is None else elem if len(comps) == 1 else f"{elem}{len(comps)}"
    v, old = p.replace("_p", "_v"), p.replace("_p", "_o")
    text = (f"{mid}{vtype} {old} = {_gather(p, elem, comps, n)}; {vtype} {v} = {old} {op[0]} ({vtype})(1); "
            f"{_scatter(p, v, comps, n)} {v if prefix else old}; }})")
    return [head, *acc.pointer, tok(text, RAW)]


def _parenthesised(ts: list[Token], start: int, end: int) -> bool:
    """True when ``ts[start:end]`` stands alone in parentheses, ``(*p)``: not the arguments of a call, ``f(*p)``,
    nor a condition, ``if (*p)``."""
    if at(ts, start - 1).text != "(" or at(ts, end).text != ")" or group_end(ts, start - 1) != end:
        return False
    before = at(ts, start - 2)
    return not (before.kind == ID and before.text != "return" or before.text in (")", "]"))


def vector_access(ts: list[Token], start: int, end: int, acc: VectorAccess, ctx: Ctx,
                  member: int | None = None) -> tuple[int, list[Token]]:
    """The vector access ``ts[start:end]`` (``*p``, ``p[i]``, or ``p`` before ``->``) and the write that may follow
    it: an assignment (``*p = e``, ``p[i] += e``), a member (``p->xy = e``, ``p[i].zw -= e``; ``member``: where
    ``.``/``->`` is), ``(*p).xy = e`` and ``(*p)++`` through the parentheses around ``*p`` (the ``(`` already
    written: the tokens end with its ``)``), or a postfix ``++``/``--``. Returns the index past what it consumed
    and the tokens. Without a write after it: the read (``vload``), or one component's lvalue (``p->y``, read or
    written; a ``++`` before it then applies to that element). A prefix ``++``/``--`` on a swizzle of several
    elements is refused (``++p->xy``: write ``p->xy += 1``); on a whole vector it is ``vector_increment``,
    called by ``access.prefix_increment``."""
    k, close = end, False
    if member is None and _parenthesised(ts, start, end) and at(ts, end + 1).text in (".", "[", "++", "--", *_ASSIGN):
        k, close = end + 1, True
    if member is not None:
        k = member
    comps: list[int] | None = None
    if at(ts, k).text in (".", "->") and at(ts, k + 1).kind == ID:
        comps = swizzle(at(ts, k + 1).text, acc.vector)
        if comps is None:
            refuse(ts[k + 1], ts[k + 1].text, f"`{ts[k + 1].text}` is not a component of a {acc.vector}")
        k += 2
    op = at(ts, k)
    before = at(ts, start - 2 if close else start - 1)
    prefixed = before.kind == PUNCT and before.text in ("++", "--")
    out: list[Token]
    if comps is None and op.kind == PUNCT and op.text == "[":  # `p[i][j]`, `(*p)[j]`: an element's lvalue
        bracket = group_end(ts, k)
        nxt = at(ts, bracket + 1)
        write = nxt.kind == PUNCT and (nxt.text in _ASSIGN or nxt.text in ("++", "--")) or prefixed
        out = vector_subscript(acc, rewrite(ts, ctx, k + 1, bracket), write, ctx)
        k = bracket + 1
    elif op.kind == PUNCT and op.text in _ASSIGN and not (comps is not None and len(comps) == 1):
        after = _expression_end(ts, k + 1)
        out, k = _store(acc, comps, op.text, rewrite(ts, ctx, k + 1, after), ctx), after
    elif op.kind == PUNCT and op.text in ("++", "--") and not (comps is not None and len(comps) == 1):
        out, k = vector_increment(acc, comps, op.text, False, ctx), k + 1
    elif comps is not None and len(comps) == 1:  # one element: its lvalue, read or written
        write = op.kind == PUNCT and (op.text in _ASSIGN or op.text in ("++", "--")) or prefixed
        out = vector_element(acc, comps[0], write, ctx)
    elif prefixed and comps is not None:
        refuse(before, f"{before.text}{'->' if at(ts, k - 2).text == '->' else '.'}{ts[k - 1].text}",
               "a prefix increment or decrement of a swizzle of several components through a pointer: "
               f"write it as `... {before.text[0]}= 1`")
    else:  # a read (a prefix ++/-- on the whole vector is prefix_increment's)
        out = vector_load(acc, ctx)
        if comps is None:
            k, close = end, False
        else:
            out += [tok("."), ts[k - 1]]
    if close:
        out.append(tok(")"))
    return k, out
