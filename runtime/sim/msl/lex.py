"""Tokens of Metal Shading Language source: the lexer the MSL -> OpenCL C translator works on.

MSL is C++14 with a few extra keywords, so C's tokens suffice: identifiers, numbers (pp-numbers: ``1.0f``,
``0x1p-3``, ``9.99e-06f``, ``1.0h``), character and string literals, punctuators (longest match first:
``<<=``, ``::``, ``->``, ...) and preprocessor directives, kept whole as one token per logical line.
Whitespace and comments are not tokens: each token carries the text before it (``space``) so the translated
source keeps the layout and comments of the MSL it came from. ``[[`` is two ``[`` tokens; the translator reads
attributes itself.

    >>> [t.text for t in tokenize("*(buf0+0) = 0.0f;")]
    ['*', '(', 'buf0', '+', '0', ')', '=', '0.0f', ';', '']
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from mtlir.errors import KernelCompileError

__all__ = ["Token", "tokenize", "render", "MslSyntaxError", "ID", "NUM", "PUNCT", "PP", "STR", "EOF", "RAW"]

ID, NUM, PUNCT, PP, STR, EOF = "id", "num", "punct", "pp", "str", "eof"
RAW = "raw"  # generated OpenCL C text the translator inserts whole (a kernel's new signature and prologue)

# Longest first: the lexer takes the first punctuator that matches at a position.
_PUNCTUATORS = ("<<=", ">>=", "...", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+=", "-=",
                "*=", "/=", "%=", "&=", "|=", "^=", "::", "##", "[", "]", "{", "}", "(", ")", "<", ">", ".", ",",
                ";", ":", "?", "!", "~", "+", "-", "*", "/", "%", "&", "|", "^", "=", "#")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|[0-9A-Za-z_.])*")
_SPACE = re.compile(r"(?:[ \t\r\n\f\v]+|//[^\n]*|/\*.*?\*/|\\\n)*", re.S)
_QUOTED = re.compile(r"""'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*\"""")


class MslSyntaxError(KernelCompileError):
    """Source that is not valid MSL at the token level (an unterminated comment or literal, a stray character, an
    unbalanced bracket); the message names the line and column. Metal's compiler would reject it too."""


@dataclass(frozen=True, slots=True)
class Token:
    """One C token: ``kind`` (``id``, ``num``, ``punct``, ``pp``, ``str``, ``eof``; ``raw`` for generated
    text), its ``text``, the 1-based
    ``line`` and ``col`` where it starts in the MSL (0 for tokens the translator makes), and ``space``: the
    whitespace and comments before it, reproduced by ``render``."""

    kind: str
    text: str
    line: int = 0
    col: int = 0
    space: str = " "

    def where(self) -> str:
        """``line L, column C`` of the token in the MSL source (or ``generated`` for a made token)."""
        return f"line {self.line}, column {self.col}" if self.line else "generated"

    def with_space(self, space: str) -> Token:
        """The same token with other leading whitespace."""
        return Token(self.kind, self.text, self.line, self.col, space)


def tokenize(src: str) -> list[Token]:
    """Split MSL ``src`` into tokens; the last one is an ``eof`` token carrying the trailing whitespace.

    Preprocessor directives (``#include <metal_stdlib>``, ``#define N 4``) become one ``pp`` token each, their
    text being the whole logical line (backslash continuations joined, comments kept). Raises ``MslSyntaxError``
    (naming line and column) for an unterminated block comment or literal and for characters C has no token
    for (``@``, ``$``, a backquote, non-ASCII)."""
    tokens: list[Token] = []
    pos, n = 0, len(src)
    line_starts = [0] + [m.end() for m in re.finditer("\n", src)]

    def line_col(p: int) -> tuple[int, int]:
        lo, hi = 0, len(line_starts) - 1
        while lo < hi:  # binary search: the last line start <= p
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if line_starts[mid] <= p else (lo, mid - 1)
        return lo + 1, p - line_starts[lo] + 1

    while True:
        space_end = _SPACE.match(src, pos).end()  # type: ignore[union-attr]
        space, pos = src[pos:space_end], space_end
        if src.startswith("/*", pos):
            raise MslSyntaxError(f"MSL {_where(line_col(pos))}: unterminated block comment")
        if pos >= n:
            tokens.append(Token(EOF, "", 0, 0, space))
            return tokens
        line, col = line_col(pos)
        ch = src[pos]
        if ch == "#" and _at_line_start(src, pos):
            end = _directive_end(src, pos)
            tokens.append(Token(PP, src[pos:end], line, col, space))
            pos = end
            continue
        if m := _IDENT.match(src, pos):
            kind = ID
        elif m := _NUMBER.match(src, pos):
            kind = NUM
        elif ch in "'\"":
            m = _QUOTED.match(src, pos)
            if m is None:
                what = "character" if ch == "'" else "string"
                raise MslSyntaxError(f"MSL {_where((line, col))}: unterminated {what} literal")
            kind = STR
        else:
            text = next((p for p in _PUNCTUATORS if src.startswith(p, pos)), None)
            if text is None:
                raise MslSyntaxError(f"MSL {_where((line, col))}: unexpected character {ch!r}")
            tokens.append(Token(PUNCT, text, line, col, space))
            pos += len(text)
            continue
        tokens.append(Token(kind, m.group(), line, col, space))
        pos = m.end()


def render(tokens: list[Token]) -> str:
    """The source text of ``tokens``: each token's ``space`` followed by its ``text``."""
    return "".join(t.space + t.text for t in tokens)


def _where(lc: tuple[int, int]) -> str:
    return f"line {lc[0]}, column {lc[1]}"


def _at_line_start(src: str, pos: int) -> bool:
    """True when only blanks stand between the previous newline (or the start) and ``pos``."""
    start = src.rfind("\n", 0, pos) + 1
    return src[start:pos].strip(" \t") == ""


def _directive_end(src: str, pos: int) -> int:
    """The end of the preprocessor directive starting at ``pos``: the newline not preceded by a backslash."""
    while True:
        nl = src.find("\n", pos)
        if nl == -1:
            return len(src)
        if src[nl - 1] != "\\" and not (src[nl - 1] == "\r" and src[nl - 2] == "\\"):
            return nl
        pos = nl + 1
