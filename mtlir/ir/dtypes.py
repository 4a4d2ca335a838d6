"""Data types of mtlir values: scalars, pointers and the two structs Metal passes by value.

Sizes are in bytes. ``MTLSize`` is ``{NSUInteger width, height, depth}`` (24 bytes) and ``NSRange`` is
``{NSUInteger location, length}`` (16 bytes) on both 64-bit Apple ABIs (Apple's Foundation and Metal headers).
Every dtype is interned: building the same type twice returns the same object, so ``is`` and ``==`` agree and
hashing is by identity (cheap, which matters because every UOp hashes its dtype).
"""
from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["DType", "PtrDType", "StructDType", "dtypes", "wrap"]


class DType:
    """A scalar type: ``name`` as printed, ``itemsize`` in bytes, ``fmt`` the ``struct`` module code,
    ``kind`` one of ``"int"``, ``"uint"``, ``"float"``, ``"bool"``, ``"void"``, ``"id"``, ``"sel"``, ``"ptr"``,
    ``"struct"``."""

    __slots__ = ("name", "itemsize", "fmt", "kind")
    _interned: ClassVar[dict[tuple[Any, ...], DType]] = {}
    name: str
    itemsize: int
    fmt: str
    kind: str

    def __new__(cls, name: str, itemsize: int, fmt: str, kind: str) -> DType:
        key = (cls, name, itemsize, fmt, kind)
        if (got := DType._interned.get(key)) is not None:
            return got
        self = object.__new__(cls)
        for k, v in zip(DType.__slots__, (name, itemsize, fmt, kind)):
            object.__setattr__(self, k, v)
        DType._interned[key] = self
        return self

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (DType, (self.name, self.itemsize, self.fmt, self.kind))

    def __repr__(self) -> str:
        if getattr(dtypes, self.name, None) is self:
            return f"dtypes.{self.name}"
        return f"DType({self.name!r}, {self.itemsize}, {self.fmt!r}, {self.kind!r})"

    def ptr(self) -> PtrDType:
        """The pointer type to this type (8 bytes, unsigned)."""
        return PtrDType(self)

    @property
    def is_int(self) -> bool:
        """True for signed and unsigned integers and bool."""
        return self.kind in ("int", "uint", "bool")

    @property
    def is_float(self) -> bool:
        """True for float16, bfloat16, float32, float64."""
        return self.kind == "float"

    @property
    def is_word(self) -> bool:
        """True for values that travel in one integer register: integers, bool, pointers, ids, SELs."""
        return self.kind in ("int", "uint", "bool", "ptr", "id", "sel")

    @property
    def bits(self) -> int:
        """Size in bits."""
        return self.itemsize * 8


class PtrDType(DType):
    """A pointer (8 bytes) to ``base``; ``dtypes.voidptr`` is ``void*``."""

    __slots__ = ("base",)
    base: DType

    def __new__(cls, base: DType) -> PtrDType:
        key = (cls, base)
        if (got := DType._interned.get(key)) is not None:
            return got  # type: ignore[return-value]
        self = object.__new__(cls)
        for k, v in zip(("name", "itemsize", "fmt", "kind", "base"), (f"{base.name}*", 8, "Q", "ptr", base)):
            object.__setattr__(self, k, v)
        DType._interned[key] = self
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (PtrDType, (self.base,))

    def __repr__(self) -> str:
        return f"{self.base!r}.ptr()"


class StructDType(DType):
    """A C struct of unsigned 64-bit words (``MTLSize``, ``NSRange``); ``fields`` names the words in order."""

    __slots__ = ("fields",)
    fields: tuple[str, ...]

    def __new__(cls, name: str, fields: tuple[str, ...]) -> StructDType:
        key = (cls, name, fields)
        if (got := DType._interned.get(key)) is not None:
            return got  # type: ignore[return-value]
        self = object.__new__(cls)
        vals = (name, 8 * len(fields), "Q" * len(fields), "struct", fields)
        for k, v in zip(("name", "itemsize", "fmt", "kind", "fields"), vals):
            object.__setattr__(self, k, v)
        DType._interned[key] = self
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (StructDType, (self.name, self.fields))

    def __repr__(self) -> str:
        if getattr(dtypes, self.name, None) is self:
            return f"dtypes.{self.name}"
        return f"StructDType({self.name!r}, {self.fields!r})"


