"""One MSL kernel function -> an OpenCL ``__kernel``: its signature rebuilt, because Metal binds arguments
differently from OpenCL (``translate`` says how: buffer parameters with their byte offsets and bounds in the argument
block, ``constant T&`` variables read once in the prologue, thread positions from OpenCL's work-item functions), its
body rewritten with the token rules, and what the kernel runner needs to know of it (``KernelInfo``: bindings,
barriers, threadgroup arrays, ``[[max_total_threads_per_threadgroup(n)]]``, SIMD-group scratch)."""
from __future__ import annotations

from dataclasses import dataclass

from mtlir.errors import KernelCompileError
from mtlir.runtime.sim.msl.guard.access import guarded_access
from mtlir.runtime.sim.msl.guard.bound import ARGS_PARAM, FAULT_PARAM, Bound, Guard
from mtlir.runtime.sim.msl.items import split_params
from mtlir.runtime.sim.msl.lex import ID, NUM, RAW, MslSyntaxError, Token, render
from mtlir.runtime.sim.msl.names import (POSITIONS, POSITIONS_LINEAR, SCALARS, VECTORS, cl_name, dtype_name, is_soft,
                                          opencl_kernel_name, scalar_size, storage_type)
from mtlir.runtime.sim.msl.rewrite import Ctx, at, group_end, refuse, rewrite, tok
from mtlir.runtime.sim.msl.simd import SIMD_BEGIN, SIMD_PARAM, SIMD_POSITIONS, uses_scratch

