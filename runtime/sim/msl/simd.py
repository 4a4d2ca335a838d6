"""SIMD groups on an OpenCL device without sub-groups: Metal's SIMD-group functions and 8x8 SIMD-group matrices.

Apple GPUs run a threadgroup's threads in SIMD groups of 32 (``threadExecutionWidth``): lanes are consecutive
threads in the threadgroup's linear order (``thread_index_in_threadgroup``), lane ``t % 32`` of SIMD group
``t / 32``; quad groups are 4 consecutive lanes. The OpenCL devices here (PoCL on the CPU, NVIDIA's OpenCL) have no
sub-group functions, so every exchange between lanes goes through threadgroup memory with barriers: each kernel
that uses one gets a ``__local uchar* __mtl_simd`` scratch argument (``SIMD_PARAM``, 68 bytes per thread, given at
each run by the runner: ``scratch_bytes``), and each helper function that uses one, directly or through another
helper, gets the same pointer as a last parameter, passed at every call (``simd_helpers``). A SIMD-group function
is a macro of ``SIMD_PRELUDE``: a barrier, each lane writes its value in its slot, a barrier, each lane reads its
group's slots. The barriers are the threadgroup's, so a SIMD-group function must be reached by every thread of
the threadgroup the same number of times (uniform control flow, as OpenCL requires of barriers; tinygrad's
kernels are so); a loop holding one is never cut short by the bounds checks (``guard.loops``).

A threadgroup whose size is not a multiple of 32 ends in a partial SIMD group (and quad group): Metal runs it
with inactive lanes, and so does the simulator: an inactive lane contributes nothing to a reduction, a scan, a
ballot or a matrix (its elements are 0), a shuffle that would read an inactive (or out-of-range) lane returns the
caller's own value, as ``simd_shuffle_down`` does for the upper ``delta`` lanes.

SIMD-group matrices (``simdgroup_float8x8``, ``simdgroup_half8x8``, ``simdgroup_bfloat8x8``,
``simdgroup_matrix<T, 8, 8>``) are structs holding each lane's two elements (``thread_elements()``, a 2-vector).
Lane ``L`` holds row ``(L >> 1 & 3) | (L >> 2 & 4)``, columns ``c`` and ``c + 1`` with ``c = (L & 1) << 1 |
(L >> 1 & 4)``, for A, B, C and D alike (the layout tinygrad's Python emulator of the Metal tensor cores states,
``tinygrad/runtime/ops_python.py``; Apple's specification leaves it unstated). ``simdgroup_load`` and
``simdgroup_store`` read and write each lane's two elements directly (bounds-checked for buffers);
``simdgroup_multiply_accumulate`` exchanges A and B through the scratch (one barrier: consecutive multiplies
alternate between two buffers, so one's writes never meet the previous one's reads) and each lane computes its two
elements of D in float, rounded once to D's element type.
"""
from __future__ import annotations

from mtlir.runtime.sim.msl.guard.access import pointer_argument
from mtlir.runtime.sim.msl.lex import ID, PUNCT, RAW, Token
from mtlir.runtime.sim.msl.names import MATRIX_TYPES
from mtlir.runtime.sim.msl.rewrite import (Ctx, TokenMatch, arg_count, argument_spans, at, group_end, refuse, rewrite,
                                           tok)
from mtlir.runtime.sim.msl.softfloat.rounding import SOFTFLOAT_PRELUDE

__all__ = ["SIMD_PARAM", "SIMD_BEGIN", "SIMD_WIDTH", "SUPPORTED", "SIMD_FUNCTIONS", "MATRIX_FUNCTIONS",
           "SIMD_POSITIONS", "SIMD_PRELUDE", "scratch_bytes", "uses_scratch", "simd_helpers", "simd_function",
           "matrix_type", "matrix_function", "thread_elements", "simd_helper_call"]

