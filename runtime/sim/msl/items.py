"""The top-level items of an MSL library's tokens (kernels, helper functions, structs, declarations, directives) and
what the translator reads from them before rewriting anything: the functions it may call, the helpers' spans, the
struct names, the kernels' buffer parameter names, and a parameter list split at its commas."""
from __future__ import annotations

from mtlir.runtime.sim.msl.lex import ID, PP, PUNCT, MslSyntaxError, Token
from mtlir.runtime.sim.msl.rewrite import at, group_end

__all__ = ["top_level_items", "defined_functions", "function_spans", "struct_names", "buffer_names", "split_params"]


def top_level_items(ts: list[Token]) -> list[tuple[str, int, int]]:
    """Top-level items as ``(kind, start, end)`` spans: ``kernel``, ``function`` (with a body), ``struct``
    (a definition with its ``;``), ``decl`` (anything ending in ``;``: declarations, prototypes, ``using``,
    typedefs) and ``pp`` (one directive)."""
    items: list[tuple[str, int, int]] = []
    i, n = 0, len(ts) - 1  # the last token is eof
    while i < n:
        if ts[i].kind == PP:
            items.append(("pp", i, i + 1))
            i += 1
            continue
        j, kind = i, "decl"
        while True:
            if j >= n:
                raise MslSyntaxError(f"MSL {ts[i].where()}: this declaration does not end (no `;` or body)")
            t = ts[j]
            if t.kind == PUNCT and t.text in ("(", "["):
                j = group_end(ts, j) + 1
            elif t.kind == PUNCT and t.text == "=":
                kind = "init"
                j += 1
            elif t.kind == PUNCT and t.text == "{" and kind == "init":
                j = group_end(ts, j) + 1
            elif t.kind == PUNCT and t.text == "{":
                words = {x.text for x in ts[i:j] if x.kind == ID}
                if words & {"struct", "union", "enum"} and at(ts, j - 1).text != ")":
                    end = group_end(ts, j) + 1
                    while end < n and ts[end].text != ";":
                        end += 1
                    items.append(("struct", i, min(end + 1, n)))
                else:
                    items.append(("kernel" if "kernel" in words else "function", i, group_end(ts, j) + 1))
                break
            elif t.kind == PUNCT and t.text == ";":
                items.append(("decl", i, j + 1))
                break
            else:
                j += 1
        i = items[-1][2]
    return items


def defined_functions(ts: list[Token]) -> set[str]:
    """Names of the functions the source defines or declares at top level (callable from later code)."""
    names: set[str] = set()
    for kind, start, end in top_level_items(ts):
        if kind in ("kernel", "function", "decl"):
            for k in range(start, end):
                if ts[k].text == "(" and ts[k].kind == PUNCT:
                    if k > start and ts[k - 1].kind == ID:
                        names.add(ts[k - 1].text)
                    break
    return names


def function_spans(ts: list[Token], items: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of every helper function (not kernel) the source defines."""
    spans = []
    for kind, start, end in items:
        if kind == "function":
            open_ = next((j for j in range(start, end) if ts[j].kind == PUNCT and ts[j].text == "("), None)
            if open_ is not None and open_ > start and ts[open_ - 1].kind == ID:
                spans.append((ts[open_ - 1].text, start, end))
    return spans


def struct_names(ts: list[Token], items: list[tuple[str, int, int]]) -> set[str]:
    """The names of the structs the source defines (type names in casts)."""
    return {ts[k + 1].text for kind, start, end in items if kind == "struct" for k in range(start, end - 1)
            if ts[k].text == "struct" and ts[k + 1].kind == ID}


def buffer_names(ts: list[Token], items: list[tuple[str, int, int]]) -> set[str]:
    """The names of every kernel's ``device``/``constant`` parameters (a top-level macro naming one is refused: its
    accesses could not be bounds-checked)."""
    names: set[str] = set()
    for kind, start, end in items:
        k = next((j for j in range(start, end) if ts[j].text == "("), None) if kind == "kernel" else None
        if k is None:
            continue
        for p in split_params(ts, k + 1, group_end(ts, k)):
            cut = next((j for j in range(len(p) - 1) if p[j].text == "[" and p[j + 1].text == "["), len(p))
            ids = [t.text for t in p[:cut] if t.kind == ID]
            if ids and {"device", "constant"} & set(ids):
                names.add(ids[-1])
    return names


def split_params(ts: list[Token], start: int, end: int) -> list[list[Token]]:
    """The parameter token lists between ``start`` and ``end`` (split at top-level commas)."""
    params: list[list[Token]] = []
    cur: list[Token] = []
    j = start
    while j < end:
        t = ts[j]
        if t.kind == PUNCT and t.text in ("(", "["):
            close = group_end(ts, j)
            cur += ts[j:close + 1]
            j = close + 1
            continue
        if t.kind == PUNCT and t.text == ",":
            params.append(cur)
            cur = []
        else:
            cur.append(t)
        j += 1
    if cur:
        params.append(cur)
    return params

