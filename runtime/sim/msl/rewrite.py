"""The token rewrite rules of the MSL -> OpenCL C translator, and the small engine that runs them.

A ``TokenRule`` looks at the token list at one position and either declines (``None``) or returns a ``TokenMatch``:
how many tokens it consumed and the OpenCL C tokens standing for them. The engine looks rules up in the table the
``Ctx`` carries (``Ctx.rules``: ``token_rules.TOKEN_RULES`` for the translator) by the text of the token at the
position (then by its kind), so the cost of a token does not grow with the table; the first rule that matches wins;
the tokens a rule produced are not rewritten again (a rule that needs its operands rewritten calls ``rewrite`` on
them itself). The engine keeps the brace depth, which some rules check (``threadgroup`` variables must be at kernel
function scope).

    >>> from mtlir.runtime.sim.msl.lex import tokenize, render
    >>> from mtlir.runtime.sim.msl.token_rules import TOKEN_RULES
    >>> render(rewrite(tokenize("threadgroup_barrier(mem_flags::mem_threadgroup);"), Ctx(Prelude(), TOKEN_RULES)))
    'barrier(CLK_LOCAL_MEM_FENCE);'
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from mtlir.errors import UnsupportedKernelError
from mtlir.runtime.sim.msl.lex import EOF, ID, NUM, PP, PUNCT, MslSyntaxError, Token, render, tokenize
from mtlir.runtime.sim.msl.names import (HELPER_BUILTINS, KEYWORDS, RENAMED_BUILTINS, SAME_BUILTINS, SCALARS,
                                          VECTORS, cl_name, is_soft)
from mtlir.runtime.sim.msl.prelude import Prelude

if TYPE_CHECKING:
    from mtlir.runtime.sim.msl.guard.bound import Guard

__all__ = ["Ctx", "TokenMatch", "TokenRule", "rewrite", "refuse", "group_end", "argument_spans", "type_end",
           "soft_float_left", "QUALIFIERS"]

TokenMatch = tuple[int, list[Token]]


@dataclass
class Ctx:
    """State shared by the rules of one translation: the ``prelude`` they add to, the table of ``rules`` (token
    text or ``"<kind>"`` -> the rules tried there, in order), the names of the functions and function-like macros
    the source defines (``callables``), where the tokens being rewritten are (``scope``: ``program``, ``function``
    or ``kernel``; ``depth``: braces open inside the function body, 1 at its outermost block) and what the current
    kernel uses (barriers, threadgroup variables).

    Bounds checks (``guard``, when ``checks``): ``guard`` holds the buffer pointers and arrays of the function
    being translated (None outside functions), ``name_rule`` is the rule ``rewrite`` tries first on every
    identifier while a guard is active, ``helpers`` maps each helper function taking buffer pointers to the
    positions of those parameters, ``type_names`` are the struct names (for telling casts from parenthesised
    expressions) and ``buffer_names`` the buffer parameter names of every kernel (a top-level macro naming one is
    refused). SIMD groups (``simd``): ``simd_helpers`` are the helper functions that take the scratch their
    lanes exchange values through, ``simd_scratch`` whether the function being rewritten has it."""

    prelude: Prelude
    rules: Mapping[str, tuple[TokenRule, ...]]
    callables: set[str] = field(default_factory=set)
    scope: str = "function"
    depth: int = 0
    uses_barrier: bool = False
    threadgroup_vars: list[str] = field(default_factory=list)
    checks: bool = True
    guard: Guard | None = None
    name_rule: TokenRule | None = None
    helpers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    type_names: set[str] = field(default_factory=set)
    buffer_names: set[str] = field(default_factory=set)
    simd_helpers: set[str] = field(default_factory=set)
    simd_scratch: bool = False


TokenRule = Callable[[list[Token], int, Ctx], "TokenMatch | None"]
QUALIFIERS = frozenset({"const", "volatile", "restrict", "unsigned", "signed", "struct", "device", "constant",
                        "threadgroup", "thread"})
_OPEN_CLOSE = {"(": ")", "[": "]", "{": "}"}


def refuse(tok: Token, construct: str, why: str) -> NoReturn:
    """Raise ``UnsupportedKernelError`` for ``construct`` at ``tok``'s place in the MSL."""
    raise UnsupportedKernelError(f"MSL {tok.where()}: cannot translate `{construct}` to OpenCL C: {why}", construct)


