"""Reading the tokens around a buffer access for the bounds checks (``guard``): where a bracket opens, whether a
parenthesised group is a cast, whether ``*``/``&`` is unary, where an operand or expression ends, which tracked
pointer names an expression's pointer value is computed from, whether an access is a store, the arguments of a call
and the value of an integer literal.
"""
from __future__ import annotations

from mtlir.runtime.sim.msl.guard.bound import _HOW
from mtlir.runtime.sim.msl.lex import ID, NUM, PUNCT, STR, Token
from mtlir.runtime.sim.msl.names import SCALARS, VECTORS, storage_type
from mtlir.runtime.sim.msl.rewrite import QUALIFIERS, Ctx, at, group_end, refuse

__all__ = ["group_start"]

_ASSIGN = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="})
_UNARY_AFTER_WORD = frozenset({"return", "case", "sizeof", "else", "do"})


def group_start(ts: list[Token], j: int) -> int:
    """Index of the ``(`` or ``[`` opening the bracket closed at ``j`` (-1 when it is not opened)."""
    depth = 0
    for k in range(j, -1, -1):
        t = ts[k]
        if t.kind != PUNCT:
            continue
        if t.text in (")", "]", "}"):
            depth += 1
        elif t.text in ("(", "[", "{"):
            depth -= 1
            if depth == 0:
                return k
    return -1


def _is_cast(ts: list[Token], i: int, ctx: Ctx) -> bool:
    """True when the parenthesised group opening at ``i`` is a type: ``(float)``, ``(device float4*)``."""
    end = group_end(ts, i)
    inner = ts[i + 1:end]
    if not inner:
        return False
    named = False
    for t in inner:
        if t.kind == PUNCT and t.text == "*":
            continue
        if t.kind != ID:
            return False
        if t.text in SCALARS or t.text in VECTORS or t.text in ctx.type_names:
            named = True
        elif t.text not in QUALIFIERS and t.text not in ("__restrict", "__restrict__"):
            return False
    return named


def _unary(ts: list[Token], j: int, ctx: Ctx) -> bool:
    """True when the ``*`` or ``&`` at ``j`` is a unary operator (a dereference or address-of), judged by the token
    before it; a ``*`` after a type name (a declarator, ``float* p``) or an operand is not."""
    if j == 0:
        return True
    p = ts[j - 1]
    if p.kind in (NUM, STR):
        return False
    if p.kind == ID:
        return p.text in _UNARY_AFTER_WORD
    if p.kind != PUNCT:
        return True
    if p.text == "]":
        return False
    if p.text == ")":
        start = group_start(ts, j - 1)
        if start > 0 and ts[start - 1].kind == ID and ts[start - 1].text in ("if", "while", "for", "switch"):
            return True  # `if (c) *p = v;`: a statement starts
        return start >= 0 and _is_cast(ts, start, ctx)
    if p.text in ("++", "--"):  # postfix after an operand: binary; prefix: unary
        return j < 2 or _unary(ts, j - 1, ctx)
    return True


def _operand_end(ts: list[Token], j: int, ctx: Ctx) -> int:
    """The end (exclusive) of the operand of a unary operator starting at ``j``: prefix operators, a cast and its
    operand, a parenthesised group, a name, number or call, then postfix ``[..]``, ``.f``, ``->f``, ``++``, ``(..)``."""
    t = at(ts, j)
    if t.kind == PUNCT and t.text in ("++", "--", "*", "&", "-", "+", "!", "~"):
        return _operand_end(ts, j + 1, ctx)
    if t.kind == PUNCT and t.text == "(":
        close = group_end(ts, j)
        if _is_cast(ts, j, ctx):
            return _operand_end(ts, close + 1, ctx)
        k = close + 1
    elif t.kind in (ID, NUM, STR):
        k = j + 1
    else:
        return j + 1
    while True:
        x = at(ts, k)
        if x.kind != PUNCT:
            return k
        if x.text in ("[", "("):
            k = group_end(ts, k) + 1
        elif x.text in (".", "->"):
            k += 2
        elif x.text in ("++", "--"):
            k += 1
        else:
            return k


