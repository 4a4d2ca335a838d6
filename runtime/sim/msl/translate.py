"""Metal Shading Language -> OpenCL C: how the simulated Metal device runs real kernels (METAL.md §4).

``translate(msl)`` tokenizes the MSL (``lex``), refuses what it cannot translate (``UnsupportedKernelError``
naming the construct: atomics, textures, C++ features, ...), rewrites half and bfloat into software arithmetic on
floats (``softfloat``), splits the source into top-level items and rewrites each with the token rules of
``token_rules``. Kernel
signatures are rebuilt here, because Metal binds arguments differently from OpenCL:

- every buffer parameter (``device float* data0``, ``constant T* p``) becomes an OpenCL buffer parameter
  (``__global uchar* data0_base``) and the kernel starts with ``__global float* data0 = (__global
  float*)(data0_base + __mtl_args[0]);``: the byte offset comes from the kernel's argument block ``__mtl_args``
  (one small buffer per run: an OpenCL scalar argument costs far more to set), so the runner binds a view either
  as an OpenCL sub-buffer with offset 0 or as the whole buffer with the offset (``kernels.runner``); the block also
  carries each buffer's bounds, against which every access is checked (``guard``);
- a ``constant T& name`` variable is read once at the top from the buffer bound at its index, the same way:
  ``const int name = *((__global const int*)(name_base + __mtl_args[6]));``;
- thread-position parameters (``uint3 gid [[threadgroup_position_in_grid]]``) become locals filled from OpenCL's
  work-item functions (``get_group_id(0..2)``, ...; Metal's threadgroup is OpenCL's work-group).

Buffer indices are those of ``[[buffer(n)]]``, else the parameter's position among the buffer parameters (how
tinygrad's kernels are bound, METAL.md §1). The translated source starts with the ``Prelude`` the rules asked for.

    >>> t = translate("kernel void k(device float* a, uint3 gid [[thread_position_in_grid]]) { a[gid.x] = 1.0f; }")
    >>> [(a.name, a.kind, a.index, a.dtype) for a in t.kernels["k"].args]
    [('a', 'buffer', 0, 'float32')]
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mtlir.errors import KernelCompileError
from mtlir.runtime.sim.msl.lex import ID, NUM, PP, PUNCT, RAW, MslSyntaxError, Token, render, tokenize
from mtlir.runtime.sim.msl.names import (MATRIX_TYPES, POSITIONS, POSITIONS_LINEAR, SCALARS, TEMPLATES, VECTORS,
                                          canonical_type_spellings, cl_name, dtype_name, is_soft, refused_construct,
                                          scalar_size, storage_type)
from mtlir.runtime.sim.msl.guard.access import guard_name, guarded_access, helper_bound_params
from mtlir.runtime.sim.msl.guard.bound import ARGS_PARAM, FAULT_PARAM, Bound, Guard
from mtlir.runtime.sim.msl.prelude import Prelude
from mtlir.runtime.sim.msl.rewrite import Ctx, argument_spans, at, group_end, refuse, rewrite, tok
from mtlir.runtime.sim.msl.simd import SIMD_BEGIN, SIMD_PARAM, SIMD_POSITIONS, SUPPORTED, simd_helpers, uses_scratch
from mtlir.runtime.sim.msl.softfloat.lowering import lower_soft_floats, uses_soft_floats
from mtlir.runtime.sim.msl.softfloat.rounding import SOFTFLOAT_PRELUDE
from mtlir.runtime.sim.msl.token_rules import TOKEN_RULES
from mtlir.runtime.sim.msl.uniform import check_simd_control_flow

__all__ = ["KernelArg", "ParamBinding", "KernelInfo", "LocalArray", "Translation", "translate", "kernel_functions"]

_PARAM_QUALIFIERS = frozenset({"device", "constant", "threadgroup", "thread", "const", "volatile", "restrict",
                               "__restrict", "__restrict__", "struct"})
MAX_BUFFER_INDEX = 30  # [[buffer(n)]]: n in 0..30 (MSL spec §5.2.1; Metal binds at most 31 buffers)
# maxThreadgroupMemoryLength of every Apple GPU family (Metal feature set tables): 32 KiB. PoCL offers more (2 MiB
# here) and aborts the whole process when a kernel's __local arrays exceed its own limit.
MAX_THREADGROUP_MEMORY = 32768
# Scalar position attributes: the thread's index in its threadgroup, and its SIMD-group and quad-group positions.
_LINEAR_POSITIONS = {**POSITIONS_LINEAR, **SIMD_POSITIONS}


@dataclass(frozen=True)
class KernelArg:
    """One Metal-bound kernel parameter in MSL parameter order: ``kind`` is ``"buffer"`` (a ``device`` or
    ``constant`` pointer) or ``"constant"`` (a ``constant T&`` variable), ``index`` its Metal buffer index, and
    ``dtype`` the element type as an mtlir dtype name (``float32``, ``int32``, ``float32x4``; a struct's name)."""

    name: str
    kind: str
    index: int
    dtype: str


@dataclass(frozen=True)
class ParamBinding:
    """How one ``KernelArg`` reaches OpenCL: the name of its buffer parameter (``base``), the OpenCL expression of
    its byte offset from that base (``off``: a slot of the kernel's argument block, ``__mtl_args[3 * slot]``),
    whether the kernel may write through it, ``align``: the bytes its offset must be a multiple of (the element's
    scalar size, as Metal requires, METAL.md §1), ``nbytes``: the bytes a ``constant`` variable reads (0 when
    unknown: a struct), ``elem``: bytes per element of its type (0 when unknown) and ``slot``: its position among
    the kernel's bindings, which indexes the argument block (``ARGS_PARAM``: per binding the offset, the bytes of
    the MTLBuffer before the base pointer, and the MTLBuffer's length; the last two bound its accesses,
    ``guard``)."""

    arg: KernelArg
    base: str
    off: str
    writable: bool
    align: int
    nbytes: int
    elem: int = 0
    slot: int = 0


@dataclass(frozen=True)
class LocalArray:
    """A fixed-size array a kernel declares (``threadgroup float buf1[16];``, ``float buf0[4];``), whose accesses
    are bounds-checked like a buffer's: its ``name``, ``memory`` (``threadgroup`` or ``thread``) and ``elem``:
    bytes per element (0 when unknown: a struct)."""

    name: str
    memory: str
    elem: int


@dataclass(frozen=True)
class KernelInfo:
    """One kernel function of the translated source: its bound parameters (``bindings``, in MSL order; the
    OpenCL parameters are each binding's base, then the argument block ``__mtl_args`` (three ulongs per binding:
    ``ParamBinding``) and the fault buffer ``__mtl_fault`` (``guard``)), whether it uses barriers or
    threadgroup memory (then OpenCL's work-group must be exactly Metal's threadgroup), and the
    ``[[max_total_threads_per_threadgroup(n)]]`` it declares (``None`` if none), the fixed-size threadgroup
    and thread arrays whose accesses are checked (``arrays``: their fault codes follow the bindings'), and
    ``simd``: it exchanges values between SIMD-group lanes, so it takes one more OpenCL parameter after the fault
    buffer, the threadgroup scratch ``__local uchar* __mtl_simd`` of ``simd.scratch_bytes(threads)`` bytes."""

    function: str
    bindings: tuple[ParamBinding, ...]
    uses_barrier: bool
    threadgroup_vars: tuple[str, ...]
    max_total_threads_per_threadgroup: int | None = None
    arrays: tuple[LocalArray, ...] = ()
    simd: bool = False

    @property
    def args(self) -> tuple[KernelArg, ...]:
        """The Metal-bound parameters in MSL order."""
        return tuple(b.arg for b in self.bindings)


@dataclass(frozen=True)
class Translation:
    """The OpenCL C ``source`` of a whole MSL library and its kernels by function name. ``origins``: the line map,
    one ``(offset in source, length, MSL line, MSL column)`` per token that comes from the MSL, in source order
    (``msl_position`` reads it)."""

    source: str
    kernels: dict[str, KernelInfo] = field(default_factory=dict)
    origins: tuple[tuple[int, int, int, int], ...] = ()

    def msl_position(self, line: int, col: int) -> tuple[int, int] | None:
        """The MSL (line, column) of 1-based ``line``/``col`` of ``source`` (a compiler diagnostic's place): within
        a token from the MSL, that place in it; after one on the same line of ``source``, just past its end (where
        clang puts an ``expected ';'``). None in generated code (the prelude, helpers, a line of made tokens)."""
        import bisect
        lines = self.source.split("\n")
        if not 1 <= line <= len(lines) or col < 1:
            return None
        pos = sum(len(text) + 1 for text in lines[:line - 1]) + col - 1
        i = bisect.bisect_right(self.origins, (pos, 1 << 62)) - 1
        if i < 0:
            return None
        off, n, msl_line, msl_col = self.origins[i]
        if "\n" in self.source[off:pos]:
            return None
        return msl_line, msl_col + min(pos - off, n)


def translate(msl: str, *, bounds_checks: bool = True) -> Translation:
    """Translate the MSL library ``msl`` (every function in it, as Metal compiles a library whole) to OpenCL C.

    ``half`` and ``bfloat`` are computed in software (``softfloat``) on any OpenCL device. ``bounds_checks``: every
    access through a buffer pointer, and to a kernel's own fixed-size arrays, is checked against its memory
    (``guard``; the kernel runner always translates with them); False gives the same kernels without the
    checks, for reading a translation only. Raises ``UnsupportedKernelError`` (``.construct`` names the first
    construct it cannot translate, with its line and column in the message; also a buffer pointer the checks
    cannot follow), ``MslSyntaxError`` (a ``KernelCompileError``) for source that is not MSL at the token level, and
    ``KernelCompileError`` for a kernel signature Metal would reject (duplicate or out-of-range buffer index) or
    more than 32 KiB of threadgroup arrays."""
    ts = canonical_type_spellings(tokenize(msl))
    _refuse_unsupported(ts)
    prelude = Prelude()
    if uses_soft_floats(ts):
        ts = lower_soft_floats(ts, _items(ts), _struct_names(ts, _items(ts)))
        prelude.need_library("softfloat", SOFTFLOAT_PRELUDE)
    items = _items(ts)
    ctx = Ctx(prelude, TOKEN_RULES, callables=_defined_functions(ts), name_rule=guard_name, checks=bounds_checks,
              type_names=_struct_names(ts, items) | set(MATRIX_TYPES),
              buffer_names=_buffer_names(ts, items) if bounds_checks else set(),
              simd_helpers=simd_helpers(ts, _function_spans(ts, items)))
    check_simd_control_flow(ts, items, ctx.simd_helpers, _struct_names(ts, items))
    out: list[Token] = []
    kernels: dict[str, KernelInfo] = {}
    for kind, start, end in items:
        if kind == "kernel":
            info, toks = _translate_kernel(ts, start, end, ctx)
            if info.function in kernels:
                raise KernelCompileError(f"MSL {ts[start].where()}: kernel {info.function!r} is defined twice")
            kernels[info.function] = info
            out += toks
        elif kind == "struct":
            out += _translate_struct(ts, start, end, ctx)
        elif kind == "function":
            out += _translate_function(ts, start, end, ctx)
        else:
            ctx.scope, ctx.depth = ("function" if kind == "function" else "program"), 0
            out += rewrite(ts, ctx, start, end)
    out.append(ts[-1])
    raw = render(out)
    body = raw.lstrip("\n")
    head = "// OpenCL C translated from MSL by mtlir.runtime.sim.msl.translate\n" + prelude.render()
    return Translation(head + body, kernels, _origins(out, len(head) - (len(raw) - len(body))))


def _origins(tokens: list[Token], base: int) -> tuple[tuple[int, int, int, int], ...]:
    """The line map of ``Translation.origins``: where each token from the MSL (``line`` > 0) lands once ``render``
    has joined ``tokens`` at offset ``base`` of the source."""
    out, offset = [], base
    for t in tokens:
        offset += len(t.space)
        if t.line:
            out.append((offset, len(t.text), t.line, t.col))
        offset += len(t.text)
    return tuple(out)


def kernel_functions(msl: str) -> tuple[str, ...]:
    """The names of the ``kernel`` functions an MSL library defines, in source order, read from its tokens
    (comments and strings cannot fool it). Translates nothing and refuses nothing; raises ``MslSyntaxError`` for
    source that is not MSL at the token level (unbalanced brackets, a stray character)."""
    ts = tokenize(msl)
    names = []
    for kind, start, end in _items(ts):
        if kind == "kernel":
            k = next(j for j in range(start, end) if ts[j].text == "kernel")
            if at(ts, k + 1).text == "void" and at(ts, k + 2).kind == ID:
                names.append(ts[k + 2].text)
    return tuple(names)


def _refuse_unsupported(ts: list[Token]) -> None:
    """Refuse, before anything else, the first identifier of a construct OpenCL C cannot express (the SIMD-group
    functions, matrices and positions ``simd`` emulates are not among them)."""
    for i, t in enumerate(ts):
        if t.kind != ID or t.text in SUPPORTED or (t.text == "namespace" and i and ts[i - 1].text == "using"
                                                   and at(ts, i + 1).text == "metal"):
            continue
        why = refused_construct(t.text)
        if why is None and t.text in TEMPLATES and at(ts, i + 1).text == "<":
            why = f"the {t.text}<...> template has no OpenCL C form"
        if why is not None:
            refuse(t, t.text, why)


def _items(ts: list[Token]) -> list[tuple[str, int, int]]:
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


def _defined_functions(ts: list[Token]) -> set[str]:
    """Names of the functions the source defines or declares at top level (callable from later code)."""
    names: set[str] = set()
    for kind, start, end in _items(ts):
        if kind in ("kernel", "function", "decl"):
            for k in range(start, end):
                if ts[k].text == "(" and ts[k].kind == PUNCT:
                    if k > start and ts[k - 1].kind == ID:
                        names.add(ts[k - 1].text)
                    break
    return names


def _function_spans(ts: list[Token], items: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of every helper function (not kernel) the source defines."""
    spans = []
    for kind, start, end in items:
        if kind == "function":
            open_ = next((j for j in range(start, end) if ts[j].kind == PUNCT and ts[j].text == "("), None)
            if open_ is not None and open_ > start and ts[open_ - 1].kind == ID:
                spans.append((ts[open_ - 1].text, start, end))
    return spans


def _struct_names(ts: list[Token], items: list[tuple[str, int, int]]) -> set[str]:
    """The names of the structs the source defines (type names in casts)."""
    return {ts[k + 1].text for kind, start, end in items if kind == "struct" for k in range(start, end - 1)
            if ts[k].text == "struct" and ts[k + 1].kind == ID}


def _buffer_names(ts: list[Token], items: list[tuple[str, int, int]]) -> set[str]:
    """The names of every kernel's ``device``/``constant`` parameters (a top-level macro naming one is refused: its
    accesses could not be bounds-checked)."""
    names: set[str] = set()
    for kind, start, end in items:
        k = next((j for j in range(start, end) if ts[j].text == "("), None) if kind == "kernel" else None
        if k is None:
            continue
        for p in _split_params(ts, k + 1, group_end(ts, k)):
            cut = next((j for j in range(len(p) - 1) if p[j].text == "[" and p[j + 1].text == "["), len(p))
            ids = [t.text for t in p[:cut] if t.kind == ID]
            if ids and {"device", "constant"} & set(ids):
                names.add(ids[-1])
    return names


def _translate_function(ts: list[Token], start: int, end: int, ctx: Ctx) -> list[Token]:
    """A helper function: rewritten like code, with a Guard of its own. Each ``device``/``constant`` pointer
    parameter becomes a tracked pointer whose bounds come in three extra parameters after it, and the fault buffer
    comes after them (``guard.access.helper_bound_params``); calls pass them (``guard``). A helper that exchanges
    values between SIMD-group lanes takes the scratch last (``simd``)."""
    ctx.scope, ctx.depth = "function", 0
    open_ = next((j for j in range(start, end) if ts[j].kind == PUNCT and ts[j].text == "("), None)
    if open_ is None or open_ == start or ts[open_ - 1].kind != ID:
        return rewrite(ts, ctx, start, end)
    close = group_end(ts, open_)
    ctx.simd_scratch = ts[open_ - 1].text in ctx.simd_helpers
    scratch = [tok(f"{', ' if close > open_ + 1 else ''}__local uchar* {SIMD_PARAM}", RAW)] if ctx.simd_scratch else []
    name = ts[open_ - 1]  # kept as it is: the rule calling a helper with the scratch must not see a call here
    try:
        if not ctx.checks:
            return _head(ts, ctx, start, open_, close) + scratch + rewrite(ts, ctx, close, end)
        ctx.guard = Guard(fault=False)
        head = [t for t in ts[start:open_] if t.kind in (ID, PUNCT)]
        if any(t.text in ("device", "constant") for t in head) and any(t.text == "*" for t in head):
            refuse(ts[open_ - 1], f"{ts[open_ - 1].text}()", "a function returning a device or constant pointer: "
                   "the accesses made through it could not be bounds-checked")
        spans = argument_spans(ts, open_, close)
        extra = helper_bound_params(ts, spans, ctx)
        if not extra:
            return _head(ts, ctx, start, open_, close) + scratch + rewrite(ts, ctx, close, end)
        ctx.guard.fault = True
        out = _head(ts, ctx, start, open_, open_ + 1)
        for n, (a, b) in enumerate(spans):
            if n:
                out.append(ts[a - 1])  # the comma
            out += rewrite(ts, ctx, a, b)
            if n in extra:
                out.append(tok(extra[n], RAW))
        out.append(tok(f", __global uint* {FAULT_PARAM}", RAW))
        out += scratch
        out += rewrite(ts, ctx, close, end)
        ctx.helpers[name.text] = tuple(sorted(extra))  # calls after its definition pass the bounds
        return out
    finally:
        ctx.guard = None
        ctx.simd_scratch = False


def _head(ts: list[Token], ctx: Ctx, start: int, open_: int, end: int) -> list[Token]:
    """A function's tokens from ``start`` to ``end`` (past its ``(``), its name (before ``open_``) as it is."""
    name = ts[open_ - 1]
    return rewrite(ts, ctx, start, open_ - 1) + [tok(cl_name(name.text), ID, name.space)] + rewrite(ts, ctx, open_, end)


def _translate_struct(ts: list[Token], start: int, end: int, ctx: Ctx) -> list[Token]:
    """``struct S { ... };`` -> the same with its members rewritten, then ``typedef struct S S;`` (MSL, being
    C++, names a struct without ``struct``; C needs the typedef)."""
    ctx.scope, ctx.depth = "program", 0
    out = rewrite(ts, ctx, start, end)
    names = [ts[k + 1].text for k in range(start, end - 1) if ts[k].text == "struct" and ts[k + 1].kind == ID]
    if names and ts[start].text == "struct":
        out.append(tok(f"typedef struct {names[0]} {names[0]};", RAW, " "))
    return out


# --- kernels ---

@dataclass
class _Param:
    tokens: list[Token]
    name: Token
    attr: str | None
    attr_arg: str | None


def _kernel_attribute(ts: list[Token], start: int) -> tuple[int | None, int]:
    """A ``[[max_total_threads_per_threadgroup(n)]]`` before ``kernel``: (n, index past it); others refused."""
    if ts[start].text != "[":
        return None, start
    close = group_end(ts, start)
    inner = ts[start + 2:close - 1]
    if [t.text for t in inner[:2]] != ["max_total_threads_per_threadgroup", "("] or len(inner) != 4 \
            or inner[2].kind != NUM:
        refuse(ts[start], f"[[{render(inner).strip()}]]", "the only kernel attribute supported is "
               "[[max_total_threads_per_threadgroup(n)]]")
    return int(inner[2].text.rstrip("uU"), 0), close + 1


def _translate_kernel(ts: list[Token], start: int, end: int, ctx: Ctx) -> tuple[KernelInfo, list[Token]]:
    """One ``kernel void f(...) { ... }`` -> ``__kernel void f(<buffers and offsets>) { <prologue> ... }``."""
    max_threads, i = _kernel_attribute(ts, start)
    if [t.text for t in ts[i:i + 2]] != ["kernel", "void"] or ts[i + 2].kind != ID or at(ts, i + 3).text != "(":
        raise MslSyntaxError(f"MSL {ts[i].where()}: expected `kernel void name(...)`")
    name = ts[i + 2].text
    close = group_end(ts, i + 3)
    if at(ts, close + 1).text != "{":
        refuse(ts[close + 1], render(ts[close + 1:close + 2]).strip(), "expected the kernel's body after its "
               "parameters (attributes after the parameter list are not supported)")
    params = [_parse_param(p, name) for p in _split_params(ts, i + 4, close)]
    used = {t.text for t in ts if t.kind == ID}
    bindings: list[ParamBinding] = []
    cl_params: list[str] = []
    prologue: list[str] = []
    indices: dict[int, str] = {}
    ctx.guard = Guard() if ctx.checks else None
    for p in params:
        if p.attr in POSITIONS or p.attr in _LINEAR_POSITIONS:
            prologue.append(_position_local(p, ctx))
            continue
        binding, decl, lines = _buffer_param(p, len(bindings), used, ctx)
        if binding.arg.index in indices:
            raise KernelCompileError(f"MSL {p.name.where()}: kernel {name!r}: parameters {indices[binding.arg.index]!r}"
                                     f" and {p.name.text!r} both use buffer index {binding.arg.index}")
        indices[binding.arg.index] = p.name.text
        bindings.append(binding)
        cl_params += decl
        prologue += lines
    cl_params += [f"__global const ulong* {ARGS_PARAM}", f"__global uint* {FAULT_PARAM}"]
    simd = uses_scratch(ts, close + 2, end - 1, ctx.simd_helpers)
    if simd:  # the scratch SIMD-group lanes exchange values through, sized per run by the runner (simd)
        # declared as 32-byte words: NVIDIA's OpenCL places a __local argument at its pointee's alignment, so a
        # uchar* scratch may start at an odd address and its float and long4 slots fault (error -9999)
        cl_params.append(f"__local ulong4* {SIMD_PARAM}_words")
        prologue += [f"__local uchar* {SIMD_PARAM} = (__local uchar*){SIMD_PARAM}_words;", SIMD_BEGIN]
    ctx.scope, ctx.depth, ctx.uses_barrier, ctx.threadgroup_vars = "kernel", 1, simd, []
    ctx.simd_scratch = simd
    guard = ctx.guard
    if guard is not None:
        guard.first_array_code = len(bindings)
    try:
        body = rewrite(ts, ctx, close + 2, end - 1)
    finally:
        ctx.guard = None
        ctx.simd_scratch = False
    arrays: tuple[LocalArray, ...] = ()
    if guard is not None:
        arrays = tuple(LocalArray(n, "threadgroup" if sp == "local" else "thread",
                                  _value_size(t) if t in SCALARS or t in VECTORS else 0) for n, sp, t in guard.arrays)
        shared = sum(a.elem * guard.counts.get(a.name, 0) for a in arrays if a.memory == "threadgroup")
        if shared > MAX_THREADGROUP_MEMORY:
            raise KernelCompileError(f"MSL {ts[i + 2].where()}: kernel {name!r} declares {shared} bytes of threadgroup "
                                     f"memory, more than the {MAX_THREADGROUP_MEMORY} bytes Metal gives a threadgroup "
                                     "(maxThreadgroupMemoryLength): Metal refuses such a pipeline")
        if "local" in guard.scratch:  # where a skipped access to a threadgroup / thread array lands
            prologue.append("__local uchar __mtl_lscratch[256] __attribute__((aligned(16)));")
        if "private" in guard.scratch:
            prologue.append("uchar __mtl_pscratch[256] __attribute__((aligned(16)));")
    head = f"__kernel void {name}({', '.join(cl_params)}) {{"
    text = "".join(f"\n  {line}" for line in prologue)
    toks = [tok(head + text, RAW, ts[start].space), *body, ts[end - 1]]
    info = KernelInfo(name, tuple(bindings), ctx.uses_barrier, tuple(ctx.threadgroup_vars), max_threads, arrays,
                      simd)
    return info, toks


def _split_params(ts: list[Token], start: int, end: int) -> list[list[Token]]:
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


def _parse_param(p: list[Token], kernel: str) -> _Param:
    """Split one kernel parameter into its type tokens, name and ``[[attribute(arg)]]``."""
    attr = attr_arg = None
    if len(p) >= 2 and p[-1].text == "]" and p[-2].text == "]":
        opens = [j for j in range(len(p) - 1) if p[j].text == "[" and p[j + 1].text == "["]
        if not opens:
            raise MslSyntaxError(f"MSL {p[-1].where()}: kernel {kernel!r}: `]]` closes no `[[` attribute")
        k = opens[-1]
        inner = p[k + 2:-2]
        if not inner or inner[0].kind != ID:
            raise MslSyntaxError(f"MSL {p[k].where()}: kernel {kernel!r}: malformed attribute")
        attr = inner[0].text
        if len(inner) > 1:
            if inner[1].text != "(" or inner[-1].text != ")":
                refuse(p[k], f"[[{render(inner).strip()}]]", "one attribute per parameter is supported")
            attr_arg = render(inner[2:-1]).strip()
        p = p[:k]
    if not p or p[-1].kind != ID:
        where = p[-1].where() if p else "?"
        raise MslSyntaxError(f"MSL {where}: kernel {kernel!r}: a parameter has no name")
    return _Param(p[:-1], p[-1], attr, attr_arg)


def _position_local(p: _Param, ctx: Ctx) -> str:
    """The prologue line for a thread-position parameter: ``uint3 gid = (uint3)((uint)get_group_id(0), ...);``."""
    type_name = " ".join(t.text for t in p.tokens if t.text != "const")
    elem, n = VECTORS.get(type_name, (type_name, 1))
    attr = p.attr or ""
    if elem not in ("uint", "ushort") or (attr in _LINEAR_POSITIONS and n != 1):
        refuse(p.name, f"{type_name} [[{attr}]]", f"{attr} must be uint or ushort"
               f"{'' if attr in _LINEAR_POSITIONS else ' (or a 2- or 3-vector of them)'}")
    if attr in _LINEAR_POSITIONS:
        return f"{type_name} {cl_name(p.name.text)} = ({elem})({_LINEAR_POSITIONS[attr]});"
    parts = [f"({elem}){POSITIONS[attr].format(d=d)}" for d in range(n)]
    value = parts[0] if n == 1 else f"({type_name})({', '.join(parts)})"
    return f"{type_name} {cl_name(p.name.text)} = {value};"


def _unique(name: str, used: set[str]) -> str:
    while name in used:
        name += "_"
    used.add(name)
    return name


def _buffer_param(p: _Param, position: int, used: set[str], ctx: Ctx) -> tuple[ParamBinding, list[str], list[str]]:
    """A buffer or ``constant T&`` parameter: its binding, its OpenCL parameter and its prologue lines. Its offset
    and bounds come from slot ``position`` of the argument block. A pointer becomes a tracked pointer of the
    kernel's Guard; a struct read through ``constant S&`` (whose size the translator does not know) is a checked
    access (``guard``)."""
    words = [t.text for t in p.tokens]
    what = f"{render(p.tokens).strip()} {p.name.text}"
    if p.attr not in (None, "buffer"):
        why = ("threadgroup memory parameters need setThreadgroupMemoryLength:atIndex:, which the simulated "
               "device does not model" if p.attr == "threadgroup"
               else "not a kernel parameter attribute this translator knows")
        refuse(p.name, f"[[{p.attr}]]", why)
    index = position
    if p.attr == "buffer":
        try:
            index = int((p.attr_arg or "").rstrip("uU"), 0)
        except ValueError:
            raise KernelCompileError(f"MSL {p.name.where()}: [[buffer({p.attr_arg})]] needs an integer index") from None
    if not 0 <= index <= MAX_BUFFER_INDEX:
        raise KernelCompileError(f"MSL {p.name.where()}: buffer index {index} of {p.name.text!r} is outside "
                                 f"0..{MAX_BUFFER_INDEX}")
    spaces = [w for w in words if w in ("device", "constant", "threadgroup", "thread")]
    types = [t for t in p.tokens if t.kind == ID and t.text not in _PARAM_QUALIFIERS]
    if len(spaces) != 1 or len(types) != 1 or words.count("*") + words.count("&") != 1:
        refuse(p.name, what, "a kernel parameter must be `device T*`, `constant T*`, `constant T&` or a thread "
               "position with its attribute (pointers to pointers and by-value parameters are not supported)")
    space, elem = spaces[0], types[0].text
    pointer = "*" in words
    if space == "threadgroup":
        refuse(p.name, what, "threadgroup memory parameters need setThreadgroupMemoryLength:atIndex:, which the "
               "simulated device does not model")
    if space not in ("device", "constant") or (space == "device" and not pointer):
        refuse(p.name, what, f"`{space}` {'pointer' if pointer else 'reference'} parameters are not supported")
    cl_elem = storage_type(elem)  # half, bfloat: their 16 bits (softfloat)
    if cl_elem in VECTORS:
        cl_elem = ctx.prelude.need_unaligned(cl_elem)
    writable = space == "device" and pointer and "const" not in words
    const = "" if writable else "const "
    name = cl_name(p.name.text)
    base = _unique(f"{name}_base", used)
    off, before, length = (f"{ARGS_PARAM}[{3 * position + k}]" for k in range(3))
    ptr = f"__global {const}{cl_elem}*"
    known = elem in SCALARS or elem in VECTORS
    bound = Bound(f"__mtl_s_{name}", f"__mtl_n_{name}", str(position))
    lines: list[str] = []
    if (pointer or not known) and ctx.guard is not None:
        lines.append(f"const ulong {bound.start} = (ulong){base} - {before}, {bound.length} = {length};")
    if pointer:
        lines.append(f"{ptr} {name} = ({ptr})({base} + {off});")
        if ctx.guard is not None:
            ctx.guard.ptrs[p.name.text] = bound
    elif not known and ctx.guard is not None:
        read = render(guarded_access([tok(f"({ptr})({base} + {off})", RAW)], bound, False, ctx)).strip()
        lines.append(f"const {SCALARS.get(elem, elem)} {name} = {read};")
    elif is_soft(elem):  # a constant half/bfloat: its 16 bits, widened to the float standing for it (softfloat)
        widen = "__mtl_h2f" if VECTORS.get(elem, (elem,))[0] == "half" else "__mtl_b2f"
        n = VECTORS[elem][1] if elem in VECTORS else 1
        lines.append(f"const float{n if n > 1 else ''} {name} = {widen}(*(({ptr})({base} + {off})));")
    else:
        lines.append(f"const {SCALARS.get(elem, elem)} {name} = *(({ptr})({base} + {off}));")
    arg = KernelArg(p.name.text, "buffer" if pointer else "constant", index, dtype_name(elem))
    nbytes = 0 if pointer or not known else _value_size(elem)
    size = _value_size(elem) if known and elem != "void" else 0
    return (ParamBinding(arg, base, off, writable, scalar_size(elem), nbytes, size, position),
            [f"__global {const}uchar* {base}"], lines)


def _value_size(msl_type: str) -> int:
    """Bytes of one value of a scalar or vector type (a 3-vector takes 4 elements' room)."""
    elem, n = VECTORS.get(msl_type, (msl_type, 1))
    return scalar_size(elem) * (4 if n == 3 else n)