SIMD_PARAM = "__mtl_simd"  # the scratch argument of kernels and helpers that exchange values between lanes
SIMD_BEGIN = f"__mtl_simd_begin({SIMD_PARAM});"  # a kernel's first statement: its thread's buffer phase
SIMD_WIDTH = 32  # threadExecutionWidth of every Apple GPU family
# The scratch, per thread of every SIMD group (the last partial one counted whole): a slot for the value a SIMD-group
# function moves (32 bytes: the largest, a long4), a 32-byte share of its SIMD group's two buffers for a matrix
# multiply's A and B (2 x 128 floats: consecutive multiplies alternate, so one barrier each suffices), and the
# thread's buffer phase (4 bytes).
SLOT_BYTES = 32
MATRIX_BYTES = 32
PHASE_BYTES = 4

_LINEAR = "((get_local_id(2) * get_local_size(1) + get_local_id(1)) * get_local_size(0) + get_local_id(0))"
_THREADS = "(get_local_size(0) * get_local_size(1) * get_local_size(2))"
# SIMD-group and quad-group position attributes of kernel parameters (MSL spec §5.2.3.6) -> OpenCL expressions.
SIMD_POSITIONS = {
    "thread_index_in_simdgroup": f"{_LINEAR} % 32u",
    "simdgroup_index_in_threadgroup": f"{_LINEAR} / 32u",
    "threads_per_simdgroup": "32u",
    "simdgroups_per_threadgroup": f"({_THREADS} + 31u) / 32u",
    "thread_index_in_quadgroup": f"{_LINEAR} % 4u",
    "quadgroup_index_in_threadgroup": f"{_LINEAR} / 4u",
    "quadgroups_per_threadgroup": f"({_THREADS} + 3u) / 4u",
}

# MSL SIMD-group and quad-group functions (MSL spec §6.9.2, §6.9.3) -> (macro of SIMD_PRELUDE, its group width,
# its operation); every one of them takes the scratch.
_REDUCTIONS = {"sum": "__MTL_ADD", "product": "__MTL_MUL", "min": "min", "max": "max", "and": "__MTL_AND",
               "or": "__MTL_OR", "xor": "__MTL_XOR"}
_SCANS = {"prefix_inclusive_sum": ("__MTL_ADD", "0", 1), "prefix_exclusive_sum": ("__MTL_ADD", "0", 0),
          "prefix_inclusive_product": ("__MTL_MUL", "1", 1), "prefix_exclusive_product": ("__MTL_MUL", "1", 0)}
_SHUFFLES = {"shuffle": "(uint)(__a)", "broadcast": "(uint)(__a)", "shuffle_down": "__l + (uint)(__a)",
             "shuffle_up": "__l - (uint)(__a)", "shuffle_xor": "__l ^ (uint)(__a)",
             "shuffle_rotate_down": "(__l + (uint)(__a)) & (__w - 1u)",
             "shuffle_rotate_up": "(__l - (uint)(__a)) & (__w - 1u)"}
SIMD_FUNCTIONS: dict[str, str] = {}
for _group, _width in (("simd", 32), ("quad", 4)):
    for _op, _fn in _REDUCTIONS.items():
        SIMD_FUNCTIONS[f"{_group}_{_op}"] = f"__MTL_REDUCE({SIMD_PARAM}, {_width}u, {_fn}, "
    for _op, (_fn, _identity, _inclusive) in _SCANS.items():
        SIMD_FUNCTIONS[f"{_group}_{_op}"] = f"__MTL_SCAN({SIMD_PARAM}, {_width}u, {_fn}, {_identity}, {_inclusive}, "
    for _op, _src in _SHUFFLES.items():
        SIMD_FUNCTIONS[f"{_group}_{_op}"] = f"__MTL_SHUFFLE({SIMD_PARAM}, {_width}u, {_src}, "
    SIMD_FUNCTIONS[f"{_group}_broadcast_first"] = f"__MTL_BROADCAST_FIRST({SIMD_PARAM}, {_width}u, "
    SIMD_FUNCTIONS[f"{_group}_ballot"] = f"__MTL_BALLOT({SIMD_PARAM}, {_width}u, "
    SIMD_FUNCTIONS[f"{_group}_all"] = f"__MTL_ALL({SIMD_PARAM}, {_width}u, "
    SIMD_FUNCTIONS[f"{_group}_any"] = f"__MTL_ANY({SIMD_PARAM}, {_width}u, "
