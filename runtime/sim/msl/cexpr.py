"""C expressions of MSL function bodies as trees over the token list, which ``softfloat`` types.

``Parser(ts, is_type).expression(i, end)`` reads the expression starting at token ``i`` (up to ``end``) with C's
precedence and associativity (C11 §6.5) and returns a ``Node`` whose ``start``/``end`` are token indices, so a
pass that types the tree can edit the token list around each node and leave every other token as it was. Casts
``(T)x``, function-style casts and vector constructors ``float4(a, b)``, ``static_cast<T>(x)``, ``as_type<T>(x)``,
``make_filled_simdgroup_matrix<T, 8, 8>(x)``, ``metal::``/``precise::``/``fast::`` names and initializer lists are
nodes of their own. ``Parser.declaration(i, end)`` reads a declaration (``threadgroup half t[64], *p = t;``) when
one starts at ``i``.

The parser knows which identifiers name types through ``is_type`` (MSL's scalar and vector names, the source's
structs, the SIMD-group matrix types); it raises ``MslSyntaxError`` for a token it cannot place.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

from mtlir.runtime.sim.msl.lex import ID, NUM, PUNCT, STR, MslSyntaxError, Token
from mtlir.runtime.sim.msl.rewrite import at, group_end

__all__ = ["Node", "Declarator", "Declaration", "Parser", "TYPE_QUALIFIERS", "TEMPLATE_CALLS"]

# C11 §6.5.5-6.5.14: binary operators and their precedence (higher binds tighter).
_BINARY = {"*": 13, "/": 13, "%": 13, "+": 12, "-": 12, "<<": 11, ">>": 11, "<": 10, ">": 10, "<=": 10, ">=": 10,
           "==": 9, "!=": 9, "&": 8, "^": 7, "|": 6, "&&": 5, "||": 4}
_ASSIGN = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="})
_PREFIX = frozenset({"-", "+", "!", "~", "*", "&", "++", "--"})
# Words that may stand in a type before or after its name (address spaces, qualifiers, storage classes).
TYPE_QUALIFIERS = frozenset({"const", "volatile", "restrict", "__restrict", "__restrict__", "device", "constant",
                             "threadgroup", "thread", "static", "constexpr", "inline"})
# Calls written with a template argument list: name<T, ...>(args).
TEMPLATE_CALLS = frozenset({"static_cast", "as_type", "make_filled_simdgroup_matrix", "simdgroup_matrix"})
_NAMESPACES = frozenset({"metal", "precise", "fast"})


@dataclass(eq=False)
class Node:
    """One expression: ``kind`` is ``name``, ``num``, ``str``, ``paren``, ``unary`` (prefix ``op``), ``postfix``
    (``op`` ``++``/``--``), ``binary``, ``assign``, ``ternary``, ``comma``, ``call`` (``kids[0]`` the callee, then
    the arguments), ``index`` (``kids`` array, index), ``member`` (``op`` ``.``/``->``, ``name`` the member),
    ``cast`` (``(T)x``: ``type_span``, ``kids[0]`` the operand), ``typecall`` (``T(args)``: ``name`` the type),
    ``template`` (``name<T, ...>(args)``: ``name``, ``type_span`` of ``T``, ``targs`` the other template arguments),
    ``typename`` (a type name standing alone, as in ``__builtin_convertvector(x, float4)``), ``sizeof`` or ``init``
    (``{a, b}``). ``start``/``end``: its tokens ``ts[start:end]``; ``name`` for names, members and calls' type."""

    kind: str
    start: int
    end: int
    op: str = ""
    name: str = ""
    kids: list[Node] = field(default_factory=list)
    type_span: tuple[int, int] = (0, 0)
    targs: list[str] = field(default_factory=list)


@dataclass(eq=False)
class Declarator:
    """One declared name: its token index, the array sizes after it (token spans), ``pointer``: how many ``*``
    stand before it, and its initializer (None if none)."""

    name: int
    pointer: int = 0
    dims: list[tuple[int, int]] = field(default_factory=list)
    init: Node | None = None


@dataclass(eq=False)
class Declaration:
    """``[qualifiers] T declarator, declarator;``: the indices of its qualifier words, of the type name token (a
    template type ``simdgroup_matrix<T, 8, 8>`` spans ``type_end``), its declarators and the index past it."""

    qualifiers: list[int]
    type_at: int
    type_end: int
    declarators: list[Declarator]
    end: int


