"""How the simulated objc_msgSend checks and decodes what the abi pass produced.

``msg_send(proto, (receiver, sel, *args))`` must use exactly ``abi_prototype(selector, target)``
(mtlir.metal): NSRange as two uint64 words on both targets; MTLSize as a pointer to a 24-byte copy in host memory
on arm64 (AAPCS64: composites over 16 bytes go by reference) and as a tuple of three ints by value on x86_64
(System V class MEMORY). Anything else is refused with a ``BridgeError`` naming the selector and the argument —
the refusal real hardware would turn into garbage registers.

A ``MethodTable`` says which selectors each simulated class answers and which classes its object arguments must
have: each module of ``methods`` fills its own with the ``method`` decorator, and the device joins them into one
(``device.METHODS``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mtlir.ir.dtypes import DType, PtrDType, dtypes
from mtlir.metal import Prototype
from mtlir.errors import BridgeError
from mtlir.runtime.bridge.memory import HostMemory

__all__ = ["Method", "MethodTable", "check_prototype", "decode_word", "decode_size", "NIL"]

NIL = None  # in an argument spec: nil is accepted for this object argument
_MTLSIZE_PTR = PtrDType(dtypes.MTLSize)
_U64_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class Method:
    """A selector a class answers: ``fn(device, receiver, *decoded_args)``, for each ``id`` argument in order the
    classes it accepts (a tuple; ``NIL`` in it accepts nil), and ``lockless``: a getter of one field that runs
    without the device lock (so a CPU polling ``status`` or ``signaledValue`` never stalls the GPU thread)."""

    fn: Callable[..., Any]
    objects: tuple[tuple[Any, ...], ...]
    lockless: bool = False


class MethodTable:
    """The selectors simulated classes answer: per class, selector -> ``Method``. A class answers what it or a base
    class has in the table (Objective-C's inheritance)."""

    def __init__(self) -> None:
        self._methods: dict[type, dict[str, Method]] = {}
        self._resolved: dict[tuple[type, str], Method | None] = {}

    @classmethod
    def join(cls, *tables: MethodTable) -> MethodTable:
        """One table holding the methods of all ``tables``. Raises ``ValueError`` when two give the same class an
        answer to the same selector."""
        joined = cls()
        for table in tables:
            for owner, methods in table._methods.items():
                for selector, method in methods.items():
                    joined._add(owner, selector, method)
        return joined

    def add(self, cls: type, selector: str, fn: Callable[..., Any], *objects: type | tuple[Any, ...],
            lockless: bool = False) -> None:
        """``fn(device, receiver, *decoded_args)`` answers ``selector`` for ``cls``; ``objects`` gives, per ``id``
        argument, the accepted class or a tuple of classes (``NIL`` allows nil); ``lockless`` for one-field getters
        without arguments. Raises ``ValueError`` for a spec without a class first, or a selector ``cls`` already
        answers in this table."""
        specs = tuple(o if isinstance(o, tuple) else (o,) for o in objects)
        if any(spec[0] is None for spec in specs):
            raise ValueError(f"{selector}: name a class first in each argument spec, NIL after it")
        self._add(cls, selector, Method(fn, specs, lockless))

    def _add(self, cls: type, selector: str, method: Method) -> None:
        methods = self._methods.setdefault(cls, {})
        if selector in methods:
            raise ValueError(f"-[{cls.__name__} {selector}] is defined twice")
        methods[selector] = method
        self._resolved.clear()

    def method(self, cls: type, selector: str, *objects: type | tuple[Any, ...],
               lockless: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A decorator: ``add`` the decorated function as ``cls``'s answer to ``selector``."""
        def add(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(cls, selector, fn, *objects, lockless=lockless)
            return fn
        return add

    def lookup(self, cls: type, selector: str) -> Method | None:
        """The method ``cls`` (or a base class) answers ``selector`` with, or None."""
        key = (cls, selector)
        if key not in self._resolved:
            self._resolved[key] = next((m for k in cls.__mro__
                                        if (m := self._methods.get(k, {}).get(selector)) is not None), None)
        return self._resolved[key]


def check_prototype(selector: str, proto: Prototype, expected: Prototype, target: str) -> None:
    """Refuse a prototype that differs from ``expected`` with a ``BridgeError`` naming the selector and the
    first argument (1-based, self and _cmd not counted) that differs, and why it matters on ``target``."""
    if not isinstance(proto, Prototype):
        raise BridgeError(f"{selector}: the prototype must be a mtlir.metal.Prototype, got {type(proto).__name__}")
    if proto.ret is not expected.ret:
        raise BridgeError(f"{selector}: returns {expected.ret.name}, the call's prototype says {proto.ret.name}")
    if proto.args[:2] != (dtypes.id, dtypes.SEL):
        raise BridgeError(f"{selector}: an objc_msgSend prototype starts with (id self, SEL _cmd), got "
                          f"({', '.join(a.name for a in proto.args[:2])})")
    got, want = proto.args[2:], expected.args[2:]
    for i, (g, w) in enumerate(zip(got, want), start=1):
        if g is w:
            continue
        if w is _MTLSIZE_PTR and g is dtypes.MTLSize:
            raise BridgeError(f"{selector}: argument {i} is an MTLSize passed by value, but on arm64 a 24-byte "
                              "struct travels as a pointer to a copy in memory (AAPCS64)")
        if w is dtypes.MTLSize and g is _MTLSIZE_PTR:
            raise BridgeError(f"{selector}: argument {i} is a pointer to an MTLSize, but on x86_64 the 24 bytes "
                              "travel by value on the stack (System V class MEMORY), not as a pointer")
        if g is dtypes.NSRange:
            raise BridgeError(f"{selector}: argument {i} is an NSRange struct; it travels as two uint64 words "
                              "(location, length) on both targets")
        raise BridgeError(f"{selector}: argument {i} is {g.name} in the call's prototype, the selector takes "
                          f"{w.name} there (target {target})")
    if len(got) != len(want):
        raise BridgeError(f"{selector}: wrong argument count: the call's prototype has {len(got)} arguments "
                          f"after self and _cmd, the selector takes {len(want)} on {target}")


def decode_word(selector: str, i: int, dtype: DType, value: Any) -> int:
    """An integer argument checked against ``dtype`` (uint64, int64, bool, pointers): ``BridgeError`` when it is
    not an int or does not fit (a negative NSUInteger, a 65-bit value, a BOOL of 2)."""
    if isinstance(value, bool):
        value = int(value)
    if type(value) is not int:
        if not isinstance(value, int):
            raise BridgeError(f"{selector}: argument {i} ({dtype.name}) must be an integer, got {value!r}")
        value = int(value)
    lo, hi = dtypes.min(dtype), dtypes.max(dtype) if dtype.kind != "ptr" else _U64_MAX
    if not lo <= value <= hi:
        raise BridgeError(f"{selector}: argument {i} = {value} does not fit {dtype.name} [{lo}, {hi}]")
    return int(value)


def decode_size(selector: str, i: int, dtype: DType, value: Any, mem: HostMemory) -> tuple[int, int, int]:
    """An MTLSize argument as ``(width, height, depth)``: read through the pointer on arm64 (``dtype`` is
    ``MTLSize*``), taken from the tuple on x86_64. ``BridgeError`` for a tuple on arm64, an int on x86_64, an
    unmapped pointer or a component that does not fit NSUInteger."""
    if dtype is _MTLSIZE_PTR:
        if isinstance(value, (tuple, list)):
            raise BridgeError(f"{selector}: argument {i} is an MTLSize by value {tuple(value)}, but on arm64 it "
                              "must be a pointer to a 24-byte copy in host memory (AAPCS64)")
        addr = decode_word(selector, i, dtype, value)
        if addr == 0:
            raise BridgeError(f"{selector}: argument {i} is a NULL MTLSize pointer")
        try:
            size = mem.load(addr, dtypes.MTLSize)
        except BridgeError as e:
            raise BridgeError(f"{selector}: argument {i} (MTLSize*): {e}") from None
        return size  # type: ignore[no-any-return]
    if not isinstance(value, (tuple, list)):
        raise BridgeError(f"{selector}: argument {i} is {value!r}, but on x86_64 an MTLSize travels by value: a "
                          "tuple (width, height, depth), not a pointer")
    if len(value) != 3:
        raise BridgeError(f"{selector}: argument {i}: an MTLSize has 3 fields, got {len(value)}")
    w, h, d = (decode_word(selector, i, dtypes.uint64, v) for v in value)
    return (w, h, d)
