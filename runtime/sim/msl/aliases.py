"""Vector types under another name: ``typedef float4 V;`` and ``#define V float4`` resolved to the type they name.

The translator recognizes a vector type by its spelling (``float4``, ``half2``: ``names.VECTORS``) to give every
vector access through a pointer its ``vloadN``/``vstoreN`` form (``guard.vector``) and to compute half and bfloat
vectors in software (``softfloat``). A name that stands for a vector type would hide it: a ``device V*`` at an
under-aligned address would be dereferenced as it is, which OpenCL leaves undefined (PoCL may crash the process).
So, before anything else looks at the tokens, each use of such a name becomes the tokens of the type it stands
for and its ``typedef`` or ``#define`` is dropped. A typedef of a pointer to, or an array of, a vector type
(``typedef device float4* F4P;``) is refused: its uses cannot be rewritten token for token (``F4P p, q;`` declares
two pointers) and a pointer the translator cannot see would reach OpenCL undereferenced by ``vloadN``/``vstoreN``.
"""
from __future__ import annotations

import re

from mtlir.errors import UnsupportedKernelError
from mtlir.runtime.sim.msl.lex import ID, PP, Token
from mtlir.runtime.sim.msl.names import VECTORS

__all__ = ["resolve_vector_aliases"]

# An object-like macro whose whole body is one name: `#define V float4` (a function-like macro is left alone).
_DEFINE = re.compile(r"#\s*define\s+([A-Za-z_]\w*)\s+(?:metal\s*::\s*)?([A-Za-z_]\w*)\s*$")
_DEFINE_VEC = re.compile(r"#\s*define\s+([A-Za-z_]\w*)\s+(?:metal\s*::\s*)?vec\s*<\s*([a-z]+)\s*,\s*([234])\s*>\s*$")
_UNDEF = re.compile(r"#\s*undef\s+([A-Za-z_]\w*)\s*$")
# Tokens that make a typedef's type more than a (qualified) vector type.
_DECLARATOR = ("*", "&", "[", "]", "(", ")", ",")


def _names_vector(tokens: list[Token], aliases: dict[str, list[Token]]) -> bool:
    return any(t.kind == ID and (t.text in VECTORS or t.text in aliases) for t in tokens)


def _typedef_end(ts: list[Token], i: int) -> int | None:
    """The index of the ``;`` ending the typedef at ``i``, or None when it has braces (a struct typedef: left)."""
    for j in range(i + 1, len(ts)):
        if ts[j].text in ("{", "}"):
            return None
        if ts[j].text == ";":
            return j
    return None


def _expand(ts: list[Token], aliases: dict[str, list[Token]], at: Token) -> list[Token]:
    """The tokens of the alias type in ``ts``, at ``at``'s place (its line, column and the space before it)."""
    out: list[Token] = []
    texts = [t.text for t in ts] + ["", ""]
    for k, t in enumerate(ts):
        if texts[k:k + 2] == ["metal", "::"] and texts[k + 2] in VECTORS or (
                texts[k - 1:k + 1] == ["metal", "::"] and texts[k + 1] in VECTORS):
            continue  # metal::float4 is float4
        for u in aliases.get(t.text, [t]) if t.kind == ID else [t]:
            out.append(Token(u.kind, u.text, at.line, at.col, at.space if not out else (u.space or " ")))
    return out


def resolve_vector_aliases(ts: list[Token]) -> list[Token]:
    """``ts`` with every use of a typedef or ``#define`` name for a vector type (``typedef float4 V;``,
    ``typedef const half2 H;``, ``#define V float4``) replaced by the type's tokens, in its scope (a typedef in a
    block until the block closes; a macro until its ``#undef``), and those typedefs and defines dropped. The same
    list when there is none. A use after ``.``, ``->`` or ``::`` (a member of that name) is left. ``metal::float4``
    (the vector type named with its namespace, MSL spec §2.2) becomes ``float4`` too.

    Raises ``UnsupportedKernelError`` naming the typedef for a typedef of a pointer to, a reference to or an array
    of a vector type (``typedef device float4* F4P;``, ``typedef threadgroup half4* TP;``): write the pointer type
    out (``device float4*``) where it is used."""
    if not any(t.text in ("typedef", "metal") or (t.kind == PP and "define" in t.text) for t in ts):
        return ts
    aliases: dict[str, list[Token]] = {}
    scopes: list[list[tuple[str, list[Token] | None]]] = [[]]  # per open block: (name, the alias it shadowed)
    out: list[Token] = []
    i, changed = 0, False
    while i < len(ts):
        t = ts[i]
        if t.kind == PP:
            d, u, v = _DEFINE.match(t.text), _UNDEF.match(t.text), _DEFINE_VEC.match(t.text)
            if v and v.group(2) + v.group(3) in VECTORS:  # #define V vec<float, 4>
                aliases[v.group(1)] = [Token(ID, v.group(2) + v.group(3), t.line, t.col, "")]
                i, changed = i + 1, True
                continue
            if d and (d.group(2) in VECTORS or d.group(2) in aliases):
                aliases[d.group(1)] = _expand([Token(ID, d.group(2), t.line, t.col, "")], aliases, t)
                i, changed = i + 1, True
                continue
            if u and u.group(1) in aliases:
                del aliases[u.group(1)]
                i, changed = i + 1, True
                continue
        elif t.kind == ID and t.text == "typedef":
            end = _typedef_end(ts, i)
            if end is not None and end - i >= 3 and _names_vector(ts[i + 1:end - 1], aliases):
                name, body = ts[end - 1], ts[i + 1:end - 1]
                if name.kind != ID or any(x.text in _DECLARATOR for x in body):
                    name = next((x for x in reversed(ts[i + 1:end]) if x.kind == ID), name)  # A in `H A[2]`
                    construct = f"typedef {name.text}"
                    raise UnsupportedKernelError(
                        f"MSL {name.where()}: cannot translate `{construct}` to OpenCL C: a typedef of a pointer to, "
                        "a reference to or an array of a vector type hides the vector accesses the simulated device "
                        "must translate to vloadN/vstoreN; write the type out where it is used (`device float4*`)",
                        construct)
                scopes[-1].append((name.text, aliases.get(name.text)))
                aliases[name.text] = _expand(body, aliases, t)
                i, changed = end + 1, True
                continue
            if end is not None and ts[end - 1].text in aliases:  # `typedef float V;`: V is no vector type here
                scopes[-1].append((ts[end - 1].text, aliases.pop(ts[end - 1].text)))
        elif t.text == "{":
            scopes.append([])
        elif t.text == "}" and len(scopes) > 1:
            for alias, shadowed in reversed(scopes.pop()):
                if shadowed is None:
                    aliases.pop(alias, None)
                else:
                    aliases[alias] = shadowed
        elif (t.kind == ID and t.text == "metal" and i + 2 < len(ts) and ts[i + 1].text == "::"
              and ts[i + 2].kind == ID and ts[i + 2].text in VECTORS):  # metal::float4 is float4
            out.append(ts[i + 2].with_space(t.space))
            i, changed = i + 3, True
            continue
        elif t.kind == ID and t.text in aliases and not (out and out[-1].text in (".", "->", "::")):
            out += _expand([t], aliases, t)
            i, changed = i + 1, True
            continue
        out.append(t)
        i += 1
    return out if changed else ts
