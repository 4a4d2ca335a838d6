"""Bounds checks on buffer accesses: the translated kernels never touch memory outside the MTLBuffers bound to them.

On Metal a kernel that reads or writes far past a buffer faults the GPU (the command buffer ends in status Error,
PageFault, METAL.md §2); on PoCL the same access is a load or store into the host process, which crashes it or
silently corrupts its heap. So every access through a ``device`` or ``constant`` buffer pointer is checked against
the MTLBuffer it points into. The translator knows which identifiers are buffer pointers (the kernel's buffer
parameters, a helper function's ``device T*`` parameters, and pointer variables initialised or assigned from them:
their *provenance*), and rewrites each access it finds:

- ``p[e]`` -> the access at ``p + (e)``; ``p->f`` -> the access at ``p``;
- ``*X`` where the pointer expression ``X`` involves exactly one tracked pointer at its top level (``*(p + e)``,
  ``*((device float4*)(p + e))``, ``*p++``) -> the access at ``X``.

An access becomes ``(*({ __auto_type a = (X); __MTL_CHK(a, start, length, code); }))`` (the macro is
``(__typeof__(a))__mtl_chk((__global uchar*)(a), sizeof(*(a)), start, length, __mtl_fault, code)``): a GNU
statement expression (Clang accepts it in OpenCL C) that evaluates ``X`` once and keeps its
type, so loads, stores, ``+=``, ``.x`` and ``&`` work as before. ``__mtl_chk`` (in the prelude) returns the
address when ``[a, a + sizeof(*a))`` lies inside the MTLBuffer ``[start, start + length)``; otherwise it records
the first such access in the kernel's fault buffer (which parameter, read or write, the byte offset and size) and
returns a scratch area instead, so the access is skipped (a read gets scratch bytes). The runner reads the fault
buffer after the run (``kernels.py``) and raises ``KernelAccessError``; the simulated GPU turns that into a
PageFault (``gpu.py``).

What the translator cannot follow it refuses with ``UnsupportedKernelError`` naming the pointer, never running it
unchecked: a buffer pointer used in any other way (compared, converted to an integer, passed to a macro, stored
in a variable that is not a ``device``/``constant`` pointer), a dereference whose pointer mixes two buffers or
comes from no buffer at all (``*((device float*)(x))``), a pointer variable used before it is assigned from a
buffer, a cast of an integer to a ``device`` pointer, a function returning one, ``device`` pointers in structs or
prototypes, a top-level ``#define`` naming a buffer parameter. Helper functions with ``device T*`` parameters get
the bounds as hidden extra parameters, passed at each call.

A kernel's own fixed-size arrays (``float buf0[16];``, ``threadgroup float buf1[16];``) are tracked the same way,
bounded by their own bytes (``__MTL_CHK_L``/``__MTL_CHK_P`` with scratch areas of their address space); an
element the translator can check itself (``*(buf0+0)``) stays plain. Once an access has been skipped, every loop
without a barrier also ends (``loop_guard``), so a runaway loop does not keep the dispatch busy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mtlir.runtime.sim.msl_lex import ID, NUM, PUNCT, RAW, STR, Token
from mtlir.runtime.sim.msl_names import SCALARS, VECTORS, cl_name
from mtlir.runtime.sim.msl_rules import QUALIFIERS, RULES, Ctx, Match, at, group_end, refuse, rewrite, tok, type_end

__all__ = ["Bound", "Guard", "ARGS_PARAM", "FAULT_PARAM", "FAULT_WORDS", "SCRATCH_BYTES", "guard_name", "deref",
           "pointer_declaration", "helper_bound_params", "guarded_access", "group_start", "loop_guard"]

ARGS_PARAM = "__mtl_args"  # the kernel's argument block: per binding its offset, bytes before its base, length
FAULT_PARAM = "__mtl_fault"  # the kernel's last OpenCL parameter: the fault record, then scratch
FAULT_WORDS = 16  # uint words of the fault record before the scratch area (64 bytes: scratch is 64-byte aligned)
SCRATCH_BYTES = 1 << 16  # where a skipped access lands: at least any access a kernel makes (a struct, a float4)

_ASSIGN = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="})
_UNARY_AFTER_WORD = frozenset({"return", "case", "sizeof", "else", "do"})
_SPACES = frozenset({"device", "constant"})
_HOW = ("supported: p[i], *(p + i), *((device T*)(p + i)), p->f, &p[i], and device/constant pointer variables "
        "initialised or assigned from one buffer pointer")


@dataclass(frozen=True)
class Bound:
    """Where a tracked pointer may reach, as OpenCL C expressions: ``start`` (ulong, the address of the first byte
    of its MTLBuffer), ``length`` (ulong, the buffer's bytes) and ``code``: the kernel parameter's position among
    its bindings, recorded in the fault buffer (a number for a kernel's own parameter, the name of a uint parameter
    in a helper)."""

    start: str
    length: str
    code: str
    space: str = "global"  # "global" (a buffer), "local" (a threadgroup array), "private" (a thread array)


@dataclass
class Guard:
    """The tracked pointers of the function being translated: MSL name -> ``Bound`` (None: a pointer variable not
    yet assigned from a buffer), the tokens of tracked names that may stand as plain pointer values because an
    enclosing rule accounted for them (``allowed``: id -> token, the token kept alive so its id stays unique), and
    a counter for the names of the generated temporaries; ``fault``: the function has the fault record parameter
    (a kernel, a helper taking buffer pointers). A kernel's fixed-size threadgroup and thread arrays are tracked
    too (``arrays``, in declaration order: their fault codes follow the bindings', from ``first_array_code``);
    ``scratch`` says which spaces' scratch areas their checks need."""

    ptrs: dict[str, Bound | None] = field(default_factory=dict)
    allowed: dict[int, Token] = field(default_factory=dict)
    counter: int = 0
    fault: bool = True
    arrays: list[tuple[str, str, str]] = field(default_factory=list)  # (MSL name, space, element type)
    counts: dict[str, int] = field(default_factory=dict)  # array name -> its element count, when a literal
    first_array_code: int = 0  # fault codes of arrays follow the kernel's bindings
    scratch: set[str] = field(default_factory=set)  # spaces whose scratch area the kernel must declare

    def allow(self, tokens: list[Token]) -> None:
        """Let these tracked-name tokens pass as plain pointer values."""
        for t in tokens:
            self.allowed[id(t)] = t


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


def guarded_access(pointer: list[Token], bound: Bound, write: bool, ctx: Ctx) -> list[Token]:
    """The tokens of a checked access: the lvalue ``*pointer`` where ``pointer`` (OpenCL tokens) is evaluated once,
    checked against ``bound``, and replaced by the scratch area when out of range (``__mtl_chk``)."""
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
    head = tok(f"(*({{ __auto_type {a} = (", RAW)
    tail = tok(f"); {macro}({a}, {bound.start}, {bound.length}, {code}); }}))", RAW)
    return [head, *pointer, tail]


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


def _literal(text: str) -> int | None:
    """The value of a decimal or hex integer literal (``16``, ``0x10``, ``4u``); None for anything else."""
    try:
        return int(text.rstrip("uUlL"), 0)
    except ValueError:
        return None


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


# --- the rules (msl_rules.rewrite calls guard_name for identifiers when a Guard is active) ---

def deref(ts: list[Token], i: int, ctx: Ctx) -> Match | None:
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
    pointer = rewrite(ts, ctx, i + 1, end)
    return end - i, guarded_access(pointer, bound, _is_write(ts, i, end), ctx)


def guard_name(ts: list[Token], i: int, ctx: Ctx) -> Match | None:
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
            return close + 1 - i, guarded_access(pointer, bound, _is_write(ts, i, close + 1), ctx)
        return 2, [*guarded_access([out], bound, False, ctx), tok(".")]
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


def _split_args(ts: list[Token], open_: int, close: int) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of the comma-separated arguments between the brackets at ``open_`` and
    ``close``."""
    spans: list[tuple[int, int]] = []
    j = start = open_ + 1
    while j < close:
        t = ts[j]
        if t.kind == PUNCT and t.text in ("(", "[", "{"):
            j = group_end(ts, j) + 1
            continue
        if t.kind == PUNCT and t.text == ",":
            spans.append((start, j))
            start = j + 1
        j += 1
    if close > open_ + 1:
        spans.append((start, close))
    return spans


def _helper_call(ts: list[Token], i: int, ctx: Ctx) -> Match:
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
    out += [tok(f", {FAULT_PARAM}", RAW), ts[close]]
    return close + 1 - i, out


def pointer_declaration(ts: list[Token], i: int, ctx: Ctx) -> Match | None:
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
        ctx.guard.allow([name])
        extra[n] = f", ulong __mtl_s_{cl}, ulong __mtl_n_{cl}, uint __mtl_k_{cl}"
    return extra


def device_cast(ts: list[Token], i: int, ctx: Ctx) -> Match | None:
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


_FAULTED = "__MTL_FAULTED"  # the prelude's test of the fault record: a bounds check has failed in this run


def loop_guard(ts: list[Token], i: int, ctx: Ctx) -> Match | None:
    """``for (init; cond; step)`` / ``while (cond)`` / ``do ... while (cond);`` -> the condition also ends the loop
    once an access has been skipped in this run (``cond && !__MTL_FAULTED``): the command buffer fails anyway, and a
    loop running far past its buffer (10**8 skipped stores per thread) would otherwise keep the whole dispatch busy
    for minutes where Metal stops at the first fault. Loops that contain a barrier or call a function of the source
    are left alone: work-items leaving such a loop early would no longer meet at the barrier."""
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
    """True when ``ts[a:b]`` has a barrier or a call of a function or macro the source defines."""
    for k in range(a, b):
        t = ts[k]
        if t.kind == ID and (t.text == "threadgroup_barrier" or (t.text in ctx.callables
                                                                 and at(ts, k + 1).text == "(")):
            return True
        if t.kind == "pp":
            return True
    return False


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


# Registered ahead of the address-space rules (pointer_declaration only records, then declines) and of nothing
# else on ``*``.
RULES.setdefault("*", []).insert(0, deref)
RULES.setdefault("(", []).insert(0, device_cast)
for _loop in ("for", "while"):
    RULES.setdefault(_loop, []).insert(0, loop_guard)
for _space in sorted(_SPACES):
    RULES.setdefault(_space, []).insert(0, pointer_declaration)