__all__ = ["KernelArg", "ParamBinding", "KernelInfo", "LocalArray", "translate_kernel", "MAX_BUFFER_INDEX",
           "MAX_THREADGROUP_MEMORY"]

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
    buffer, the threadgroup scratch ``__local uchar* __mtl_simd`` of ``simd.scratch_bytes(threads)`` bytes.
    ``opencl_function``: the kernel's name in the OpenCL C source, what ``clCreateKernel`` takes: ``function``
    itself, or ``__mtl_kernel_<function>`` for a name OpenCL has a built-in of (``names.opencl_kernel_name``)."""

    function: str
    bindings: tuple[ParamBinding, ...]
    uses_barrier: bool
    threadgroup_vars: tuple[str, ...]
    max_total_threads_per_threadgroup: int | None = None
    arrays: tuple[LocalArray, ...] = ()
    simd: bool = False
    opencl_function: str = ""

    def __post_init__(self) -> None:
        if not self.opencl_function:
            object.__setattr__(self, "opencl_function", self.function)

    @property
    def args(self) -> tuple[KernelArg, ...]:
        """The Metal-bound parameters in MSL order."""
        return tuple(b.arg for b in self.bindings)


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


def translate_kernel(ts: list[Token], start: int, end: int, ctx: Ctx) -> tuple[KernelInfo, list[Token]]:
    """One ``kernel void f(...) { ... }`` -> ``__kernel void f(<buffers and offsets>) { <prologue> ... }``."""
    max_threads, i = _kernel_attribute(ts, start)
    if [t.text for t in ts[i:i + 2]] != ["kernel", "void"] or ts[i + 2].kind != ID or at(ts, i + 3).text != "(":
        raise MslSyntaxError(f"MSL {ts[i].where()}: expected `kernel void name(...)`")
    name = ts[i + 2].text
    close = group_end(ts, i + 3)
    if at(ts, close + 1).text != "{":
        refuse(ts[close + 1], render(ts[close + 1:close + 2]).strip(), "expected the kernel's body after its "
               "parameters (attributes after the parameter list are not supported)")
    params = [_parse_param(p, name) for p in split_params(ts, i + 4, close)]
    used = {t.text for t in ts if t.kind == ID}
    bindings: list[ParamBinding] = []
    cl_params: list[str] = []
    prologue: list[str] = []
    indices: dict[int, str] = {}
    ctx.guard = Guard(fault=ctx.checks, checked=ctx.checks)  # without checks: only the vector accesses' typing
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
    guard = ctx.guard if ctx.checks else None
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
    head = f"__kernel void {opencl_kernel_name(name)}({', '.join(cl_params)}) {{"
    text = "".join(f"\n  {line}" for line in prologue)
    toks = [tok(head + text, RAW, ts[start].space), *body, ts[end - 1]]
    info = KernelInfo(name, tuple(bindings), ctx.uses_barrier, tuple(ctx.threadgroup_vars), max_threads, arrays,
                      simd, opencl_kernel_name(name))
    return info, toks

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
    # `const` before the `*` qualifies the pointee (read-only data); after it, the pointer itself
    # (`device float* const p`: a fixed pointer to writable data, still stored through)
    star = words.index("*") if pointer else len(words)
    writable = space == "device" and pointer and "const" not in words[:star]
    const = "" if writable else "const "
    fixed = " const" if "const" in words[star:] else ""
    name = cl_name(p.name.text)
    base = _unique(f"{name}_base", used)
    off, before, length = (f"{ARGS_PARAM}[{3 * position + k}]" for k in range(3))
    ptr = f"__global {const}{cl_elem}*"
    known = elem in SCALARS or elem in VECTORS
    bound = Bound(f"__mtl_s_{name}", f"__mtl_n_{name}", str(position))
    lines: list[str] = []
    if (pointer or not known) and ctx.checks:
        lines.append(f"const ulong {bound.start} = (ulong){base} - {before}, {bound.length} = {length};")
    if pointer:
        lines.append(f"{ptr}{fixed} {name} = ({ptr})({base} + {off});")
        if ctx.guard is not None:
            ctx.guard.ptrs[p.name.text] = bound
            if storage_type(elem) in VECTORS:
                ctx.guard.vectors[p.name.text] = storage_type(elem)
    elif not known and ctx.checks:
        read = render(guarded_access([tok(f"({ptr})({base} + {off})", RAW)], bound, False, ctx)).strip()
        lines.append(f"const {SCALARS.get(elem, elem)} {name} = {read};")
    elif is_soft(elem):  # a constant half/bfloat: its 16 bits, widened to the float standing for it (softfloat)
        widen = "__mtl_h2f" if VECTORS.get(elem, (elem,))[0] == "half" else "__mtl_b2f"
        n = VECTORS[elem][1] if elem in VECTORS else 1
        lines.append(f"const float{n if n > 1 else ''} {name} = {widen}({_load(cl_elem, ptr, base, off)});")
    else:
        lines.append(f"const {SCALARS.get(elem, elem)} {name} = {_load(cl_elem, ptr, base, off)};")
    arg = KernelArg(p.name.text, "buffer" if pointer else "constant", index, dtype_name(elem))
    nbytes = 0 if pointer or not known else _value_size(elem)
    size = _value_size(elem) if known and elem != "void" else 0
    return (ParamBinding(arg, base, off, writable, scalar_size(elem), nbytes, size, position),
            [f"__global {const}uchar* {base}"], lines)


def _load(cl_elem: str, ptr: str, base: str, off: str) -> str:
    """The read of a ``constant T&`` parameter's value at ``base + off``: a vector by ``vloadN`` (a bound offset
    need only be a multiple of the element size; docs/kernels.md, "Vector loads and stores at any offset")."""
    vector = cl_elem.removeprefix("__mtl_").removesuffix("_u")
    if vector in VECTORS:
        elem, n = VECTORS[vector]
        return f"vload{n}(0, (__global const {elem}*)({base} + {off}))"
    return f"*(({ptr})({base} + {off}))"


def _value_size(msl_type: str) -> int:
    """Bytes of one value of a scalar or vector type (a 3-vector takes 4 elements' room)."""
    elem, n = VECTORS.get(msl_type, (msl_type, 1))
    return scalar_size(elem) * (4 if n == 3 else n)

