"""The checked accesses (``guard``): the rules that rewrite each access through a tracked buffer pointer or
array into a bounds-checked one (``deref``, ``guard_name``; a vector's by ``vector``, also ``prefix_increment``),
track pointer variables (``pointer_declaration``; threadgroup and thread pointers to vectors too) and casts to
device pointers (``device_cast``), pass the bounds to helper functions (``helper_bound_params`` and their calls),
and refuse what they cannot follow.
"""
from __future__ import annotations

from mtlir.runtime.sim.msl.guard.bound import _HOW, _SPACES, FAULT_PARAM, Bound
from mtlir.runtime.sim.msl.guard.pointers import (_address_of_element, _bound_of, _checking, _compared, _group_pointer,
                                                  _refuse_pointer_array)
from mtlir.runtime.sim.msl.guard.scan import (_SPACE_OF, _expression_end, _is_cast, _is_write, _literal, _member,
                                              _operand_end, _pointee, _pointer_names, _split_args, _unary)
from mtlir.runtime.sim.msl.guard.vector import VectorAccess, checked, vector_access, vector_increment
from mtlir.runtime.sim.msl.lex import ID, NUM, PUNCT, RAW, Token
from mtlir.runtime.sim.msl.names import SCALARS, VECTORS, cl_name, storage_type
from mtlir.runtime.sim.msl.rewrite import Ctx, TokenMatch, at, group_end, refuse, rewrite, tok, type_end

__all__ = ["guarded_access", "deref", "guard_name", "pointer_declaration", "helper_bound_params", "device_cast",
           "pointer_argument", "prefix_increment"]


def guarded_access(pointer: list[Token], bound: Bound, write: bool, ctx: Ctx) -> list[Token]:
    """The tokens of a checked access to a scalar or struct: the lvalue ``*pointer`` where ``pointer`` (OpenCL
    tokens) is evaluated once, checked against ``bound``, and replaced by the scratch area when out of range
    (``__mtl_chk``); the plain ``(*(pointer))`` in a translation without checks. Vectors are ``vector``'s."""
    if not _checking(ctx):
        return [tok("(*", RAW), *pointer, tok(")", RAW)]
    a, check = checked(bound, write, ctx)
    return [tok(f"(*({{ __auto_type {a} = (", RAW), *pointer, tok(f"); {check}; }}))", RAW)]


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


def _deref_parts(ts: list[Token], i: int, ctx: Ctx) -> tuple[int, list[int], Bound | None, str | None, str] | None:
    """What the unary ``*`` at ``i`` reaches: its operand's end, the tracked names the pointer comes from, their
    ``Bound``, the vector it points to (None: a scalar or struct) and its memory; None when the dereference stays
    as it is (a pointer from no buffer that is no vector, an element of a literal-size array). Refuses a device
    pointer from no buffer (a translation with checks) and a pointer mixing buffers."""
    assert ctx.guard is not None
    end = _operand_end(ts, i + 1, ctx)
    names = _pointer_names(ts, i + 1, end, ctx)
    got = _pointee(ts, i + 1, end, ctx)
    if not names:
        if _checking(ctx) and any(t.kind == ID and t.text in _SPACES for t in ts[i + 1:end]):
            refuse(ts[i], "*", "a dereference of a device or constant pointer that does not come from a buffer "
                               f"parameter: the simulated device cannot bounds-check it ({_HOW})")
        if got is None or got[1] is None:
            return None
        return end, [], None, got[0], got[1]  # a threadgroup or thread vector pointer: unchecked, but a vload
    bound = _bound_of(ts, names, ctx, ts[i], "this dereference")
    if bound.space != "global" and _constant_element(ts, i + 1, end, ctx):
        ctx.guard.allow([ts[j] for j in names])
        return None  # in bounds by the translator's own check: the tokens pass as they are
    return end, names, bound, None if got is None else got[0], bound.space


def _indexed(ts: list[Token], i: int, ctx: Ctx) -> tuple[list[Token], int]:
    """The pointer an access through the name at ``i`` reaches, as OpenCL tokens, and the index past the access:
    ``p[e]`` -> ``p + (e)``; ``p`` (before ``->``) -> ``p``."""
    out = tok(cl_name(ts[i].text), ID)
    if at(ts, i + 1).text != "[":
        return [out], i + 1
    close = group_end(ts, i + 1)
    index = rewrite(ts, ctx, i + 2, close)
    return [out, tok("+", PUNCT, " "), tok("(", PUNCT, " "), *index, tok(")")], close + 1


# --- the rules (``rewrite`` calls guard_name for identifiers when a Guard is active) ---