def _pointer_names(ts: list[Token], a: int, b: int, ctx: Ctx) -> list[int]:
    """Indices of the tracked pointer names in ``ts[a:b]`` that the pointer value of that expression is computed
    from: not inside subscripts or call arguments (values), not the pointer of a nested dereference or subscript
    (an access, a value), but ``p`` of ``&p[i]`` (an address)."""
    assert ctx.guard is not None
    ptrs = ctx.guard.ptrs
    out: list[int] = []
    j = a
    while j < b:
        t = ts[j]
        if t.kind == PUNCT:
            if t.text == "[":
                j = group_end(ts, j) + 1
                continue
            if t.text == "*" and _unary(ts, j, ctx):
                j = _operand_end(ts, j + 1, ctx)
                continue
        elif t.kind == ID:
            nxt = at(ts, j + 1).text
            if nxt == "(" and t.text in ptrs:
                refuse(t, t.text, f"a buffer pointer called as a function ({_HOW})")
            if nxt == "(":
                j = group_end(ts, j + 1) + 1
                continue
            if t.text in ptrs and not _member(ts, j):
                address_of = j > 0 and ts[j - 1].text == "&" and _unary(ts, j - 1, ctx)
                if nxt not in ("[", "->") or (nxt == "[" and address_of):
                    out.append(j)
        j += 1
    return out


def _member(ts: list[Token], j: int) -> bool:
    """True when the identifier at ``j`` names a struct member (after ``.`` or ``->``), not a variable."""
    return j > 0 and ts[j - 1].kind == PUNCT and ts[j - 1].text in (".", "->")


def _is_write(ts: list[Token], star: int, end: int) -> bool:
    """Whether the access spanning ``[star, end)`` is a store (``=``, ``+=``, ``++`` ... after it, possibly
    through closing parentheses and ``.x`` members; or ``++``/``--`` before it)."""
    if star > 0 and ts[star - 1].text in ("++", "--"):
        return True
    k = end
    while True:
        t = at(ts, k)
        if t.kind == PUNCT and t.text == ")":
            k += 1
        elif t.kind == PUNCT and t.text == "." and at(ts, k + 1).kind == ID:
            k += 2
        else:
            return t.kind == PUNCT and (t.text in _ASSIGN or t.text in ("++", "--"))


def _literal(text: str) -> int | None:
    """The value of a decimal or hex integer literal (``16``, ``0x10``, ``4u``); None for anything else."""
    try:
        return int(text.rstrip("uUlL"), 0)
    except ValueError:
        return None


def _expression_end(ts: list[Token], j: int) -> int:
    """The end of the expression starting at ``j``: the first ``;``, ``,``, ``)``, ``]`` or ``}`` outside
    brackets."""
    while j < len(ts):
        t = ts[j]
        if t.kind == PUNCT:
            if t.text in ("(", "[", "{"):
                j = group_end(ts, j) + 1
                continue
            if t.text in (";", ",", ")", "]", "}"):
                return j
        elif t.kind == "eof":
            return j
        j += 1
    return j


def _split_on(ts: list[Token], open_: int, close: int, sep: str) -> list[tuple[int, int]]:
    """The spans between top-level ``sep`` tokens inside the brackets at ``open_``/``close`` (separators excluded:
    a span ``(a, b)`` is followed by the separator at ``b``, the last one by ``close``)."""
    spans: list[tuple[int, int]] = []
    j = a = open_ + 1
    while j < close:
        t = ts[j]
        if t.kind == PUNCT and t.text in ("(", "[", "{"):
            j = group_end(ts, j) + 1
            continue
        if t.kind == PUNCT and t.text == sep:
            spans.append((a, j))
            a = j + 1
        j += 1
    spans.append((a, close))
    return spans


