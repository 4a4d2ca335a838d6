"""The checked accesses (``guard``): the rules that rewrite each access through a tracked buffer pointer or
array into a bounds-checked one (``deref``, ``guard_name``), track pointer variables (``pointer_declaration``)
and casts to device pointers (``device_cast``), pass the bounds to helper functions (``helper_bound_params`` and
their calls), and refuse what they cannot follow.
"""
from __future__ import annotations

from mtlir.runtime.sim.msl.guard.bound import _HOW, _SPACES, FAULT_PARAM, Bound
from mtlir.runtime.sim.msl.guard.scan import (_ASSIGN, _expression_end, _is_cast, _is_write, _literal, _member,
                                              _operand_end, _pointee_vector, _pointer_names, _split_args, _unary)
from mtlir.runtime.sim.msl.lex import ID, NUM, PUNCT, RAW, Token
from mtlir.runtime.sim.msl.names import SCALARS, VECTORS, cl_name, storage_type
from mtlir.runtime.sim.msl.rewrite import Ctx, TokenMatch, at, group_end, refuse, rewrite, tok, type_end

__all__ = ["guarded_access", "deref", "guard_name", "pointer_declaration", "helper_bound_params", "device_cast",
           "pointer_argument"]


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


def _checked(bound: Bound, write: bool, ctx: Ctx) -> tuple[str, str]:
    """A new temporary's name and the check of it against ``bound`` (``__MTL_CHK(a, ...)``: the pointer itself, or
    the scratch area when out of range)."""
    assert ctx.guard is not None
    n = ctx.guard.counter
    ctx.guard.counter += 1
    ctx.prelude.need_bounds_check()
    a = f"__mtl_a{n}"
    code = (f"{2 * int(bound.code) + 1 + int(write)}u" if bound.code.isdigit()
            else f"{bound.code} * 2u + {int(write) + 1}u")
    macro = {"global": "__MTL_CHK", "local": "__MTL_CHK_L", "private": "__MTL_CHK_P"}[bound.space]
    if bound.space != "global":
        ctx.guard.scratch.add(bound.space)
    return a, f"{macro}({a}, {bound.start}, {bound.length}, {code})"


_COMPONENTS = {c: k for k, c in enumerate("xyzw")} | {c: k for k, c in enumerate("rgba")}


def guarded_access(pointer: list[Token], bound: Bound, write: bool, ctx: Ctx, vector: str | None = None,
                   component: int | None = None) -> list[Token]:
    """The tokens of a checked access: the lvalue ``*pointer`` where ``pointer`` (OpenCL tokens) is evaluated once,
    checked against ``bound``, and replaced by the scratch area when out of range (``__mtl_chk``). A read of a
    device vector (``vector``: its OpenCL type, ``float4``) is ``vload4(0, (const __global float*)checked)``
    instead, an rvalue that needs only the element's alignment (OpenCL C §6.15.10): Metal lets a ``float4`` sit at
    any element offset, and NVIDIA's OpenCL faults on a misaligned ``float4`` dereference even through the
    element-aligned alias (docs/kernels.md, "Vector loads and stores at any offset"). One ``component`` of a device
    vector (``p->y``, ``p[i].y``) is the lvalue of that element, ``(*((__global float*)checked + 1))``."""
    a, check = _checked(bound, write, ctx)
    tail = tok(f"); {check}; }}))", RAW)
    if vector is not None and bound.space == "global":
        elem, n = VECTORS[vector]
        if component is not None:
            head = tok(f"(*((__global {elem}*)({{ __auto_type {a} = (", RAW)
            return [head, *pointer, tok(f"); {check}; }}) + {component}))", RAW)]
        if not write:
            return [tok(f"vload{n}(0, (const __global {elem}*)({{ __auto_type {a} = (", RAW), *pointer, tail]
    return [tok(f"(*({{ __auto_type {a} = (", RAW), *pointer, tail]


def _component(ts: list[Token], j: int, vector: str | None) -> int | None:
    """The element a member access at ``j`` (``.y``, ``->y``) of a vector names (1), when one letter names it."""
    if vector is None or at(ts, j).text not in (".", "->") or at(ts, j + 1).kind != ID:
        return None
    k = _COMPONENTS.get(at(ts, j + 1).text)
    return k if k is not None and k < VECTORS[vector][1] else None


