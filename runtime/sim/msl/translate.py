"""Metal Shading Language -> OpenCL C: how the simulated Metal device runs real kernels (METAL.md §4).

``translate(msl)`` tokenizes the MSL (``lex``), refuses what it cannot translate (``UnsupportedKernelError``
naming the construct: atomics, textures, C++ features, ...), rewrites half and bfloat into software arithmetic on
floats (``softfloat``), splits the source into top-level items (``items``) and rewrites each with the token rules of
``token_rules``: helper functions and structs here, kernels in ``kernel``, whose signatures are rebuilt because
Metal binds arguments differently from OpenCL:

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
from mtlir.runtime.sim.msl.aliases import resolve_vector_aliases
from mtlir.runtime.sim.msl.compile_errors import check_metal_types
from mtlir.runtime.sim.msl.guard.access import guard_name, helper_bound_params
from mtlir.runtime.sim.msl.guard.bound import FAULT_PARAM, Guard
from mtlir.runtime.sim.msl.items import (buffer_names, defined_functions, function_spans, struct_names,
                                          top_level_items)
from mtlir.runtime.sim.msl.kernel import KernelInfo, translate_kernel
from mtlir.runtime.sim.msl.lex import ID, PUNCT, RAW, Token, render, tokenize
from mtlir.runtime.sim.msl.names import (MATRIX_TYPES, TEMPLATES, VECTORS, canonical_type_spellings, cl_name,
                                         refused_construct)
from mtlir.runtime.sim.msl.prelude import Prelude
from mtlir.runtime.sim.msl.rewrite import Ctx, argument_spans, at, group_end, refuse, rewrite, tok
from mtlir.runtime.sim.msl.simd import SIMD_PARAM, SUPPORTED, simd_helpers
from mtlir.runtime.sim.msl.softfloat.lowering import lower_soft_floats, uses_soft_floats
from mtlir.runtime.sim.msl.softfloat.rounding import SOFTFLOAT_PRELUDE
from mtlir.runtime.sim.msl.token_rules import TOKEN_RULES
from mtlir.runtime.sim.msl.uniform import check_simd_control_flow

__all__ = ["Translation", "translate", "kernel_functions"]


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
    checks (their vector accesses still ``vloadN``/``vstoreN``: ``guard.vector``), for reading a translation, the
    Oclgrind check and the fuzzing's reference. Raises ``UnsupportedKernelError`` (``.construct`` names the first
    construct it cannot translate, with its line and column in the message; also a buffer pointer the checks
    cannot follow), ``MslSyntaxError`` (a ``KernelCompileError``) for source that is not MSL at the token level, and
    ``KernelCompileError`` for a kernel signature Metal would reject (duplicate or out-of-range buffer index),
    more than 32 KiB of threadgroup arrays, or ``double`` anywhere as a type (Metal has none, MSL spec §2.1:
    ``compile_errors``; checked first, with the line quoted and a caret, as Metal's compiler reports it)."""
    ts = resolve_vector_aliases(canonical_type_spellings(tokenize(msl)))
    check_metal_types(ts, msl)
    _refuse_unsupported(ts)
    prelude = Prelude()
    if uses_soft_floats(ts):
        ts = lower_soft_floats(ts, top_level_items(ts), struct_names(ts, top_level_items(ts)))
        prelude.need_library("softfloat", SOFTFLOAT_PRELUDE)
    items = top_level_items(ts)
    ctx = Ctx(prelude, TOKEN_RULES, callables=defined_functions(ts), name_rule=guard_name, checks=bounds_checks,
              type_names=struct_names(ts, items) | set(MATRIX_TYPES),
              buffer_names=buffer_names(ts, items) if bounds_checks else set(),
              simd_helpers=simd_helpers(ts, function_spans(ts, items)))
    check_simd_control_flow(ts, items, ctx.simd_helpers, struct_names(ts, items))
    out: list[Token] = []
    kernels: dict[str, KernelInfo] = {}
    for kind, start, end in items:
        if kind == "kernel":
            info, toks = translate_kernel(ts, start, end, ctx)
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
    for kind, start, end in top_level_items(ts):
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
        ctx.guard = Guard(fault=False, checked=ctx.checks)  # without checks: only the vector accesses' typing
        head = [t for t in ts[start:open_] if t.kind in (ID, PUNCT)]
        if any(t.text in VECTORS for t in head) and any(t.text == "*" for t in head):
            refuse(ts[open_ - 1], f"{ts[open_ - 1].text}()", "a function returning a pointer to vectors: the "
                   "translator could not type the accesses made through it as vector loads and stores (it would "
                   "dereference the vector pointer, which faults on NVIDIA's OpenCL at an element offset)")
        if ctx.checks and any(t.text in ("device", "constant") for t in head) and any(t.text == "*" for t in head):
            refuse(ts[open_ - 1], f"{ts[open_ - 1].text}()", "a function returning a device or constant pointer: "
                   "the accesses made through it could not be bounds-checked")
        spans = argument_spans(ts, open_, close)
        extra = helper_bound_params(ts, spans, ctx)
        if not extra or not ctx.checks:
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