# Without an exchange (no scratch): the first active lane, the active lanes' mask.
_LOCAL_FUNCTIONS = {"simd_is_first": "(__mtl_thread_index() % 32u == 0u)",
                    "quad_is_first": "(__mtl_thread_index() % 4u == 0u)",
                    "simd_active_threads_mask": "__mtl_active_mask(32u)",
                    "quad_active_threads_mask": "__mtl_active_mask(4u)"}

MATRIX_FUNCTIONS = frozenset({"simdgroup_load", "simdgroup_store", "simdgroup_multiply",
                              "simdgroup_multiply_accumulate", "make_filled_simdgroup_matrix"})
_EXCHANGES = frozenset(SIMD_FUNCTIONS) | {"simdgroup_multiply", "simdgroup_multiply_accumulate"}
# Every name this module handles (the translator's refusal scan lets them through).
SUPPORTED = (frozenset(SIMD_FUNCTIONS) | frozenset(_LOCAL_FUNCTIONS) | frozenset(SIMD_POSITIONS) | MATRIX_FUNCTIONS
             | frozenset(MATRIX_TYPES) | {"simdgroup_matrix", "simdgroup_barrier", "thread_elements"})


def scratch_bytes(threads: int) -> int:
    """The scratch a kernel with SIMD-group functions needs for a threadgroup of ``threads`` threads: 68 bytes per
    thread of every SIMD group, the last partial one included (``SLOT_BYTES``, ``MATRIX_BYTES``,
    ``PHASE_BYTES``)."""
    return -(-threads // SIMD_WIDTH) * SIMD_WIDTH * (SLOT_BYTES + MATRIX_BYTES + PHASE_BYTES)


def uses_scratch(ts: list[Token], start: int, end: int, helpers: set[str]) -> bool:
    """True when ``ts[start:end]`` exchanges values between lanes: a SIMD-group function, a matrix multiply, or a
    call of one of ``helpers`` (functions that do)."""
    for k in range(start, end):
        t = ts[k]
        if t.kind == ID and at(ts, k + 1).text == "(" and (t.text in _EXCHANGES or t.text in helpers):
            return True
    return False


def simd_helpers(ts: list[Token], functions: list[tuple[str, int, int]]) -> set[str]:
    """The names of the helper functions (``(name, start, end)`` spans) that exchange values between lanes,
    directly or through one another: they take the scratch."""
    found: set[str] = set()
    while True:
        more = {name for name, a, b in functions if name not in found and uses_scratch(ts, a, b, found)}
        if not more:
            return found
        found |= more


# --- token rules ---

def simd_function(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``simd_sum(x)`` -> ``__MTL_REDUCE(__mtl_simd, 32u, __MTL_ADD, x)`` and the other SIMD-group and quad-group
    functions -> their macros (the scratch first); ``simd_is_first()`` and the active-lanes masks need no
    exchange; ``simdgroup_barrier(flags)`` is a threadgroup barrier (``threadgroup_barrier`` rewrites it)."""
    t = ts[i]
    if at(ts, i + 1).text != "(":
        return None
    if t.text in _LOCAL_FUNCTIONS:
        if arg_count(ts, i + 1):
            refuse(t, t.text, f"{t.text}() takes no arguments")
        _need_prelude(ctx)
        return group_end(ts, i + 1) + 1 - i, [tok(_LOCAL_FUNCTIONS[t.text], RAW)]
    macro = SIMD_FUNCTIONS[t.text]
    _need_scratch(t, ctx)
    if arg_count(ts, i + 1) == 0:
        refuse(t, t.text, f"{t.text} needs its arguments")
    return 2, [tok(macro, RAW)]


def _need_prelude(ctx: Ctx) -> None:
    """The SIMD-group definitions, after the soft-float conversions their half and bfloat matrices use and the
    bounds check their loads and stores from buffers make."""
    ctx.prelude.need_bounds_check()
    ctx.prelude.need_library("softfloat", SOFTFLOAT_PRELUDE)
    ctx.prelude.need_library("simd", SIMD_PRELUDE)


def _need_scratch(t: Token, ctx: Ctx) -> None:
    if not ctx.simd_scratch:
        refuse(t, t.text, "a SIMD-group function outside a kernel or a helper function (it needs the threadgroup "
                          "memory the simulated device exchanges lanes' values through)")
    _need_prelude(ctx)


def matrix_type(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``simdgroup_float8x8`` -> ``__mtl_simdgroup_float8x8`` (a struct of the lane's two elements);
    ``simdgroup_float8x8(v)`` -> a diagonal matrix of ``v`` (MSL's constructor), ``simdgroup_matrix<T, 8, 8>`` ->
    the type of T."""
    t = ts[i]
    _need_prelude(ctx)
    if t.text == "simdgroup_matrix":
        elem, j = _matrix_template(ts, i, "simdgroup_matrix")
        name = f"simdgroup_{elem}8x8"
    else:
        name, j = t.text, i + 1
    if at(ts, j).text == "(":
        if arg_count(ts, j) == 0:
            return j + 2 - i, [tok(f"__mtl_make_filled_{name}(0.0f)", RAW)]
        return j - i, [tok(f"__mtl_make_diagonal_{name}", ID)]
    return j - i, [tok(f"__mtl_{name}", ID)]


def _matrix_template(ts: list[Token], i: int, what: str) -> tuple[str, int]:
    """``what<T, 8, 8>`` or ``what<T, 8>`` at ``i``: (T, the index past ``>``); other sizes are refused."""
    if at(ts, i + 1).text != "<" or at(ts, i + 2).text not in ("float", "half", "bfloat"):
        refuse(ts[i], what, f"expected {what}<T, 8, 8> with T float, half or bfloat")
    j = i + 3
    sizes = []
    while at(ts, j).text == "," and j < i + 8:
        sizes.append(at(ts, j + 1).text)
        j += 2
    if at(ts, j).text != ">" or sizes not in (["8"], ["8", "8"]):
        refuse(ts[i], what, "only 8x8 SIMD-group matrices exist on Apple GPUs")
    return ts[i + 2].text, j + 1


def thread_elements(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """``m.thread_elements()`` -> ``m.e``: the 2-vector of the lane's elements (an lvalue, as in MSL)."""
    if i == 0 or ts[i - 1].text != "." or at(ts, i + 1).text != "(" or at(ts, i + 2).text != ")":
        refuse(ts[i], "thread_elements", "expected m.thread_elements() on a SIMD-group matrix m")
    return 3, [tok("e", ID)]


def matrix_function(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """The SIMD-group matrix functions: ``make_filled_simdgroup_matrix<T, 8, 8>(v)``; ``simdgroup_multiply(d, a,
    b)`` and ``simdgroup_multiply_accumulate(d, a, b, c)`` -> ``__mtl_simdgroup_multiply_accumulate(__mtl_simd,
    &(d), a, b, c)``; ``simdgroup_load(d, src, stride = 8, origin = 0, transpose = false)`` and
    ``simdgroup_store(m, dst, ...)`` with their defaults filled and, for a buffer, the bounds its two accesses
    per lane are checked against."""
    t = ts[i]
    _need_prelude(ctx)
    if t.text == "make_filled_simdgroup_matrix":
        elem, j = _matrix_template(ts, i, t.text)
        return j - i, [tok(f"__mtl_make_filled_simdgroup_{elem}8x8", ID)]
    if at(ts, i + 1).text != "(":
        refuse(t, t.text, f"expected a call of {t.text}")
    close = group_end(ts, i + 1)
    args = argument_spans(ts, i + 1, close)
    out: list[Token] = []
    if t.text in ("simdgroup_multiply", "simdgroup_multiply_accumulate"):
        _need_scratch(t, ctx)
        want = 3 if t.text == "simdgroup_multiply" else 4
        if len(args) != want:
            refuse(t, t.text, f"{t.text} takes {want} arguments")
        out.append(tok(f"__mtl_simdgroup_multiply_accumulate({SIMD_PARAM}, &(", RAW))
        out += rewrite(ts, ctx, *args[0])
        for a, b in args[1:]:
            out.append(tok("), (" if a == args[1][0] else ", (", RAW))
            out += rewrite(ts, ctx, a, b)
            out.append(tok(")", PUNCT))
        if t.text == "simdgroup_multiply":
            out.append(tok(", __mtl_zero_matrix()", RAW))
        out.append(tok(")", PUNCT))
        return close + 1 - i, out
    if not 2 <= len(args) <= 5:
        refuse(t, t.text, f"{t.text} takes a matrix, a pointer and up to three more arguments")
    store = t.text == "simdgroup_store"
    pointer, bounds = pointer_argument(ts, *args[1], ctx, store, f"the pointer given to {t.text}")
    matrix = rewrite(ts, ctx, *args[0])
    out = [tok(f"__mtl_{t.text}{'_checked' if bounds else ''}(", RAW)]
    out += matrix if store else [tok("&(", RAW), *matrix, tok(")", PUNCT)]
    out += [tok(",", PUNCT), *pointer]
    for k, (cast, default) in enumerate((("(ulong)", "8"), ("(ulong2)", "0"), ("(bool)", "false"))):
        value = rewrite(ts, ctx, *args[2 + k]) if len(args) > 2 + k else [tok(default, RAW)]
        out += [tok(f", {cast}(", RAW), *value, tok(")", PUNCT)]
    out.append(tok(f"{bounds or ''})", RAW))
    return close + 1 - i, out


def simd_helper_call(ts: list[Token], i: int, ctx: Ctx) -> TokenMatch | None:
    """A call of a helper that takes the scratch: ``f(x)`` -> ``f(x, __mtl_simd)`` (a helper that also takes
    buffer pointers is called by ``guard``'s rule, which adds it too)."""
    if ts[i].text not in ctx.simd_helpers or at(ts, i + 1).text != "(" or (i and ts[i - 1].text in (".", "->")):
        return None
    _need_scratch(ts[i], ctx)
    close = group_end(ts, i + 1)
    out = [tok(ts[i].text, ID), ts[i + 1], *rewrite(ts, ctx, i + 2, close)]
    out.append(tok(f"{', ' if close > i + 2 else ''}{SIMD_PARAM})", RAW))
    return close + 1 - i, out


# --- the OpenCL C definitions ---

def _matrix_definitions() -> list[str]:
    out = []
    for name in MATRIX_TYPES:
        out.append(f"typedef struct {{ float2 e; }} __mtl_{name};  /* the lane's two elements, as floats */")
    out.append("static inline uint __mtl_matrix_row(void) { uint l = __mtl_thread_index() & 31u; "
               "return ((l >> 1) & 3u) | ((l >> 2) & 4u); }")
    out.append("static inline uint __mtl_matrix_col(void) { uint l = __mtl_thread_index() & 31u; "
               "return ((l & 1u) << 1) | ((l >> 1) & 4u); }")
    out.append("static inline __mtl_simdgroup_float8x8 __mtl_zero_matrix(void) "
               "{ __mtl_simdgroup_float8x8 m; m.e = (float2)(0.0f); return m; }")
    rounding = {"float": "", "half": "__mtl_rh", "bfloat": "__mtl_rb"}
    bits = {"half": ("__mtl_h2f", "__mtl_f2h"), "bfloat": ("__mtl_b2f", "__mtl_f2b")}
    ol = "static inline __attribute__((overloadable))"
    for name, elem in MATRIX_TYPES.items():
        m = f"__mtl_{name}"
        rnd = rounding[elem]
        out.append(f"static inline {m} __mtl_make_filled_{name}(float v) {{ {m} m; m.e = (float2)({rnd}(v)); "
                   "return m; }")
        out.append(f"static inline {m} __mtl_make_diagonal_{name}(float v) {{ {m} m; uint r = __mtl_matrix_row(), "
                   f"c = __mtl_matrix_col(); m.e = (float2)(r == c ? {rnd}(v) : 0.0f, r == c + 1u ? {rnd}(v) : 0.0f); "
                   "return m; }")
        # loads and stores: each lane's two elements, (row, col) and (row, col + 1) of the 8x8 block at origin
        # (x: column, y: row); transposed, element (r, c) is the block's (c, r)
        mem = {"float": ["float"], "half": ["ushort"], "bfloat": ["ushort"]}[elem]
        for space in ("__global", "__local", "__private"):
            for stored in mem:
                load = "p[k]" if elem == "float" else f"{bits[elem][0]}(p[k])"
                store = "v" if elem == "float" else f"{bits[elem][1]}(v)"
                where = ("ulong k = transpose ? (origin.y + c + j) * stride + origin.x + r "
                         ": (origin.y + r) * stride + origin.x + c + j;")
                out.append(f"{ol} void __mtl_simdgroup_load({m}* d, {space} const {stored}* p, ulong stride, "
                           "ulong2 origin, bool transpose) { uint r = __mtl_matrix_row(), c = __mtl_matrix_col(); "
                           f"for (uint j = 0u; j < 2u; j++) {{ {where} d->e[j] = {load}; }} }}")
                out.append(f"{ol} void __mtl_simdgroup_store({m} m, {space} {stored}* p, ulong stride, "
                           "ulong2 origin, bool transpose) { uint r = __mtl_matrix_row(), c = __mtl_matrix_col(); "
                           f"for (uint j = 0u; j < 2u; j++) {{ {where} float v = m.e[j]; p[k] = {store}; }} }}")
            if space == "__global":
                for stored in mem:
                    load = "*q" if elem == "float" else f"{bits[elem][0]}(*q)"
                    store = "v" if elem == "float" else f"{bits[elem][1]}(v)"
                    where = ("ulong k = transpose ? (origin.y + c + j) * stride + origin.x + r "
                             ": (origin.y + r) * stride + origin.x + c + j;")
                    chk = (f"__global {{const}}{stored}* q = (__global {{const}}{stored}*)__mtl_chk("
                           f"(__global uchar*)(p + k), sizeof({stored}), start, length, f, code);")
                    out.append(f"{ol} void __mtl_simdgroup_load_checked({m}* d, __global const {stored}* p, "
                               "ulong stride, ulong2 origin, bool transpose, ulong start, ulong length, "
                               "uint code, __global uint* f) { uint r = __mtl_matrix_row(), c = __mtl_matrix_col(); "
                               f"for (uint j = 0u; j < 2u; j++) {{ {where} {chk.format(const='const ')} "
                               f"d->e[j] = {load}; }} }}")
                    out.append(f"{ol} void __mtl_simdgroup_store_checked({m} m, __global {stored}* p, "
                               "ulong stride, ulong2 origin, bool transpose, ulong start, ulong length, "
                               "uint code, __global uint* f) { uint r = __mtl_matrix_row(), c = __mtl_matrix_col(); "
                               f"for (uint j = 0u; j < 2u; j++) {{ {where} {chk.format(const='')} float v = m.e[j]; "
                               f"*q = {store}; }} }}")
    # D = A B + C: A's and B's elements go through the scratch (A at float 0, B at float 64 of one of the SIMD
    # group's two 128-float buffers, alternately); an inactive lane's elements are written as 0 by the active ones
    out += [
        "static float2 __mtl_matrix_mma(__local uchar* scratch, float2 a, float2 b, float2 c) {",
        "  uint t = __mtl_thread_index(), l = t & 31u, n = min(32u, __mtl_threads() - (t - l)), "
        "span = __mtl_simd_span();",
        "  __local uint* phase = (__local uint*)(scratch + 64u * span) + t;",
        "  uint ph = *phase;",
        "  *phase = ph ^ 1u;  /* the next multiply uses the other buffer: its writes cannot meet this one's reads */",
        "  __local float* s = (__local float*)(scratch + 32u * span) + (t - l) * 8u + ph * 128u;",
        "  uint r = __mtl_matrix_row(), col = __mtl_matrix_col();",
        "  s[r * 8u + col] = a.x; s[r * 8u + col + 1u] = a.y; s[64u + r * 8u + col] = b.x; "
        "s[65u + r * 8u + col] = b.y;",
        "  for (uint k = l + n; k < 32u; k += n) {",
        "    uint kr = ((k >> 1) & 3u) | ((k >> 2) & 4u), kc = ((k & 1u) << 1) | ((k >> 1) & 4u);",
        "    s[kr * 8u + kc] = 0.0f; s[kr * 8u + kc + 1u] = 0.0f; s[64u + kr * 8u + kc] = 0.0f; "
        "s[65u + kr * 8u + kc] = 0.0f;",
        "  }",
        "  barrier(CLK_LOCAL_MEM_FENCE);",
        "  float x = c.x, y = c.y;",
        "  for (uint k = 0u; k < 8u; k++) { float av = s[r * 8u + k]; x = fma(av, s[64u + k * 8u + col], x); "
        "y = fma(av, s[65u + k * 8u + col], y); }",
        "  return (float2)(x, y);",
        "}",
    ]
    names = list(MATRIX_TYPES)
    for d in names:
        rnd = rounding[MATRIX_TYPES[d]]
        for ab in names:
            for c in names:
                out.append(f"{ol} void __mtl_simdgroup_multiply_accumulate(__local uchar* s, __mtl_{d}* d, "
                           f"__mtl_{ab} a, __mtl_{ab} b, __mtl_{c} c) {{ d->e = {rnd}(__mtl_matrix_mma(s, a.e, b.e, "
                           "c.e)); }")
    return out


def _simd_prelude() -> str:
    lines = [
        "// SIMD groups of 32 lanes over threadgroup memory (simd): lanes are consecutive threads in the threadgroup",
        "static inline uint __mtl_thread_index(void) { return (get_local_id(2) * get_local_size(1) + "
        "get_local_id(1)) * get_local_size(0) + get_local_id(0); }",
        "static inline uint __mtl_threads(void) { return get_local_size(0) * get_local_size(1) * "
        "get_local_size(2); }",
        "/* the scratch: [0, 32 S) the SIMD-group functions' slots, [32 S, 64 S) two 512-byte buffers per SIMD group",
        "   for a matrix multiply, [64 S, 68 S) each thread's buffer phase; S: the threads of the whole SIMD groups */",
        "static inline uint __mtl_simd_span(void) { return (__mtl_threads() + 31u) & ~31u; }",
        "static inline void __mtl_simd_begin(__local uchar* scratch) "
        "{ ((__local uint*)(scratch + 64u * __mtl_simd_span()))[__mtl_thread_index()] = 0u; }",
        "static inline ulong __mtl_active_mask(uint w) { uint t = __mtl_thread_index(), b = t - t % w, "
        "n = min(w, __mtl_threads() - b); return n >= 64u ? ~0ul : (1ul << n) - 1ul; }",
        "#define __MTL_T(x) __typeof__((__typeof__(x))(x))",
        "#define __MTL_ADD(a, b) ((a) + (b))",
        "#define __MTL_MUL(a, b) ((a) * (b))",
        "#define __MTL_AND(a, b) ((a) & (b))",
        "#define __MTL_OR(a, b) ((a) | (b))",
        "#define __MTL_XOR(a, b) ((a) ^ (b))",
        "/* each lane's value in its slot of the scratch; __b: the group's first slot, __l: the lane, __n: the",
        "   active lanes (fewer than the width in a threadgroup's last, partial group) */",
        "#define __MTL_EXCHANGE(scratch, W, T, value) uint __w = (W), __t = __mtl_thread_index(), __l = __t % __w, "
        "__b = __t - __l, __n = min(__w, __mtl_threads() - __b); __local T* __s = (__local T*)(scratch); "
        "barrier(CLK_LOCAL_MEM_FENCE); __s[__t] = (value); barrier(CLK_LOCAL_MEM_FENCE)",
        "#define __MTL_REDUCE(scratch, W, OP, x) ({ __MTL_T(x) __v = (x); __MTL_EXCHANGE(scratch, W, __MTL_T(x), "
        "__v); __MTL_T(x) __r = __s[__b]; for (uint __k = 1u; __k < __n; __k++) __r = OP(__r, __s[__b + __k]); "
        "__r; })",
        "#define __MTL_SCAN(scratch, W, OP, IDENTITY, INCLUSIVE, x) ({ __MTL_T(x) __v = (x); "
        "__MTL_EXCHANGE(scratch, W, __MTL_T(x), __v); __MTL_T(x) __r = (__MTL_T(x))(IDENTITY); "
        "for (uint __k = 0u; __k < __l + (INCLUSIVE); __k++) __r = OP(__r, __s[__b + __k]); __r; })",
        "#define __MTL_SHUFFLE(scratch, W, SRC, x, arg) ({ __MTL_T(x) __v = (x); uint __a = (uint)(arg); "
        "__MTL_EXCHANGE(scratch, W, __MTL_T(x), __v); uint __src = (SRC); __src < __n ? __s[__b + __src] : __v; })",
        "#define __MTL_BROADCAST_FIRST(scratch, W, x) ({ __MTL_T(x) __v = (x); "
        "__MTL_EXCHANGE(scratch, W, __MTL_T(x), __v); __s[__b]; })",
        "#define __MTL_BALLOT(scratch, W, x) ({ int __v = (x) ? 1 : 0; __MTL_EXCHANGE(scratch, W, int, __v); "
        "ulong __m = 0ul; for (uint __k = 0u; __k < __n; __k++) __m |= (ulong)(__s[__b + __k] != 0) << __k; __m; })",
        "#define __MTL_ALL(scratch, W, x) ({ int __v = (x) ? 1 : 0; __MTL_EXCHANGE(scratch, W, int, __v); "
        "int __r = 1; for (uint __k = 0u; __k < __n; __k++) __r &= __s[__b + __k]; (bool)__r; })",
        "#define __MTL_ANY(scratch, W, x) ({ int __v = (x) ? 1 : 0; __MTL_EXCHANGE(scratch, W, int, __v); "
        "int __r = 0; for (uint __k = 0u; __k < __n; __k++) __r |= __s[__b + __k]; (bool)__r; })",
    ]
    return "\n".join(lines + _matrix_definitions())


# The OpenCL C definitions the SIMD-group rules use (``prelude`` adds them once when a kernel uses any); they call
# the soft-float conversions (``softfloat``) for half and bfloat matrices, which the translator then adds too.
SIMD_PRELUDE = _simd_prelude()