def _vector_store(ts: list[Token], pointer: list[Token], bound: Bound, vector: str | None, after: int,
                  ctx: Ctx) -> tuple[int, list[Token]] | None:
    """A store of a device vector through ``pointer`` (OpenCL tokens) when an assignment operator follows the access
    at ``after``: ``*p = e`` -> ``({ checked p; float4 v = (e); vstore4(v, 0, p); v; })`` and ``*p += e`` ->
    ``... v = vload4(0, p) + (e) ...`` (the address evaluated once; the value of the expression is the stored
    vector, as C's assignment gives it). Returns the index past the right-hand side and the tokens; None when this
    is no such store (a scalar, threadgroup or thread memory, ``(*p).x = e``, ``++*p``: they keep the dereference of
    the element-aligned alias)."""
    op = at(ts, after)
    if vector is None or bound.space != "global" or op.kind != PUNCT or op.text not in _ASSIGN:
        return None
    end = _expression_end(ts, after + 1)
    rhs = rewrite(ts, ctx, after + 1, end)
    a, check = _checked(bound, True, ctx)
    elem, n = VECTORS[vector]
    p, v = a.replace("_a", "_p"), a.replace("_a", "_v")
    value = "" if op.text == "=" else f"vload{n}(0, {p}) {op.text[:-1]} "
    head = tok(f"({{ __auto_type {a} = (", RAW)
    mid = tok(f"); __global {elem}* {p} = (__global {elem}*){check}; {vector} {v} = {value}(", RAW)
    tail = tok(f"); vstore{n}({v}, 0, {p}); {v}; }})", RAW)
    return end, [head, *pointer, mid, *rhs, tail]


def _array_declaration(ts: list[Token], i: int, ctx: Ctx) -> None:
    """``float buf0[16];`` / ``threadgroup float buf1[16];`` (a type at ``i``, then a name and one ``[size]``
    followed by ``;`` or ``=``) in a kernel: the array becomes a tracked name bounded by its own bytes."""
    g = ctx.guard
    assert g is not None
    name = at(ts, i + 1)
    close = group_end(ts, i + 2)
    if at(ts, close + 1).text not in (";", "=") or ctx.scope != "kernel" or not g.fault:
        return
    k = i - 1
    while k >= 0 and not (ts[k].kind == PUNCT and ts[k].text in (";", "{", "}")):
        k -= 1
    space = "local" if any(t.kind == ID and t.text == "threadgroup" for t in ts[k + 1:i]) else "private"
    cl = cl_name(name.text)
    g.ptrs[name.text] = Bound(f"(ulong){cl}", f"sizeof({cl})", str(g.first_array_code + len(g.arrays)), space)
    g.arrays.append((name.text, space, ts[i].text))
    if close == i + 4 and ts[i + 3].kind == NUM and _literal(ts[i + 3].text) is not None:
        g.counts[name.text] = _literal(ts[i + 3].text)  # type: ignore[assignment]
    g.allow([name])


def _constant_element(ts: list[Token], a: int, b: int, ctx: Ctx) -> bool:
    """True when ``ts[a:b]`` is ``name``, ``name + K`` or ``name[K]`` (parenthesised or not) for an array of a
    literal size and a literal ``K`` inside it: an access the translator checks itself (tinygrad's private
    accumulators ``*(buf0+0)``), so the kernel keeps it plain and the compiler keeps the array in registers."""
    assert ctx.guard is not None
    while b - a >= 2 and ts[a].text == "(" and group_end(ts, a) == b - 1:
        a, b = a + 1, b - 1
    texts = [t.text for t in ts[a:b]]
    count = ctx.guard.counts.get(texts[0]) if texts else None
    if count is None:
        return False
    if len(texts) == 1:
        return True
    if len(texts) == 3 and texts[1] == "+" or len(texts) == 4 and texts[1] == "[" and texts[3] == "]":
        k = _literal(texts[2])
        return k is not None and 0 <= k < count
    return False


# --- the rules (``rewrite`` calls guard_name for identifiers when a Guard is active) ---