class Parser:
    """Expressions and declarations of one token list; ``is_type(name)`` says which identifiers name types."""

    def __init__(self, ts: list[Token], is_type: Callable[[str], bool]) -> None:
        self.ts = ts
        self.is_type = is_type

    # --- expressions (C11 §6.5) ---

    def expression(self, i: int, end: int) -> Node:
        """The whole expression ``ts[i:end]`` (comma operators included); raises ``MslSyntaxError`` when tokens are
        left over."""
        node, j = self._comma(i, end)
        if j != end:
            self._fail(j, "unexpected token in an expression")
        return node

    def _comma(self, i: int, end: int) -> tuple[Node, int]:
        node, j = self._assign(i, end)
        while j < end and self._is(j, ","):
            right, k = self._assign(j + 1, end)
            node = Node("comma", node.start, k, ",", kids=[node, right])
            j = k
        return node, j

    def _assign(self, i: int, end: int) -> tuple[Node, int]:
        left, j = self._ternary(i, end)
        if j < end and self.ts[j].kind == PUNCT and self.ts[j].text in _ASSIGN:
            right, k = self._assign(j + 1, end)
            return Node("assign", left.start, k, self.ts[j].text, kids=[left, right]), k
        return left, j

    def _ternary(self, i: int, end: int) -> tuple[Node, int]:
        cond, j = self._binary(i, end, 4)
        if j < end and self._is(j, "?"):
            a, k = self._comma(j + 1, end)
            if not (k < end and self._is(k, ":")):
                self._fail(k, "expected `:` of a conditional expression")
            b, m = self._assign(k + 1, end)
            return Node("ternary", cond.start, m, "?", kids=[cond, a, b]), m
        return cond, j

    def _binary(self, i: int, end: int, min_prec: int) -> tuple[Node, int]:
        left, j = self._unary(i, end)
        while j < end and self.ts[j].kind == PUNCT:
            prec = _BINARY.get(self.ts[j].text, 0)
            if prec < min_prec:
                break
            right, k = self._binary(j + 1, end, prec + 1)
            left = Node("binary", left.start, k, self.ts[j].text, kids=[left, right])
            j = k
        return left, j

    def _unary(self, i: int, end: int) -> tuple[Node, int]:
        t = self._tok(i, end)
        if t.kind == PUNCT and t.text in _PREFIX:
            kid, j = self._unary(i + 1, end)
            return Node("unary", i, j, t.text, kids=[kid]), j
        if t.kind == PUNCT and t.text == "(" and self.is_cast(i):
            close = group_end(self.ts, i)
            kid, j = self._unary(close + 1, end)
            return Node("cast", i, j, type_span=(i + 1, close), kids=[kid]), j
        if t.kind == ID and t.text == "sizeof":
            if self._is(i + 1, "("):
                close = group_end(self.ts, i + 1)
                return Node("sizeof", i, close + 1, type_span=(i + 2, close)), close + 1
            kid, j = self._unary(i + 1, end)
            return Node("sizeof", i, j, kids=[kid]), j
        node, j = self._primary(i, end)
        return self._postfix(node, j, end)

    def _postfix(self, node: Node, j: int, end: int) -> tuple[Node, int]:
        while j < end and self.ts[j].kind == PUNCT:
            text = self.ts[j].text
            if text == "(":
                close = group_end(self.ts, j)
                node = Node("call", node.start, close + 1, kids=[node, *self._arguments(j, close)])
                j = close + 1
            elif text == "[":
                close = group_end(self.ts, j)
                index = self.expression(j + 1, close)
                node = Node("index", node.start, close + 1, kids=[node, index])
                j = close + 1
            elif text in (".", "->"):
                if self._tok(j + 1, end).kind != ID:
                    self._fail(j + 1, f"expected a member name after `{text}`")
                node = Node("member", node.start, j + 2, text, self.ts[j + 1].text, kids=[node])
                j += 2
            elif text in ("++", "--"):
                node = Node("postfix", node.start, j + 1, text, kids=[node])
                j += 1
            else:
                break
        return node, j

    def _primary(self, i: int, end: int) -> tuple[Node, int]:
        t = self._tok(i, end)
        if t.kind == NUM:
            return Node("num", i, i + 1, name=t.text), i + 1
        if t.kind == STR:
            return Node("str", i, i + 1), i + 1
        if t.kind == PUNCT and t.text == "(":
            close = group_end(self.ts, i)
            inner = self.expression(i + 1, close)
            return Node("paren", i, close + 1, kids=[inner]), close + 1
        if t.kind == PUNCT and t.text == "{":
            close = group_end(self.ts, i)
            return Node("init", i, close + 1, kids=self._arguments(i, close)), close + 1
        if t.kind != ID:
            self._fail(i, "expected an expression")
        if t.text in _NAMESPACES and self._is(i + 1, "::") and self._tok(i + 2, end).kind == ID:
            node, j = self._primary(i + 2, end)
            node.start = i
            return node, j
        if self._is(i + 1, "::"):  # mem_flags::mem_threadgroup and other scoped names: one name
            j = i
            while self._is(j + 1, "::") and self._tok(j + 2, end).kind == ID:
                j += 2
            return Node("name", i, j + 1, name="".join(x.text for x in self.ts[i:j + 1])), j + 1
        if t.text in TEMPLATE_CALLS and self._is(i + 1, "<"):
            return self._template(i, end)
        if self.is_type(t.text):
            if self._is(i + 1, "("):
                close = group_end(self.ts, i + 1)
                return Node("typecall", i, close + 1, name=t.text, kids=self._arguments(i + 1, close)), close + 1
            return Node("typename", i, i + 1, name=t.text), i + 1
        return Node("name", i, i + 1, name=t.text), i + 1

    def _template(self, i: int, end: int) -> tuple[Node, int]:
        """``name<T, A, B>(args)``: T a type (its tokens up to the first top-level comma), A, B literal texts."""
        j, depth, parts, a = i + 2, 1, [], i + 2
        while depth:
            t = self._tok(j, end)
            if t.kind == PUNCT and t.text == "<":
                depth += 1
            elif t.kind == PUNCT and t.text == ">":
                depth -= 1
            elif t.kind == PUNCT and t.text == ">>":
                depth -= 2
            if depth <= 0 or (depth == 1 and t.kind == PUNCT and t.text == ","):
                parts.append((a, j))
                a = j + 1
            if depth < 0 or t.kind == "eof":
                self._fail(i, f"unclosed template argument list of `{self.ts[i].text}`")
            j += 1
        if not self._is(j, "("):
            self._fail(j, f"expected the arguments of `{self.ts[i].text}<...>`")
        close = group_end(self.ts, j)
        targs = ["".join(x.text for x in self.ts[p:q]) for p, q in parts[1:]]
        return Node("template", i, close + 1, name=self.ts[i].text, type_span=parts[0], targs=targs,
                    kids=self._arguments(j, close)), close + 1

    def _arguments(self, open_: int, close: int) -> list[Node]:
        """The comma-separated expressions between the brackets at ``open_`` and ``close``."""
        args: list[Node] = []
        j = open_ + 1
        while j < close:
            node, k = self._assign(j, close)
            args.append(node)
            if k < close and not self._is(k, ","):
                self._fail(k, "expected `,` between arguments")
            j = k + 1
        return args

    def is_cast(self, i: int) -> bool:
        """True when the bracket at ``i`` holds a type: ``(half)``, ``(device half4*)``, ``(const float*)``."""
        close = group_end(self.ts, i)
        inner = self.ts[i + 1:close]
        named = False
        for t in inner:
            if t.kind == PUNCT and t.text == "*":
                continue
            if t.kind != ID:
                return False
            if self.is_type(t.text) and not named:
                named = True
            elif t.text not in TYPE_QUALIFIERS and t.text != "struct":
                return False
        return named

    # --- declarations (C11 §6.7) ---

    def declaration(self, i: int, end: int) -> Declaration | None:
        """The declaration starting at ``i`` (ending at its ``;``, or at ``end`` for a for-loop's first clause), or
        None when ``ts[i:]`` does not start with ``[qualifiers] T name`` / ``T* name``."""
        quals: list[int] = []
        j = i
        while self._tok(j, end).kind == ID and self.ts[j].text in TYPE_QUALIFIERS | {"struct"}:
            quals.append(j)
            j += 1
        while self._within(end, j, "__attribute__"):
            quals.append(j)
            j = group_end(self.ts, j + 1) + 1
        t = self._tok(j, end)
        if t.kind != ID or not self.is_type(t.text):
            return None
        type_at = j
        if t.text in TEMPLATE_CALLS and self._within(end, j + 1, "<"):
            k = j + 2
            while not self._within(end, k, ">") and k < end:
                k += 1
            j = k
        j += 1
        while self._tok(j, end).kind == ID and self.ts[j].text in TYPE_QUALIFIERS:
            quals.append(j)
            j += 1
        k = j
        while self._within(end, k, "*") or (self._tok(k, end).kind == ID and self.ts[k].text in TYPE_QUALIFIERS):
            k += 1
        if self._tok(k, end).kind != ID or self.is_type(self.ts[k].text):
            return None
        type_end = j
        decls: list[Declarator] = []
        while True:
            pointer = 0
            while self._within(end, j, "*") or (self._tok(j, end).kind == ID and self.ts[j].text in TYPE_QUALIFIERS):
                pointer += self._within(end, j, "*")
                j += 1
            if self._tok(j, end).kind != ID:
                self._fail(j, "expected a name in a declaration")
            d = Declarator(j, pointer)
            j += 1
            while self._within(end, j, "["):
                close = group_end(self.ts, j)
                d.dims.append((j + 1, close))
                j = close + 1
            while self._within(end, j, "__attribute__"):
                j = group_end(self.ts, j + 1) + 1
            if self._within(end, j, "="):
                d.init, j = self._assign(j + 1, end)
            decls.append(d)
            if self._within(end, j, ","):
                j += 1
                continue
            if j < end and self._within(end, j, ";"):
                j += 1
            elif j != end:
                self._fail(j, "expected `;` after a declaration")
            return Declaration(quals, type_at, type_end, decls, j)

    # --- tokens ---

    def _tok(self, i: int, end: int) -> Token:
        return at(self.ts, i) if i < end else at(self.ts, len(self.ts))

    def _within(self, end: int, i: int, text: str) -> bool:
        return i < end and self._is(i, text)

    def _is(self, i: int, text: str) -> bool:
        t = at(self.ts, i)
        return t.text == text and t.kind in (PUNCT, ID)

    def _fail(self, i: int, why: str) -> NoReturn:
        t = at(self.ts, i)
        raise MslSyntaxError(f"MSL {t.where()}: {why} (at `{t.text}`)")
