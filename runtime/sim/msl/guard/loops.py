"""Loops that end once an access has been skipped (``guard``): ``loop_guard`` adds ``&& !__MTL_FAULTED`` to the
condition of every loop that cannot meet at a barrier, so a runaway loop does not keep the dispatch busy.
"""
from __future__ import annotations

from mtlir.runtime.sim.msl.guard.scan import _split_on, group_start
from mtlir.runtime.sim.msl.lex import ID, PUNCT, RAW, Token
from mtlir.runtime.sim.msl.rewrite import Ctx, TokenMatch, at, group_end, rewrite, tok
from mtlir.runtime.sim.msl.simd import uses_scratch

__all__ = ["loop_guard"]

_FAULTED = "__MTL_FAULTED"  # the prelude's test of the fault record: a bounds check has failed in this run


def loop_guard(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``for (init; cond; step)`` / ``while (cond)`` / ``do ... while (cond);`` -> the condition also ends the loop
    once an access has been skipped in this run (``cond && !__MTL_FAULTED``): the command buffer fails anyway, and a
    loop running far past its buffer (10**8 skipped stores per thread) would otherwise keep the whole dispatch busy
    for minutes where Metal stops at the first fault. Loops that contain a barrier (or a SIMD-group function) or call a
    function of the source are left alone: work-items leaving such a loop early would no longer meet at the
    barrier."""
    if ctx.guard is None or not ctx.guard.fault or at(ts, i + 1).text != "(":
        return None
    close = group_end(ts, i + 1)
    if ts[i].text == "for":
        body = _statement_span(ts, close + 1)
    else:
        before = i - 1
        if before > 0 and ts[before].text == "}" and ts[before].kind == PUNCT:
            start = group_start(ts, before)
            is_do = start > 0 and ts[start - 1].text == "do"
        else:
            is_do = False
        body = (group_start(ts, before), before + 1) if is_do else _statement_span(ts, close + 1)
    if _may_meet_at_a_barrier(ts, *body, ctx):
        return None
    ctx.prelude.need_bounds_check()
    out: list[Token] = [tok(ts[i].text, ID), ts[i + 1]]
    if ts[i].text == "for":
        parts = _split_on(ts, i + 1, close, ";")
        if len(parts) != 3:
            return None
        (a0, b0), (a1, b1), (a2, b2) = parts
        out += rewrite(ts, ctx, a0, b0) + [ts[b0]]
        out += _and_not_faulted(rewrite(ts, ctx, a1, b1)) if b1 > a1 else [tok(f"!{_FAULTED}", RAW, " ")]
        out += [ts[b1], *rewrite(ts, ctx, a2, b2), ts[close]]
    else:
        out += [*_and_not_faulted(rewrite(ts, ctx, i + 2, close)), ts[close]]
    return close + 1 - i, out


def _and_not_faulted(cond: list[Token]) -> list[Token]:
    """``cond`` -> ``(cond) && !__MTL_FAULTED``, the parenthesis taking the condition's leading whitespace."""
    if not cond:
        return [tok(f"!{_FAULTED}", RAW)]
    return [tok("(", PUNCT, cond[0].space), cond[0].with_space(""), *cond[1:], tok(")"),
            tok(f"&& !{_FAULTED}", RAW, " ")]


def _statement_span(ts: list[Token], j: int) -> tuple[int, int]:
    """The tokens of the statement starting at ``j``: a braced block, or up to its ``;`` outside brackets."""
    if at(ts, j).text == "{":
        return j, group_end(ts, j) + 1
    k = j
    while k < len(ts) and ts[k].kind != "eof":
        if ts[k].kind == PUNCT and ts[k].text in ("(", "[", "{"):
            k = group_end(ts, k) + 1
            continue
        if ts[k].kind == PUNCT and ts[k].text == ";":
            return j, k + 1
        k += 1
    return j, k


def _may_meet_at_a_barrier(ts: list[Token], a: int, b: int, ctx: Ctx) -> bool:
    """True when ``ts[a:b]`` has a barrier (a SIMD-group function is one: ``simd``) or a call of a function or
    macro the source defines."""
    if uses_scratch(ts, a, b, ctx.simd_helpers):
        return True
    for k in range(a, b):
        t = ts[k]
        if t.kind == ID and (t.text in ("threadgroup_barrier", "simdgroup_barrier") or (t.text in ctx.callables
                                                                 and at(ts, k + 1).text == "(")):
            return True
        if t.kind == "pp":
            return True
    return False