def at(ts: list[Token], i: int) -> Token:
    """The token at ``i``, or the final ``eof`` token past the end."""
    return ts[i] if i < len(ts) else ts[-1] if ts and ts[-1].kind == EOF else Token(EOF, "", 0, 0, "")


def group_end(ts: list[Token], i: int) -> int:
    """Index of the bracket closing the ``(``, ``[`` or ``{`` at ``i``; ``MslSyntaxError`` if it is not closed."""
    stack = [i]
    for j in range(i + 1, len(ts)):
        text = ts[j].text if ts[j].kind == PUNCT else ""
        if text in _OPEN_CLOSE:
            stack.append(j)
        elif text in (")", "]", "}"):
            opened = ts[stack.pop()]
            if text != _OPEN_CLOSE[opened.text]:
                raise MslSyntaxError(f"MSL {ts[j].where()}: `{text}` does not close the `{opened.text}` of "
                                     f"{opened.where()}")
            if not stack:
                return j
    raise MslSyntaxError(f"MSL {ts[i].where()}: `{ts[i].text}` is never closed")


def argument_spans(ts: list[Token], open_: int, close: int) -> list[tuple[int, int]]:
    """The ``(start, end)`` token spans of the comma-separated items (a call's arguments, a function's parameters)
    between the brackets at ``open_`` and ``close``; commas inside nested brackets do not count. None for ``()``."""
    spans: list[tuple[int, int]] = []
    j = a = open_ + 1
    while j < close:
        if ts[j].kind == PUNCT and ts[j].text in _OPEN_CLOSE:
            j = group_end(ts, j) + 1
            continue
        if ts[j].kind == PUNCT and ts[j].text == ",":
            spans.append((a, j))
            a = j + 1
        j += 1
    if close > open_ + 1:
        spans.append((a, close))
    return spans


def type_end(ts: list[Token], i: int) -> int:
    """Index just past the type that starts at ``i`` (qualifiers, address spaces, ``__attribute__((...))``, one
    type name, trailing qualifiers): the caller then looks for ``*`` (pointer), ``&`` (reference) or a name."""
    seen_name = False
    while True:
        t = at(ts, i)
        if t.kind == ID and t.text == "__attribute__" and at(ts, i + 1).text == "(":
            i = group_end(ts, i + 1) + 1
        elif t.kind == ID and t.text in QUALIFIERS:
            i += 1
        elif t.kind == ID and not seen_name:
            seen_name, i = True, i + 1
        else:
            return i


def arg_count(ts: list[Token], i: int) -> int:
    """Number of comma-separated arguments in the parenthesised group at ``i`` (0 for ``()``)."""
    end = group_end(ts, i)
    if end == i + 1:
        return 0
    count, j = 1, i + 1
    while j < end:
        if ts[j].text in _OPEN_CLOSE and ts[j].kind == PUNCT:
            j = group_end(ts, j)
        elif ts[j].text == "," and ts[j].kind == PUNCT:
            count += 1
        j += 1
    return count


def tok(text: str, kind: str = PUNCT, space: str = "") -> Token:
    """A token made by a rule (line 0: it has no place in the MSL)."""
    return Token(kind, text, 0, 0, space)


def rewrite(ts: list[Token], ctx: Ctx, start: int = 0, end: int | None = None) -> list[Token]:
    """Rewrite ``ts[start:end]`` with the rules of ``ctx.rules``: the OpenCL C tokens, whitespace and comments
    kept. A rule's first output token takes the whitespace before the first token it consumed; a rule that outputs
    nothing passes that whitespace on to the next token. Raises ``UnsupportedKernelError`` or ``MslSyntaxError``."""
    end = len(ts) if end is None else end
    out: list[Token] = []
    pending, i = "", start
    rules = ctx.rules
    while i < end:
        t = ts[i]
        if t.kind == PUNCT and t.text in ("{", "}"):
            ctx.depth += 1 if t.text == "{" else -1
        if t.kind == ID and ctx.guard is not None and ctx.name_rule is not None:
            m = ctx.name_rule(ts, i, ctx)
            if m is not None:
                n, repl = m
                out.append(repl[0].with_space(pending + t.space))
                out.extend(repl[1:])
                pending, i = "", i + n
                continue
        for rule in rules.get(t.text if t.kind != PP else "", ()) + rules.get("<" + t.kind + ">", ()):
            m = rule(ts, i, ctx)
            if m is not None:
                n, repl = m
                if repl:
                    out.append(repl[0].with_space(pending + t.space))
                    out.extend(repl[1:])
                    pending = ""
                else:
                    pending += t.space
                i += n
                break
        else:
            out.append(t.with_space(pending + t.space) if pending else t)
            pending, i = "", i + 1
    if pending:
        out.append(tok("", EOF, pending))
    return out