def deref(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """A unary ``*`` whose operand's pointer comes from one tracked buffer pointer -> the checked access; to a
    vector, a ``vloadN``/``vstoreN`` (``vector.vector_access``, also for a threadgroup or thread vector pointer,
    unchecked). Another dereference of a pointer from no buffer (private or threadgroup memory) is left as it is;
    one whose operand casts to a ``device``/``constant`` pointer (device memory from nowhere) is refused."""
    if ctx.guard is None or not _unary(ts, i, ctx):
        return None
    parts = _deref_parts(ts, i, ctx)
    if parts is None:
        return None
    end, names, bound, vector, space = parts
    ctx.guard.allow([ts[j] for j in names])
    if vector is None and not ctx.guard.checked:
        return None  # without checks a scalar access stays as it is written
    pointer = rewrite(ts, ctx, i + 1, end)
    if vector is None:
        assert bound is not None
        return end - i, guarded_access(pointer, bound, _is_write(ts, i, end), ctx)
    k, out = vector_access(ts, i, end, VectorAccess(tuple(pointer), vector, space, bound), ctx)
    return k - i, out


def prefix_increment(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """A prefix ``++``/``--`` on a whole vector through a pointer (``++*p``, ``--(*p)``, ``++p[i]``): load, add or
    subtract one, store (``vector.vector_increment``); the value is the new vector. Declines anything else (a
    scalar, an element ``++p->x``: the other rules translate it)."""
    g = ctx.guard
    if g is None or not _unary(ts, i, ctx):
        return None
    after = _operand_end(ts, i + 1, ctx)
    a, b = i + 1, after
    while b - a >= 2 and ts[a].text == "(" and group_end(ts, a) == b - 1:
        a, b = a + 1, b - 1
    t = at(ts, a)
    if t.kind == PUNCT and t.text == "*" and _unary(ts, a, ctx) and _operand_end(ts, a + 1, ctx) == b:
        parts = _deref_parts(ts, a, ctx)
        if parts is None or parts[3] is None:
            return None
        end, names, bound, pointee, space = parts
        vector = pointee or ""
        g.allow([ts[j] for j in names])
        pointer = rewrite(ts, ctx, a + 1, end)
    elif (t.kind == ID and at(ts, a + 1).text == "[" and group_end(ts, a + 1) + 1 == b and not _member(ts, a)
          and t.text in g.vectors and (t.text in g.ptrs or t.text in g.spaces)):
        bound = g.ptrs.get(t.text)
        if t.text in g.ptrs and bound is None:
            refuse(t, t.text, f"the pointer variable `{t.text}` is used before it is initialised or assigned from "
                              f"a buffer, so its accesses cannot be bounds-checked ({_HOW})")
        vector, space = g.vectors[t.text], bound.space if bound is not None else g.spaces[t.text]
        pointer = _indexed(ts, a, ctx)[0]
    elif (t.text == "(" and not _is_cast(ts, a, ctx) and at(ts, group_end(ts, a) + 1).text == "["
          and group_end(ts, group_end(ts, a) + 1) + 1 == b):  # `++(c ? p : q)[i]`
        typed = _group_pointer(ts, a, ctx)
        if typed is None:
            return None
        pointer, vector, space, bound = typed
        bracket = group_end(ts, a) + 1
        pointer += [tok("+", PUNCT, " "), tok("(", PUNCT, " "), *rewrite(ts, ctx, bracket + 1, b - 1), tok(")")]
    else:
        return None
    return after - i, vector_increment(VectorAccess(tuple(pointer), vector, space, bound), None, ts[i].text, True, ctx)


def _vector_name_access(ts: list[Token], i: int, ctx: Ctx, bound: Bound | None, vector: str,
                        space: str) -> TokenMatch:
    """``p[e]``, ``p->M`` and ``p[e].M`` of a pointer ``p`` to vectors (``vector.vector_access``)."""
    pointer, end = _indexed(ts, i, ctx)
    member = end if at(ts, end).text == "->" else None
    k, out = vector_access(ts, i, end, VectorAccess(tuple(pointer), vector, space, bound), ctx, member)
    return k - i, out


def guard_name(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """An identifier while a Guard is active: a call of a helper that takes buffer pointers (its bounds are
    appended to the arguments), or a tracked buffer pointer: ``p[e]`` and ``p->f`` become checked accesses (to a
    vector, ``vloadN``/``vstoreN``, as for a threadgroup or thread vector pointer); a pointer value an enclosing
    rule accounted for passes; ``q = <pointer>`` sets or checks ``q``'s buffer; ``q += n``, ``q++`` keep it; any
    other use is refused (the translator could not follow it)."""
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
    if name in g.spaces and name not in g.ptrs and nxt in ("[", "->") and not _member(ts, i):
        if _address_of_element(ts, i, ctx):
            return 1, [tok(cl_name(name), ID)]  # `&t[i]`: an address (`t + i`), no access
        return _vector_name_access(ts, i, ctx, None, g.vectors[name], g.spaces[name])
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
        vector = g.vectors.get(name)
        if vector is not None and not _address_of_element(ts, i, ctx):
            return _vector_name_access(ts, i, ctx, bound, vector, bound.space)
        if not g.checked:
            return 1, [out]  # without checks a scalar access stays as it is written
        pointer, end = _indexed(ts, i, ctx)
        if nxt == "[":
            return end - i, guarded_access(pointer, bound, _is_write(ts, i, end), ctx)
        return 2, [*guarded_access(pointer, bound, _is_write(ts, i, i + 3), ctx), tok(".")]
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
    if bound is not None and bound.space != "global" or not g.checked:
        return 1, [out]  # a threadgroup or thread array as a pointer (passed on, ...), or no checks: passed as it is
    if _compared(ts, i, ctx):
        return 1, [out]  # `q < p + 2`: a comparison reads no memory, and its value is no pointer
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
    if bound.space != "global" or not ctx.guard.checked:
        return pointer, ""
    code = (f"{2 * int(bound.code) + 1 + int(write)}u" if bound.code.isdigit()
            else f"{bound.code} * 2u + {int(write) + 1}u")
    ctx.prelude.need_bounds_check()
    return pointer, f", {bound.start}, {bound.length}, {code}, {FAULT_PARAM}"


def pointer_declaration(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``device``/``constant`` at ``i`` starting a declaration of a pointer variable (``device float* q = ...;``):
    ``q`` becomes a tracked pointer (its buffer is set by its initialiser or first assignment). Outside a function
    (structs, prototypes) a ``device`` pointer is refused: its accesses could not be checked. ``threadgroup`` or
    ``thread`` at ``i`` declaring a pointer to vectors (``threadgroup float4* t = ...;``): ``t``'s accesses are
    ``vloadN``/``vstoreN`` (``Guard.spaces``), unchecked. Returns None: the address-space rules translate the
    tokens."""
    if ctx.guard is not None and ts[i].text in ("threadgroup", "thread"):
        _vector_pointer_variable(ts, i, ctx)
        return None
    if ctx.guard is None:
        j = type_end(ts, i + 1)
        if ctx.scope == "program" and at(ts, j).text == "*" and any(t.text in VECTORS for t in ts[i + 1:j]):
            refuse(ts[i], f"{ts[i].text} T*", "pointers to vectors outside a function's parameters and body (struct "
                                              "members, prototypes): the translator could not type the accesses "
                                              "made through them as vector loads and stores")
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
    _refuse_pointer_array(ts, i, j, ctx)
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


def _vector_pointer_variable(ts: list[Token], i: int, ctx: Ctx) -> None:
    """``threadgroup float4* t = ...;`` / ``thread half2* t;`` (the address space at ``i``; also a helper's
    parameter, ``name_at`` its name): ``t`` points to vectors in that memory (``Guard.vectors``, ``Guard.spaces``);
    any other pointer declared so stops being one."""
    g = ctx.guard
    assert g is not None
    j = type_end(ts, i + 1)
    if at(ts, j).text != "*":
        return
    j += 1
    while at(ts, j).kind == ID and at(ts, j).text in ("const", "volatile", "restrict", "__restrict", "__restrict__"):
        j += 1
    name = at(ts, j)
    _refuse_pointer_array(ts, i, j, ctx)
    if name.kind != ID or name.text in g.ptrs or at(ts, j + 1).text not in ("=", ";", ",", ")"):
        return
    vectors = [storage_type(t.text) for t in ts[i + 1:j] if t.kind == ID and t.text in VECTORS]
    if vectors:
        g.vectors[name.text], g.spaces[name.text] = vectors[0], _SPACE_OF[ts[i].text]
    elif name.text in g.spaces:
        del g.vectors[name.text], g.spaces[name.text]


def helper_bound_params(ts: list[Token], params: list[tuple[int, int]], ctx: Ctx) -> dict[int, str]:
    """For a helper function's parameter spans: position -> the extra OpenCL parameters carrying the bounds of each
    ``device``/``constant`` pointer parameter (which become tracked pointers of the helper's Guard)."""
    assert ctx.guard is not None
    extra: dict[int, str] = {}
    for n, (a, b) in enumerate(params):
        words = [t for t in ts[a:b] if t.kind == ID]
        if words and words[0].text in ("threadgroup", "thread"):  # a threadgroup or thread pointer to vectors
            _vector_pointer_variable(ts, a, ctx)
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
    if not _checking(ctx) or not _is_cast(ts, i, ctx):
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