def _split_args(ts: list[Token], open_: int, close: int) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of the comma-separated arguments between the brackets at ``open_`` and
    ``close`` (none for empty brackets)."""
    return [] if close == open_ + 1 else _split_on(ts, open_, close, ",")


_SPACE_OF = {"device": "global", "constant": "global", "threadgroup": "local", "thread": "private"}


def _pointee_vector(ts: list[Token], a: int, b: int, ctx: Ctx) -> str | None:
    """The OpenCL vector type (its storage type: ``half4`` -> ``ushort4``) the pointer expression ``ts[a:b]``
    points to, when it is one (``_pointee``); None otherwise (a scalar or struct pointer, an expression the
    translator does not type)."""
    got = _pointee(ts, a, b, ctx)
    return None if got is None else got[0]


def _pointee(ts: list[Token], a: int, b: int, ctx: Ctx) -> tuple[str, str | None] | None:
    """The vector type the pointer expression ``ts[a:b]`` points to and the memory it is in, when the translator can
    tell: a cast to a vector pointer, ``(device float4*)(in + 1)`` (its memory from the cast's address space:
    ``global``, ``local``, ``private``), or a pointer variable to vectors (``guard.vectors``; its memory from
    ``guard.spaces``, None for a tracked buffer pointer, whose ``Bound`` says it), as the first term of a sum
    (``p + n``, ``p - n``) or any other term of it that is the pointer alone (``n + p``, ``4 * i + (p)``)."""
    while b - a >= 2 and ts[a].text == "(" and group_end(ts, a) == b - 1:
        a, b = a + 1, b - 1
    comma = _top_level(ts, a, b, (",",))
    if comma:  # `(e, p)`: the last operand's
        return _pointee(ts, comma[-1] + 1, b, ctx)
    branch = _true_branch(ts, a, b)
    if branch is not None:  # `c ? p : q`: the branches' type (MSL requires them to agree)
        return _pointee(ts, *branch, ctx)
    t = at(ts, a)
    if t.kind == PUNCT and t.text in ("++", "--"):  # `*++p`: the pointer's own type
        return _pointee(ts, a + 1, b, ctx)
    g = ctx.guard
    if (t.text == "&" and g is not None and at(ts, a + 1).kind == ID and at(ts, a + 1).text in g.vectors
            and at(ts, a + 2).text == "[" and group_end(ts, a + 2) == b - 1):  # `&p[i]`
        return g.vectors[ts[a + 1].text], g.spaces.get(ts[a + 1].text)
    if t.kind == PUNCT and t.text == "(" and _is_cast(ts, a, ctx):
        inner = ts[a + 1:group_end(ts, a)]
        names = [x.text for x in inner if x.kind == ID and x.text in VECTORS]
        if len(names) != 1 or sum(x.text == "*" for x in inner) != 1:
            return None
        spaces = [_SPACE_OF[x.text] for x in inner if x.kind == ID and x.text in _SPACE_OF]
        return storage_type(names[0]), spaces[0] if spaces else None
    if g is None:
        return None
    if t.kind == ID and t.text in g.vectors:
        return g.vectors[t.text], g.spaces.get(t.text)
    terms = _terms(ts, a, b)
    s, e = terms[0]
    if len(terms) > 1 and ts[s].text == "(" and group_end(ts, s) == e - 1 and not _is_cast(ts, s, ctx):
        return _pointee(ts, s, e, ctx)  # `(c ? p : q) + 1`
    for s, e in terms[1:]:
        while e - s >= 2 and ts[s].text == "(" and group_end(ts, s) == e - 1:
            s, e = s + 1, e - 1
        if e - s == 1 and ts[s].kind == ID and ts[s].text in g.vectors:
            return g.vectors[ts[s].text], g.spaces.get(ts[s].text)
        if ts[s].text == "(" and _is_cast(ts, s, ctx):
            return _pointee(ts, s, e, ctx)
    return None


def _terms(ts: list[Token], a: int, b: int) -> list[tuple[int, int]]:
    """The spans of the top-level terms of the sum ``ts[a:b]`` (split at binary ``+`` and ``-``)."""
    spans: list[tuple[int, int]] = []
    j = s = a
    while j < b:
        t = ts[j]
        if t.kind == PUNCT and t.text in ("(", "["):
            j = group_end(ts, j) + 1
            continue
        if t.kind == PUNCT and t.text in ("+", "-") and j > s:
            p = ts[j - 1]
            if p.kind in (ID, NUM) or p.text in (")", "]"):
                spans.append((s, j))
                s = j + 1
        j += 1
    spans.append((s, b))
    return spans


def _top_level(ts: list[Token], a: int, b: int, texts: tuple[str, ...]) -> list[int]:
    """Indices of the tokens of ``texts`` in ``ts[a:b]`` outside brackets."""
    out: list[int] = []
    j = a
    while j < b:
        t = ts[j]
        if t.kind == PUNCT and t.text in ("(", "[", "{"):
            j = group_end(ts, j) + 1
            continue
        if t.kind == PUNCT and t.text in texts:
            out.append(j)
        j += 1
    return out


def _true_branch(ts: list[Token], a: int, b: int) -> tuple[int, int] | None:
    """The span of the first branch of the conditional expression ``ts[a:b]`` (``c ? x : y`` -> ``x``; its own
    nested conditionals skipped), None when ``ts[a:b]`` is no conditional at its top level."""
    marks = _top_level(ts, a, b, ("?", ":"))
    if not marks or ts[marks[0]].text != "?":
        return None
    depth = 0
    for j in marks:
        depth += 1 if ts[j].text == "?" else -1
        if depth == 0:
            return marks[0] + 1, j
    return None