def soft_float_left(t: Token) -> NoReturn:
    """A ``half``/``bfloat`` type or ``h`` literal that reached the token rules: ``softfloat`` rewrites every one it
    can type before the rules run, so this one is a use it does not handle (a macro body, a template argument)."""
    refuse(t, t.text, "half and bfloat are computed in software on the simulated device, and this use of them "
                      "(in a macro, a template argument, ...) is not one the rewrite handles")


# --- namespaces: `metal::exp2`, `precise::sqrt`, `fast::exp` -> the OpenCL builtin (default precision) ---
def drop_namespace(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``metal::``, ``precise::``, ``fast::`` before a name -> nothing (OpenCL's default precision is at least
    Metal's precise one, ``fast::`` asks for less)."""
    return (2, []) if at(ts, i + 1).text == "::" else None


def scope_operator(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """Any other ``X::`` is C++ scoping (numeric_limits<T>::max(), a namespace of the user's): refused."""
    refuse(ts[i], "::", "C++ scope resolution (only metal::, precise::, fast:: and mem_flags:: are known)")


# --- barriers: threadgroup_barrier(mem_flags::X) -> barrier(CLK_*_MEM_FENCE) (OpenCL C §6.12.8) ---
_FENCES = {"mem_threadgroup": "CLK_LOCAL_MEM_FENCE", "mem_device": "CLK_GLOBAL_MEM_FENCE",
           "mem_none": "CLK_LOCAL_MEM_FENCE"}  # OpenCL has no fence-less barrier: the local fence is the weakest


def threadgroup_barrier(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``threadgroup_barrier(`` -> ``barrier(``; the flags are rewritten by ``mem_flags``. ``simdgroup_barrier(``
    too: every thread of the threadgroup meets at it, which includes the SIMD group's (``simd``)."""
    if at(ts, i + 1).text != "(":
        return None
    ctx.uses_barrier = True
    return 1, [tok("barrier", ID)]


def mem_flags(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``mem_flags::mem_threadgroup`` -> ``CLK_LOCAL_MEM_FENCE``, ``mem_device`` -> ``CLK_GLOBAL_MEM_FENCE``;
    ``mem_texture`` and the rest are refused."""
    if at(ts, i + 1).text != "::":
        return None
    name = at(ts, i + 2)
    if name.text not in _FENCES:
        refuse(name, f"mem_flags::{name.text}", "only mem_none, mem_device and mem_threadgroup fences are known")
    return 3, [tok(_FENCES[name.text], ID)]


# --- address spaces: device -> __global, threadgroup -> __local, thread -> __private, constant -> see below ---
def _pointee_follows(ts: list[Token], i: int) -> str:
    """What follows the type after the address space at ``i``: ``*``, ``&`` or ``name`` (an object)."""
    nxt = at(ts, type_end(ts, i + 1)).text
    return nxt if nxt in ("*", "&") else "name"


def device_space(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``device`` -> ``__global`` (a ``device T&`` reference has no C form: refused)."""
    if _pointee_follows(ts, i) == "&":
        refuse(ts[i], "device T&", "references to device memory are not supported (use a pointer)")
    return 1, [tok("__global", ID)]


def constant_space(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``constant``: a pointer into a constant buffer -> ``__global const`` (the runner binds every buffer in
    the global space: no size or count limits); a program-scope variable -> ``__constant``."""
    if _pointee_follows(ts, i) == "*" and ctx.scope != "program":
        return 1, [tok("__global", ID), tok("const", ID, " ")]
    if _pointee_follows(ts, i) == "&":
        refuse(ts[i], "constant T&", "constant references are only supported as kernel parameters")
    return 1, [tok("__constant", ID)]


def threadgroup_space(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``threadgroup`` -> ``__local``. A threadgroup variable must be declared at kernel function scope (OpenCL
    C §6.5.2): elsewhere it is refused."""
    kind = _pointee_follows(ts, i)
    if kind == "&":
        refuse(ts[i], "threadgroup T&", "references to threadgroup memory are not supported (use a pointer)")
    if kind == "name":
        name = at(ts, type_end(ts, i + 1))
        if ctx.scope != "kernel" or ctx.depth != 1:
            where = "a helper function" if ctx.scope != "kernel" else "a nested block"
            refuse(ts[i], "threadgroup variable",
                   f"`{name.text}` is declared in {where}; OpenCL C needs __local variables at kernel function "
                   "scope: declare it in the kernel's outermost block")
        ctx.threadgroup_vars.append(name.text)
    return 1, [tok("__local", ID)]


def thread_space(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``thread`` -> ``__private`` (``thread T&`` references are refused)."""
    if _pointee_follows(ts, i) == "&":
        refuse(ts[i], "thread T&", "C++ references are not supported (use a pointer)")
    return 1, [tok("__private", ID)]


# --- types: vectors, scalars, constructors, casts ---
def vector_type(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """A vector type name: ``float4(a, b, c, d)`` -> ``(float4)(a, b, c, d)``; ``float4(x)`` ->
    ``__mtl_make_float4(x)`` (broadcast or conversion, by x's type); ``float4()`` -> ``((float4)(0))``;
    ``float4*`` -> ``__mtl_float4_u*`` (the element-aligned alias: vector loads and stores at any offset)."""
    t = ts[i]
    if t.text not in VECTORS:
        return None
    if is_soft(t.text):
        soft_float_left(t)
    j = i + 1
    while at(ts, j).text in ("const", "volatile"):
        j += 1
    if at(ts, j).text == "*":
        return 1, [tok(ctx.prelude.need_unaligned(t.text), ID)]
    if at(ts, i + 1).text != "(":
        return None
    n = arg_count(ts, i + 1)
    if n == 0:
        return 3, [tok("("), tok("("), tok(t.text, ID), tok(")"), tok("("), tok("0", NUM), tok(")"), tok(")")]
    if n == 1:
        return 1, [tok(ctx.prelude.need_maker(t.text), ID)]
    return 1, [tok("("), tok(t.text, ID), tok(")")]


def scalar_type(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """A scalar type name: fixed-width names -> OpenCL's (``uint8_t`` -> ``uchar``); a function-style cast
    ``float(x)`` -> ``((float)(x))``; a reference ``T& r`` is refused (``half``/``bfloat`` never get here:
    ``softfloat``)."""
    t = ts[i]
    if t.text not in SCALARS:
        return None
    if is_soft(t.text):
        soft_float_left(t)
    name = tok(SCALARS[t.text], ID)
    nxt = at(ts, i + 1).text
    if nxt == "&":
        refuse(ts[i + 1], f"{t.text}&", "C++ references are not supported (use a pointer)")
    if nxt == "(" and t.text != "void":
        end = group_end(ts, i + 1)
        inner = rewrite(ts, ctx, i + 2, end)
        return end + 1 - i, [tok("("), tok("("), name, tok(")"), tok("("), *inner, tok(")"), tok(")")]
    return 1, [name]


def _template_type(ts: list[Token], i: int, what: str) -> tuple[str, int]:
    """The type name in ``what<T>`` at ``i`` (``as_type``, ``static_cast``) and the index past ``>``."""
    if at(ts, i + 1).text != "<" or at(ts, i + 2).kind != ID or at(ts, i + 3).text != ">":
        refuse(ts[i], what, f"expected {what}<T>(x) with T a scalar or vector type name")
    name = ts[i + 2].text
    if name not in SCALARS and name not in VECTORS:
        refuse(ts[i + 2], f"{what}<{name}>", "T must be a scalar or vector type")
    return name, i + 4


def as_type(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``as_type<T>(x)`` -> ``as_T(x)``: reinterpret the bits (OpenCL C §6.2.4.2; same size required by both)."""
    name, j = _template_type(ts, i, "as_type")
    if is_soft(name):
        soft_float_left(ts[i + 2])
    return j - i, [tok(f"as_{SCALARS.get(name, name)}", ID)]


def static_cast(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``static_cast<T>(x)`` -> ``((T)(x))`` for a scalar T, ``__mtl_make_T(x)`` (a conversion) for a vector."""
    name, j = _template_type(ts, i, "static_cast")
    if at(ts, j).text != "(":
        refuse(ts[i], "static_cast", "expected static_cast<T>(x)")
    if is_soft(name):
        soft_float_left(ts[i + 2])
    if name in VECTORS:
        return j - i, [tok(ctx.prelude.need_maker(name), ID)]
    end = group_end(ts, j)
    inner = rewrite(ts, ctx, j + 1, end)
    return end + 1 - i, [tok("("), tok("("), tok(SCALARS[name], ID), tok(")"), tok("("), *inner, tok(")"), tok(")")]


def constexpr(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``constexpr`` -> ``const`` in a function, ``__constant`` at program scope (where OpenCL needs it)."""
    if ctx.scope == "program":
        return (1, []) if at(ts, i + 1).text == "constant" else (1, [tok("__constant", ID)])
    return 1, [tok("const", ID)]


def using_namespace(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``using namespace metal;`` -> nothing; any other ``using`` is refused."""
    if [at(ts, i + k).text for k in (1, 2, 3)] == ["namespace", "metal", ";"]:
        return 4, []
    refuse(ts[i], "using", "only `using namespace metal;` is supported")


def attribute_brackets(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``[[attribute]]`` outside a kernel's parameter list: refused, naming the attribute."""
    if at(ts, i + 1).text != "[":
        return None
    refuse(ts[i], f"[[{at(ts, i + 2).text}]]", "attributes are only supported on kernel parameters "
           "(buffer, thread positions) and kernels (max_total_threads_per_threadgroup)")


def gnu_attribute(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``__attribute__((aligned(16)))`` and other GNU attributes pass through as they are (OpenCL C §6.11)."""
    if at(ts, i + 1).text != "(":
        return None
    end = group_end(ts, i + 1)
    return end + 1 - i, ts[i:end + 1]


def metal_func(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``METAL_FUNC`` (metal_stdlib's ``inline __attribute__((always_inline))``) -> ``inline``."""
    return 1, [tok("inline", ID)]


# --- calls: builtins that differ are renamed or get a prelude helper; unknown functions are refused ---
def call(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``name(``: a builtin with the same meaning in OpenCL stays; ``mulhi`` -> ``mul_hi``; ``abs``, ``fract``,
    ``saturate`` -> ``__mtl_*`` helpers; a function or macro the source defines stays; anything else is refused
    (an MSL builtin this translator does not know must not reach OpenCL under a namesake that means something
    else)."""
    t = ts[i]
    if at(ts, i + 1).text != "(":
        return None
    name = t.text
    if name in SAME_BUILTINS or name in ctx.callables or name in KEYWORDS or name.startswith("__mtl_"):
        return None
    if name in RENAMED_BUILTINS:
        return 1, [tok(RENAMED_BUILTINS[name], ID)]
    if name in HELPER_BUILTINS:
        return 1, [tok(ctx.prelude.need_helper(name), ID)]
    refuse(t, name, "not an MSL builtin this translator knows, nor a function defined in the source")


def opencl_keyword(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """An MSL name that is an OpenCL C keyword (``local``, ``global``, ``private``, ...) -> ``__mtl_local``."""
    return 1, [tok(cl_name(ts[i].text), ID)]


def half_literal(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """A ``half`` literal (``1.0h``) left by ``softfloat`` (in a macro body) is refused."""
    if ts[i].text[-1:] in ("h", "H") and not ts[i].text.lower().startswith("0x"):
        soft_float_left(ts[i])
    return None


def directive(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """Preprocessor lines: ``#include <metal_*>`` -> nothing (other includes refused); ``#define`` bodies are
    rewritten like code; conditionals, ``#undef`` and ``#pragma`` pass through."""
    text = ts[i].text
    word = (text[1:].split() or [""])[0]
    if word == "include":
        if not text.replace(" ", "").startswith("#include<metal_"):
            refuse(ts[i], text.strip(), "only Metal's own headers (<metal_stdlib>, <metal_math>, ...) can be included")
        return 1, []
    if word == "define":
        body = tokenize(text[1:])
        named = sorted({t.text for t in body[2:] if t.kind == ID} & ctx.buffer_names) if ctx.guard is None else []
        if named:
            refuse(ts[i], f"#define {at(body, 1).text}", f"the macro names the buffer parameter `{named[0]}` "
                   "outside the kernel: the simulated device bounds-checks buffer accesses where the kernel makes "
                   "them and cannot follow them through a macro defined outside it")
        head = 2
        ctx.callables.add(at(body, 1).text)  # a macro may stand for a function: `#define F sqrt` ... F(x)
        if at(body, 2).text == "(" and at(body, 2).space == "":
            head = group_end(body, 2) + 1
        new = body[:head] + rewrite(body, ctx, head)
        return 1, [tok("#" + render(new).rstrip(), PP)]
    if word in ("if", "ifdef", "ifndef", "elif", "else", "endif", "undef", "pragma", "error", "warning", "line"):
        return None
    refuse(ts[i], text.strip(), "unknown preprocessor directive")

