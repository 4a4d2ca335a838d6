"""OpenCL C definitions the translated kernels need, emitted once at the top of the translated source.

``Prelude`` collects what the translation rules asked for while they ran and renders the definitions:

- an under-aligned alias per vector type used through a pointer, ``typedef float4 __mtl_float4_u
  __attribute__((aligned(4)));``, the type of those pointers: OpenCL requires a ``float4*`` to be 16-byte
  aligned (OpenCL C §6.1.5), Metal buffer offsets need only be a multiple of the element size. The pointers are
  never dereferenced (NVIDIA's OpenCL ignores the lowered alignment): every access through them is a
  ``vloadN``/``vstoreN`` or an element access (``guard.vector``);
- ``__mtl_make_float4``-style overload sets for one-argument vector constructors: MSL's ``float4(x)`` broadcasts a
  scalar and converts a vector of another element type, OpenCL's ``(float4)(x)`` only broadcasts (a vector of
  another type needs ``convert_float4``); the overloads pick the right one by the argument's type;
- ``__mtl_abs``, ``__mtl_fract``, ``__mtl_saturate``: MSL builtins whose OpenCL namesakes differ
  (``names.HELPER_BUILTINS``);
- the bounds check of buffer accesses (``guard``);
- the libraries of definitions a part of the translator asks for by name (``need_library``): the software half
  and bfloat of ``softfloat``, the SIMD groups of ``simd``.

Overload sets use Clang's ``__attribute__((overloadable))``, which every Clang-based OpenCL compiler (PoCL among
them) accepts in OpenCL C.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mtlir.runtime.sim.msl.names import VECTOR_ELEMENTS, VECTORS, scalar_size

__all__ = ["Prelude", "unaligned_name", "make_name", "helper_name"]

_OL = "static inline __attribute__((overloadable))"
_SIGNED = ("char", "short", "int", "long")
_UNSIGNED = ("uchar", "ushort", "uint", "ulong")
_CTOR_SCALARS = ("bool",) + _SIGNED + _UNSIGNED + ("float",)


# The bounds check of a buffer access (``guard``): ``a`` is in range when ``[a, a + size)`` lies inside the
# MTLBuffer ``[start, start + length)`` (unsigned arithmetic: an address below ``start`` wraps to a huge ``d``).
# Out of range: the first such access records ``code`` (2 * parameter position + 1 for a read, + 2 for a write),
# the size and the byte offset ``d`` in the fault words ``f[0..3]``, and the access goes to the scratch area after
# the 16 fault words instead (``kernels.runner`` allocates both).
_BOUNDS_CHECK = [
    "static __attribute__((noinline)) __global uchar* __mtl_out_of_bounds(ulong size, ulong d, __global uint* f, "
    "uint code) {",
    "  if (f[0] == 0u && atomic_cmpxchg((volatile __global uint*)f, 0u, code) == 0u) {",
    "    f[1] = (uint)size; f[2] = (uint)d; f[3] = (uint)(d >> 32);",
    "  }",
    "  return (__global uchar*)(f + 16);",
    "}",
    "static inline __global uchar* __mtl_chk(__global uchar* a, ulong size, ulong start, ulong length, "
    "__global uint* f, uint code) {",
    "  ulong d = (ulong)a - start;",
    "  return __builtin_expect(d <= length && size <= length - d, 1) ? a : __mtl_out_of_bounds(size, d, f, code);",
    "}",
    "static inline __local uchar* __mtl_chk_l(__local uchar* a, ulong size, ulong start, ulong length, "
    "__global uint* f, uint code, __local uchar* scratch) {",
    "  ulong d = (ulong)a - start;",
    "  if (__builtin_expect(d <= length && size <= length - d, 1)) return a;",
    "  __mtl_out_of_bounds(size, d, f, code);",
    "  return scratch;",
    "}",
    "static inline uchar* __mtl_chk_p(uchar* a, ulong size, ulong start, ulong length, __global uint* f, "
    "uint code, uchar* scratch) {",
    "  ulong d = (ulong)a - start;",
    "  if (__builtin_expect(d <= length && size <= length - d, 1)) return a;",
    "  __mtl_out_of_bounds(size, d, f, code);",
    "  return scratch;",
    "}",
    "#define __MTL_CHK_L(a, start, length, code) \\",
    "  ((__typeof__(a))__mtl_chk_l((__local uchar*)(a), sizeof(*(a)), start, length, __mtl_fault, code, "
    "__mtl_lscratch))",
    "#define __MTL_CHK_P(a, start, length, code) \\",
    "  ((__typeof__(a))__mtl_chk_p((uchar*)(a), sizeof(*(a)), start, length, __mtl_fault, code, __mtl_pscratch))",
    "#define __MTL_FAULTED (__mtl_fault[0] != 0u)",
    "#define __MTL_CHK(a, start, length, code) \\",
    "  ((__typeof__(a))__mtl_chk((__global uchar*)(a), sizeof(*(a)), start, length, __mtl_fault, code))",
]


def unaligned_name(vector: str) -> str:
    """The under-aligned alias of a vector type: ``float4`` -> ``__mtl_float4_u``."""
    return f"__mtl_{vector}_u"


def make_name(vector: str) -> str:
    """The one-argument constructor overload set of a vector type: ``float4`` -> ``__mtl_make_float4``."""
    return f"__mtl_make_{vector}"


def helper_name(builtin: str) -> str:
    """The overload set standing for an MSL builtin: ``abs`` -> ``__mtl_abs``."""
    return f"__mtl_{builtin}"


@dataclass
class Prelude:
    """What the translated source needs before its first line. Rules call ``need_*``; ``render`` gives the OpenCL C
    text (empty when nothing is needed)."""

    libraries: dict[str, str] = field(default_factory=dict)
    unaligned: set[str] = field(default_factory=set)
    makers: set[str] = field(default_factory=set)
    helpers: set[str] = field(default_factory=set)
    bounds_check: bool = False

    def need_library(self, name: str, text: str) -> None:
        """Ask for a library of OpenCL C definitions (``text``) once, by ``name``; libraries come last (after the
        bounds check, which they may use), in the order they were first asked for (a library asks for those it uses
        before itself)."""
        self.libraries[name] = text

    def need_unaligned(self, vector: str) -> str:
        """Ask for the under-aligned alias of ``vector`` (``float4``); returns its name."""
        self.unaligned.add(vector)
        return unaligned_name(vector)

    def need_maker(self, vector: str) -> str:
        """Ask for the one-argument constructor overloads of ``vector``; returns their name."""
        self.makers.add(vector)
        return make_name(vector)

    def need_helper(self, builtin: str) -> str:
        """Ask for the overload set standing for the MSL builtin ``builtin`` (abs, fract, saturate)."""
        self.helpers.add(builtin)
        return helper_name(builtin)

    def need_bounds_check(self) -> None:
        """Ask for ``__mtl_chk``, the bounds check of every buffer access (``guard``)."""
        self.bounds_check = True

    def _vec(self, elems: tuple[str, ...]) -> list[str]:
        return list(elems) + [f"{e}{n}" for e in elems for n in (2, 3, 4)]

    def render(self) -> str:
        """The OpenCL C definitions asked for, in a fixed order (so the same MSL always gives the same text)."""
        out: list[str] = []
        for v in sorted(self.unaligned):
            out.append(f"typedef {v} {unaligned_name(v)} __attribute__((aligned({scalar_size(v)})));")
        for v in sorted(self.makers):
            out += self._render_maker(v)
        for h in sorted(self.helpers):
            out += getattr(self, f"_render_{h}")()
        if self.bounds_check:
            out += _BOUNDS_CHECK
        out += self.libraries.values()
        return "\n".join(out) + "\n" if out else ""

    def _render_maker(self, vector: str) -> list[str]:
        elem, n = VECTORS[vector]
        name = make_name(vector)
        lines = [f"{_OL} {vector} {name}({s} x) {{ return ({vector})(({elem})x); }}" for s in _CTOR_SCALARS]
        for e in VECTOR_ELEMENTS:
            if e == "half":  # no half vectors reach OpenCL C: softfloat makes them float vectors
                continue
            src = f"{e}{n}"
            body = "x" if src == vector else f"convert_{vector}(x)"
            lines.append(f"{_OL} {vector} {name}({src} x) {{ return {body}; }}")
        return lines

    def _render_abs(self) -> list[str]:
        name = helper_name("abs")
        lines = [f"{_OL} {t} {name}({t} x) {{ return fabs(x); }}" for t in self._vec(("float",))]
        for t in self._vec(_SIGNED):
            lines.append(f"{_OL} {t} {name}({t} x) {{ return as_{t}(abs(x)); }}")
        lines += [f"{_OL} {t} {name}({t} x) {{ return x; }}" for t in self._vec(_UNSIGNED)]
        return lines

    def _render_fract(self) -> list[str]:
        name = helper_name("fract")
        return [f"{_OL} {t} {name}({t} x) {{ {t} i; return fract(x, &i); }}" for t in self._vec(("float",))]

    def _render_saturate(self) -> list[str]:
        name = helper_name("saturate")
        return [f"{_OL} {t} {name}({t} x) {{ return clamp(x, ({t})0, ({t})1); }}" for t in self._vec(("float",))]