def deref(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """A unary ``*`` whose operand's pointer comes from one tracked buffer pointer -> the checked access. A
    dereference of a pointer from no buffer (private or threadgroup memory) is left as it is, unless the operand
    casts to a ``device``/``constant`` pointer (a pointer into device memory from nowhere: refused)."""
    if ctx.guard is None or not _unary(ts, i, ctx):
        return None
    end = _operand_end(ts, i + 1, ctx)
    names = _pointer_names(ts, i + 1, end, ctx)
    if not names:
        if any(t.kind == ID and t.text in _SPACES for t in ts[i + 1:end]):
            refuse(ts[i], "*", "a dereference of a device or constant pointer that does not come from a buffer "
                               f"parameter: the simulated device cannot bounds-check it ({_HOW})")
        return None
    bound = _bound_of(ts, names, ctx, ts[i], "this dereference")
    ctx.guard.allow([ts[j] for j in names])
    if bound.space != "global" and _constant_element(ts, i + 1, end, ctx):
        return None  # in bounds by the translator's own check: the tokens pass as they are
    vector = _pointee_vector(ts, i + 1, end, ctx)
    pointer = rewrite(ts, ctx, i + 1, end)
    store = _vector_store(ts, pointer, bound, vector, end, ctx)
    if store is not None:
        return store[0] - i, store[1]
    return end - i, guarded_access(pointer, bound, _is_write(ts, i, end), ctx, vector)


def guard_name(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """An identifier while a Guard is active: a call of a helper that takes buffer pointers (its bounds are
    appended to the arguments), or a tracked buffer pointer: ``p[e]`` and ``p->f`` become checked accesses; a
    pointer value an enclosing rule accounted for passes; ``q = <pointer>`` sets or checks ``q``'s buffer;
    ``q += n``, ``q++`` keep it; any other use is refused (the translator could not follow it)."""
    g = ctx.guard
    assert g is not None
    t = ts[i]
    name = t.text
    nxt = at(ts, i + 1).text
    if name in ctx.helpers and nxt == "(" and not _member(ts, i):
        return _helper_call(ts, i, ctx)
    if ((name in SCALARS or name in VECTORS or name in ctx.type_names) and at(ts, i + 1).kind == ID
            and at(ts, i + 2).text == "["):
        _array_declaration(ts, i, ctx)
        return None
    if name not in g.ptrs or _member(ts, i):
        return None
    out = tok(cl_name(name), ID)
    if id(t) in g.allowed:
        return 1, [out]
    bound = g.ptrs[name]
    if nxt in ("[", "->"):
        if bound is None:
            refuse(t, name, f"the pointer variable `{name}` is used before it is initialised or assigned from a "
                            f"buffer, so its accesses cannot be bounds-checked ({_HOW})")
        if nxt == "[" and bound.space != "global" and _constant_element(ts, i, group_end(ts, i + 1) + 1, ctx):
            return 1, [out]  # name[K] within a literal-size array: checked here, the tokens pass as they are
        if nxt == "[":
            close = group_end(ts, i + 1)
            index = rewrite(ts, ctx, i + 2, close)
            pointer = [out, tok("+", PUNCT, " "), tok("(", PUNCT, " "), *index, tok(")")]
            vector = g.vectors.get(name)
            store = _vector_store(ts, pointer, bound, vector, close + 1, ctx)
            if store is not None:
                return store[0] - i, store[1]
            k = _component(ts, close + 1, vector)
            if k is not None and bound.space == "global":  # p[i].y: that element
                return close + 3 - i, guarded_access(pointer, bound, _is_write(ts, i, close + 3), ctx, vector, k)
            return close + 1 - i, guarded_access(pointer, bound, _is_write(ts, i, close + 1), ctx, vector)
        vector = g.vectors.get(name)
        k = _component(ts, i + 1, vector)
        if k is not None and bound.space == "global":  # p->y: that element
            return 3, guarded_access([out], bound, _is_write(ts, i, i + 3), ctx, vector, k)
        member_write = _is_write(ts, i, i + 3)  # p->xy = e: a store into a swizzle keeps the dereference
        return 2, [*guarded_access([out], bound, member_write, ctx, vector), tok(".")]
    if nxt == "=":
        end = _expression_end(ts, i + 2)
        names = _pointer_names(ts, i + 2, end, ctx)
        if not names:
            refuse(t, name, f"the buffer pointer `{name}` is assigned a value that does not come from a buffer "
                            f"pointer, so its accesses cannot be bounds-checked ({_HOW})")
        got = _bound_of(ts, names, ctx, t, f"the value assigned to `{name}`")
        if bound is None:
            g.ptrs[name] = got
        elif got != bound:
            refuse(t, name, f"the buffer pointer `{name}` is assigned a pointer into another buffer; the translator "
                            f"tracks one buffer per pointer variable ({_HOW})")
        g.allow([ts[j] for j in names])
        return 1, [out]
    if nxt in ("+=", "-=", "++", "--") or (i > 0 and ts[i - 1].text in ("++", "--")):
        return 1, [out]
    if bound is not None and bound.space != "global":
        return 1, [out]  # a threadgroup or thread array as a pointer (passed on, ...): its accesses are not checked
    refuse(t, name, f"the simulated device bounds-checks every access to a buffer and cannot follow this use of the "
                    f"buffer pointer `{name}` ({_HOW})")


def _helper_call(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch:
    """``f(a, p + 1)`` of a helper whose parameter 1 is a buffer pointer -> ``f(a, p + 1, <bounds of p>,
    __mtl_fault)``: the helper checks its own accesses against the buffer of the pointer it was given."""
    positions = ctx.helpers[ts[i].text]
    close = group_end(ts, i + 1)
    spans = _split_args(ts, i + 1, close)
    out: list[Token] = [tok(cl_name(ts[i].text), ID), ts[i + 1]]
    for n, (a, b) in enumerate(spans):
        if n:
            out.append(ts[a - 1])  # the comma
        if n in positions:
            names = _pointer_names(ts, a, b, ctx)
            if not names:
                refuse(ts[i], ts[i].text, f"argument {n + 1} of `{ts[i].text}` is a device pointer parameter, "
                                          "given a pointer that does not come from a buffer: it cannot be "
                                          f"bounds-checked ({_HOW})")
            bound = _bound_of(ts, names, ctx, ts[i], f"argument {n + 1} of `{ts[i].text}`")
            assert ctx.guard is not None
            ctx.guard.allow([ts[j] for j in names])
            out += rewrite(ts, ctx, a, b)
            code = f"{bound.code}u" if bound.code.isdigit() else bound.code
            out.append(tok(f", {bound.start}, {bound.length}, {code}", RAW))
        else:
            out += rewrite(ts, ctx, a, b)
    if len(spans) <= max(positions):
        refuse(ts[i], ts[i].text, f"`{ts[i].text}` is called with {len(spans)} arguments")
    out.append(tok(f", {FAULT_PARAM}", RAW))
    if ts[i].text in ctx.simd_helpers:  # it also takes the SIMD-group scratch (simd)
        out.append(tok(", __mtl_simd", RAW))
    out.append(ts[close])
    return close + 1 - i, out


def pointer_argument(ts: list[Token], a: int, b: int, ctx: Ctx, write: bool, what: str) -> tuple[list[Token], str]:
    """A pointer passed to a builtin that accesses memory through it (``simdgroup_load``, ``simdgroup_store``):
    its rewritten tokens, and the bounds the builtin checks its accesses against, as the text of extra arguments
    ``, start, length, code, __mtl_fault`` when it points into a buffer (``""`` for a threadgroup or thread array,
    whose accesses through a pointer are not checked, and without checks). ``what`` names it in refusals."""
    if ctx.guard is None:
        return rewrite(ts, ctx, a, b), ""
    names = _pointer_names(ts, a, b, ctx)
    if not names:
        return rewrite(ts, ctx, a, b), ""
    bound = _bound_of(ts, names, ctx, ts[a], what)
    ctx.guard.allow([ts[j] for j in names])
    pointer = rewrite(ts, ctx, a, b)
    if bound.space != "global":
        return pointer, ""
    code = (f"{2 * int(bound.code) + 1 + int(write)}u" if bound.code.isdigit()
            else f"{bound.code} * 2u + {int(write) + 1}u")
    ctx.prelude.need_bounds_check()
    return pointer, f", {bound.start}, {bound.length}, {code}, {FAULT_PARAM}"


def pointer_declaration(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``device``/``constant`` at ``i`` starting a declaration of a pointer variable (``device float* q = ...;``):
    ``q`` becomes a tracked pointer (its buffer is set by its initialiser or first assignment). Outside a function
    (structs, prototypes) a ``device`` pointer is refused: its accesses could not be checked. Returns None: the
    address-space rules translate the tokens."""
    if ctx.guard is None:
        if ctx.checks and ctx.scope == "program" and ts[i].text == "device" and at(ts, type_end(ts, i + 1)).text == "*":
            refuse(ts[i], "device T*", "device pointers outside a function's parameters and body (struct members, "
                                       "prototypes) cannot be bounds-checked by the simulated device")
        return None
    j = type_end(ts, i + 1)
    if at(ts, j).text != "*":
        return None
    j += 1
    while at(ts, j).kind == ID and at(ts, j).text in ("const", "volatile", "restrict", "__restrict",
                                                      "__restrict__"):
        j += 1
    name = at(ts, j)
    after = at(ts, j + 1).text
    if name.kind != ID or after not in ("=", ";", ",") or id(name) in ctx.guard.allowed:
        return None  # a cast (device float4*)(...), a helper's parameter, or something the other rules judge
    if after == "," or (after == "=" and at(ts, _expression_end(ts, j + 2)).text == ","):
        refuse(name, name.text, "declare one device pointer per declaration so the translator can track which "
                                "buffer it points into")
    ctx.guard.ptrs[name.text] = None
    vectors = [storage_type(t.text) for t in ts[i + 1:j] if t.kind == ID and t.text in VECTORS]
    if vectors:
        ctx.guard.vectors[name.text] = vectors[0]
    else:
        ctx.guard.vectors.pop(name.text, None)
    if after == ";":
        ctx.guard.allow([name])
    return None


def helper_bound_params(ts: list[Token], params: list[tuple[int, int]], ctx: Ctx) -> dict[int, str]:
    """For a helper function's parameter spans: position -> the extra OpenCL parameters carrying the bounds of each
    ``device``/``constant`` pointer parameter (which become tracked pointers of the helper's Guard)."""
    assert ctx.guard is not None
    extra: dict[int, str] = {}
    for n, (a, b) in enumerate(params):
        words = [t for t in ts[a:b] if t.kind == ID]
        if not words or not any(w.text in _SPACES for w in words) or not any(t.text == "*" for t in ts[a:b]):
            continue
        name = words[-1]
        if name.text in _SPACES or name.text in SCALARS or name.text in VECTORS:
            refuse(name, name.text, "a device pointer parameter needs a name")
        cl = cl_name(name.text)
        ctx.guard.ptrs[name.text] = Bound(f"__mtl_s_{cl}", f"__mtl_n_{cl}", f"__mtl_k_{cl}")
        vectors = [storage_type(w.text) for w in words if w.text in VECTORS]
        if vectors:
            ctx.guard.vectors[name.text] = vectors[0]
        ctx.guard.allow([name])
        extra[n] = f", ulong __mtl_s_{cl}, ulong __mtl_n_{cl}, uint __mtl_k_{cl}"
    return extra


def device_cast(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """A cast to a ``device``/``constant`` pointer type, ``(device float4*)x``: ``x`` must come from a tracked
    buffer pointer (a pointer made from an integer could reach anything: refused). Declines in every case; the
    other rules translate the tokens."""
    if ctx.guard is None or not _is_cast(ts, i, ctx):
        return None
    close = group_end(ts, i)
    inner = ts[i + 1:close]
    if not any(t.kind == ID and t.text in _SPACES for t in inner) or not any(t.text == "*" for t in inner):
        return None
    end = _operand_end(ts, close + 1, ctx)
    if not _pointer_names(ts, close + 1, end, ctx):
        refuse(ts[i], "(device T*)", "a cast to a device or constant pointer of a value that does not come from a "
                                     f"buffer pointer: its accesses could not be bounds-checked ({_HOW})")
    return None
