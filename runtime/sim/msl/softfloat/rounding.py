"""Rounding to half and bfloat: the OpenCL C functions the rewrite calls (``SOFTFLOAT_PRELUDE``) and the same
rounding in Python for program-scope constants (``bits_of``)."""
from __future__ import annotations

import numpy as np

__all__ = ["ROUND", "TO_BITS", "FROM_BITS", "bits_of", "float_literal", "SOFTFLOAT_PRELUDE"]

# the OpenCL C functions of each 16-bit float type: a float rounded to it, a float narrowed to its 16 bits, its 16
# bits widened to a float
ROUND = {"half": "__mtl_rh", "bfloat": "__mtl_rb"}
TO_BITS = {"half": "__mtl_f2h", "bfloat": "__mtl_f2b"}
FROM_BITS = {"half": "__mtl_h2f", "bfloat": "__mtl_b2f"}


def bits_of(base: str, value: float) -> int:
    """The 16 bits of ``value`` rounded to half or bfloat (to nearest, ties to even)."""
    if base == "half":
        return int(np.float16(value).view(np.uint16))
    f = int(np.float32(value).view(np.uint32))
    if (f & 0x7FFFFFFF) > 0x7F800000:
        return (f >> 16) | 0x40
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16) & 0xFFFF


def float_literal(value: float) -> str:
    """An OpenCL C single-precision literal of exactly ``value`` (a half value: exact in float)."""
    if value != value:
        return "NAN"
    if value == float("inf"):
        return "INFINITY"  # a literal is never negative: its minus is an operator
    return f"{value!r}f" if "e" in repr(value) or "." in repr(value) else f"{value!r}.0f"


def _vector_overloads(ret: str, arg: str, body: str) -> list[str]:
    """``static inline`` overloads of one conversion for the scalar and 2-, 3-, 4-vectors (``{r}``, ``{a}``: the
    return and argument types at each width, ``{n}``: the width's suffix)."""
    out = []
    for n in ("", "2", "3", "4"):
        out.append("static inline __attribute__((overloadable)) " + body.format(r=ret + n, a=arg + n, n=n))
    return out


def _softfloat_prelude() -> str:
    lines = [
        "// half and bfloat in software (softfloat): bits <-> float, rounding to nearest, ties to even",
        "static inline __attribute__((overloadable)) ushort __mtl_f2h(float f) {",
        "  uint x = as_uint(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;",
        "  if (a > 0x7f800000u) {  /* NaN: the top 10 bits of its payload (a half moved through a float keeps its",
        "    bits, a signaling NaN too, as a GPU's half load and store do); quiet if those are all 0 */",
        "    uint m = (a >> 13) & 0x3ffu;",
        "    return (ushort)(sign | 0x7c00u | (m != 0u ? m : 0x200u));",
        "  }",
        "  if (a >= 0x477ff000u) return (ushort)(sign | 0x7c00u);  /* 65520 and above round to infinity */",
        "  if (a >= 0x38800000u) {  /* a normal half: rebias the exponent, round the 13 bits dropped */",
        "    uint r = a - 0x38000000u;",
        "    return (ushort)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));",
        "  }",
        "  return (ushort)(sign | (uint)rint(as_float(a) * 16777216.0f));  /* subnormal: multiples of 2^-24 */",
        "}",
        "static inline __attribute__((overloadable)) float __mtl_h2f(ushort h) {",
        "  uint sign = (uint)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;",
        "  if (e == 31u) return as_float(sign | 0x7f800000u | (m << 13));",
        "  if (e == 0u) return as_float(sign | as_uint((float)m * 5.9604644775390625e-8f));",
        "  return as_float(sign | ((e + 112u) << 23) | (m << 13));",
        "}",
        "static inline __attribute__((overloadable)) ushort __mtl_f2b(float f) {",
        "  uint x = as_uint(f);",
        "  /* NaN: its top 16 bits (a moved bfloat keeps them), quiet if its payload there is 0 */",
        "  if ((x & 0x7fffffffu) > 0x7f800000u) return (ushort)((x >> 16) | ((x & 0x007f0000u) != 0u ? 0u : 0x40u));",
        "  return (ushort)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);",
        "}",
        "static inline __attribute__((overloadable)) float __mtl_b2f(ushort b) { return as_float((uint)b << 16); }",
    ]
    for name, conv in (("__mtl_f2h", "ushort"), ("__mtl_f2b", "ushort")):
        for n in ("2", "3", "4"):
            parts = ", ".join(f"{name}(x.s{k})" for k in range(int(n)))
            lines.append(f"static inline __attribute__((overloadable)) {conv}{n} {name}(float{n} x) "
                         f"{{ return ({conv}{n})({parts}); }}")
    for name in ("__mtl_h2f", "__mtl_b2f"):
        for n in ("2", "3", "4"):
            parts = ", ".join(f"{name}(x.s{k})" for k in range(int(n)))
            lines.append(f"static inline __attribute__((overloadable)) float{n} {name}(ushort{n} x) "
                         f"{{ return (float{n})({parts}); }}")
    lines += _vector_overloads("float", "float", "{r} __mtl_rh({a} x) {{ return __mtl_h2f(__mtl_f2h(x)); }}")
    lines += _vector_overloads("float", "float", "{r} __mtl_rb({a} x) {{ return __mtl_b2f(__mtl_f2b(x)); }}")
    return "\n".join(lines)


# The OpenCL C definitions of the conversions the rewrite calls (``prelude`` adds them when the library uses 16-bit
# floats): ``__mtl_f2h``/``__mtl_f2b`` (float -> 16 bits, rounding), ``__mtl_h2f``/``__mtl_b2f`` (16 bits -> float,
# exact), ``__mtl_rh``/``__mtl_rb`` (a float rounded to the nearest half / bfloat), for scalars and 2-4 vectors.
SOFTFLOAT_PRELUDE = _softfloat_prelude()
