"""MSL's scalar, vector, pointer and array types as the soft-float rewrite sees them (``Ty``), and C's typing of
operands: number literals, integer promotion, the usual arithmetic conversions."""
from __future__ import annotations

from dataclasses import dataclass

from mtlir.runtime.sim.msl.names import SOFT_FLOATS

__all__ = ["Ty", "MEMORY", "SPACES", "INT_RANK", "FLOATS", "half_literal", "literal_type", "width", "promote",
           "usual"]

# where a 16-bit float is its 16 bits
MEMORY = frozenset({"device", "constant", "threadgroup"})
# the address spaces of a declaration
SPACES = ("device", "constant", "threadgroup", "thread")
# the integer types by their conversion rank
INT_RANK = {"bool": 0, "char": 1, "uchar": 1, "short": 2, "ushort": 2, "int": 3, "uint": 3, "long": 4,
            "ulong": 4, "size_t": 4, "ptrdiff_t": 4}
# the floating types
FLOATS = frozenset({"float", "half", "bfloat"})


@dataclass(frozen=True)
class Ty:
    """An MSL type as the rewrite sees it: ``base`` a scalar name (``half``, ``int``), a struct or SIMD-group matrix
    type; ``n`` the vector width (1: scalar); ``space`` the address space and ``depth`` the ``*``/``[]`` levels of
    a pointer or array (``depth`` 0: a value)."""

    base: str
    n: int = 1
    space: str = ""
    depth: int = 0

    @property
    def soft(self) -> bool:
        """A half or bfloat value (scalar or vector)."""
        return self.depth == 0 and self.base in SOFT_FLOATS

    @property
    def arithmetic(self) -> bool:
        """A number value: a float, a 16-bit float or an integer (scalar or vector)."""
        return self.depth == 0 and (self.base in FLOATS or self.base in INT_RANK)

    def element(self) -> Ty:
        """What one ``[]`` or ``*`` of a pointer or array reaches."""
        return Ty(self.base, self.n, self.space if self.depth > 1 else "", self.depth - 1)



def half_literal(text: str) -> bool:
    """A number literal with MSL's ``h`` suffix (``1.5h``)."""
    return text[-1:] in ("h", "H") and not text.lower().startswith("0x")


def literal_type(text: str) -> Ty:
    """The type of a number literal: float (a ``.``, an exponent or ``f``; hex floats with ``p``), else int,
    uint, long or ulong by its suffix."""
    low = text.lower()
    hexa = low.startswith("0x")
    if ("p" in low) if hexa else ("." in low or "e" in low or low.endswith("f")):
        return Ty("float")
    suffix = low[len(low.rstrip("ul")):]
    return Ty(("u" if "u" in suffix else "") + ("long" if "l" in suffix else "int"))


def width(ty: Ty) -> str:
    return str(ty.n) if ty.n > 1 else ""


def promote(ty: Ty) -> Ty:
    """C's integer promotion (char and short to int); other types as they are."""
    return Ty("int", ty.n) if ty.depth == 0 and ty.n == 1 and INT_RANK.get(ty.base, 9) < 3 else ty


def usual(a: Ty | None, b: Ty | None) -> Ty | None:
    """MSL's (C++'s) usual arithmetic conversions of two operands: the type an operation computes in; None when
    either is unknown or not arithmetic, or for two vectors of different types. A scalar meeting a vector becomes
    the vector's element type (Clang's vector rules, which Metal's compiler follows)."""
    if a is None or b is None or not a.arithmetic or not b.arithmetic:
        return None
    if a.n != b.n:
        if a.n > 1 and b.n > 1:
            return None
        vec = a if a.n > 1 else b
        return Ty(vec.base, vec.n)
    if a.n > 1:
        return Ty(a.base, a.n) if a.base == b.base else None
    fa, fb = a.base in FLOATS, b.base in FLOATS
    if fa or fb:
        if fa and fb and a.base != b.base:
            return Ty("float") if "float" in (a.base, b.base) else None
        return Ty(a.base if fa else b.base)
    pa, pb = promote(a), promote(b)
    ra, rb = INT_RANK[pa.base], INT_RANK[pb.base]
    if ra != rb:
        return pa if ra > rb else pb
    return pa if pa.base.startswith("u") else pb