class dtypes:
    """The dtype namespace: ``dtypes.int32``, ``dtypes.float32``, ``dtypes.MTLSize``, ...

    ``dtypes.id`` is an Objective-C object pointer and ``dtypes.SEL`` a selector (8-byte values);
    ``dtypes.voidptr`` is ``void*``; ``dt.ptr()`` is a pointer to ``dt``.
    """

    void = DType("void", 0, "", "void")
    bool = DType("bool", 1, "?", "bool")
    int8 = DType("int8", 1, "b", "int")
    int16 = DType("int16", 2, "h", "int")
    int32 = DType("int32", 4, "i", "int")
    int64 = DType("int64", 8, "q", "int")
    uint8 = DType("uint8", 1, "B", "uint")
    uint16 = DType("uint16", 2, "H", "uint")
    uint32 = DType("uint32", 4, "I", "uint")
    uint64 = DType("uint64", 8, "Q", "uint")
    float16 = DType("float16", 2, "e", "float")
    # Metal's bfloat (MSL spec §2.1, Apple7+): float32's top 16 bits; no struct or numpy format character
    # (``dtypes.to_numpy`` gives ml_dtypes' bfloat16)
    bfloat16 = DType("bfloat16", 2, "", "float")
    float32 = DType("float32", 4, "f", "float")
    float64 = DType("float64", 8, "d", "float")
    id = DType("id", 8, "Q", "id")
    SEL = DType("SEL", 8, "Q", "sel")
    MTLSize = StructDType("MTLSize", ("width", "height", "depth"))
    NSRange = StructDType("NSRange", ("location", "length"))
    voidptr = PtrDType(DType("void", 0, "", "void"))

    ints: ClassVar[tuple[DType, ...]]
    floats: ClassVar[tuple[DType, ...]]
    all: ClassVar[tuple[DType, ...]]

    @staticmethod
    def by_name(name: str) -> DType:
        """The dtype printed as ``name`` (``"int32"``, ``"float32*"``, ``"MTLSize"``); raises ``KeyError``."""
        if name.endswith("*"):
            return PtrDType(dtypes.by_name(name[:-1]))
        return _BY_NAME[name]

    @staticmethod
    def to_numpy(dt: DType) -> Any:
        """The numpy dtype of elements of ``dt`` (a bool, integer or float dtype): ``np.dtype(dt.fmt)``, and
        ml_dtypes' ``bfloat16`` for bfloat16 (numpy has none; ml_dtypes is a dependency, imported here only).
        Raises ``TypeError`` for a dtype that is no element type (void, a pointer, a struct, an id)."""
        import numpy as np
        if dt is dtypes.bfloat16:
            import ml_dtypes
            return np.dtype(ml_dtypes.bfloat16)
        if dt.kind not in ("bool", "int", "uint", "float") or not dt.fmt:
            raise TypeError(f"{dt.name} is not an element type (bool, an integer or a float)")
        return np.dtype(dt.fmt)

    @staticmethod
    def min(dt: DType) -> int:
        """Smallest value of an integer-like dtype."""
        return -(1 << (dt.bits - 1)) if dt.kind == "int" else 0

    @staticmethod
    def max(dt: DType) -> int:
        """Largest value of an integer-like dtype (pointers, ids and SELs are 64-bit unsigned)."""
        if dt.kind == "bool":
            return 1
        return (1 << (dt.bits - 1)) - 1 if dt.kind == "int" else (1 << dt.bits) - 1


dtypes.ints = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64,
               dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
dtypes.floats = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
dtypes.all = (dtypes.void, dtypes.bool, *dtypes.ints, *dtypes.floats, dtypes.id, dtypes.SEL,
              dtypes.MTLSize, dtypes.NSRange)
_BY_NAME: dict[str, DType] = {d.name: d for d in dtypes.all}


def wrap(dtype: DType, value: Any) -> Any:
    """``value`` converted to ``dtype`` as a C conversion does: integers wrap to the dtype's width (two's complement
    for signed types; pointers, ids and SELs are 64-bit unsigned), bool becomes ``bool(value)``, anything else (a
    float, a selector name) is returned unchanged."""
    kind = dtype.kind
    if kind == "bool":
        return bool(value)
    if kind not in _WORD_KINDS or not isinstance(value, int):
        return value
    bits = dtype.itemsize * 8
    value &= (1 << bits) - 1
    if kind == "int" and value >> (bits - 1):
        value -= 1 << bits
    return value


_WORD_KINDS = frozenset({"int", "uint", "ptr", "id", "sel"})

