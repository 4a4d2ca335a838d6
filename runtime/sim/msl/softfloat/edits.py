"""Token insertions and replacements made while the soft-float rewrite walks a library, applied at the end."""
from __future__ import annotations

from dataclasses import dataclass, field

from mtlir.runtime.sim.msl.lex import Token, tokenize

__all__ = ["Edits", "toks"]


@dataclass
class Edits:
    """Token insertions and replacements, applied by ``render``: ``before[i]`` outermost first, ``after[i]``
    innermost first, ``text[i]`` a new text for token i (``""`` drops it)."""

    before: dict[int, list[list[Token]]] = field(default_factory=dict)
    after: dict[int, list[list[Token]]] = field(default_factory=dict)
    text: dict[int, str] = field(default_factory=dict)

    def wrap(self, start: int, end: int, head: str, tail: str = ")") -> None:
        self.before.setdefault(start, []).insert(0, toks(head))
        self.after.setdefault(end - 1, []).append(toks(tail))

    def insert_after(self, i: int, tokens: list[Token]) -> None:
        self.after.setdefault(i, []).append(tokens)

    def render(self, ts: list[Token]) -> list[Token]:
        out: list[Token] = []
        pending = ""  # the whitespace of dropped tokens, given to the next one
        for i, t in enumerate(ts):
            space: str | None = pending + t.space
            pending = ""
            for group in self.before.get(i, ()):
                for x in group:
                    out.append(x.with_space(space) if space is not None else x)
                    space = None
            own = "" if space is None else space
            if i in self.text and not self.text[i]:
                pending = own
            elif i in self.text:
                out.append(Token(t.kind, self.text[i], t.line, t.col, own))
            else:
                out.append(t if own == t.space else t.with_space(own))
            for group in self.after.get(i, ()):
                out.extend(group)
        return out


def toks(text: str) -> list[Token]:
    """Generated MSL tokens (no place in the source)."""
    return [Token(t.kind, t.text, 0, 0, t.space) for t in tokenize(text)[:-1]]

