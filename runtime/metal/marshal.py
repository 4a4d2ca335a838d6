"""How values cross into C through ctypes: the exact prototype of each call, the checks ctypes does not make,
and host memory. ``MetalBridge`` (``mtlir.runtime.metal.bridge``) is built on it; nothing here needs macOS.

| dtype | argument | return |
|---|---|---|
| id, SEL, pointers | ``c_void_p`` | ``c_void_p`` (NULL -> 0) |
| uint64 / int64 and smaller ints | ``c_uint64`` / ``c_int64`` ... | the same |
| BOOL | ``c_bool`` (arm64) / ``c_int8`` (x86_64: ``signed char``) | ``c_uint8``: the low byte only |
| double | ``c_double`` | ``c_double`` (d0 / xmm0) |
| MTLSize | arm64: ``c_void_p`` (a pointer to a copy); x86_64: a 24-byte Structure by value | never returned |
| NSRange | two ``c_uint64`` words (the abi pass splits it) | never returned |

``ctypes_signature(proto, target)`` computes the table for either target on any machine. ctypes wraps integers
silently (``c_uint64(-1)`` is 2**64-1), so every argument is checked against its dtype first: ``checker`` per
dtype (the slow path that explains), ``compile_fast`` per prototype (chained comparisons, then ctypes converts).
``NativeMemory`` is zeroed, ctypes-owned host memory with typed loads and stores at any address.
"""
from __future__ import annotations

import bisect
import ctypes
import functools
import operator
import struct
from dataclasses import dataclass
from typing import Any, Callable

from mtlir.ir.dtypes import DType, PtrDType, StructDType, dtypes
from mtlir.metal import SELECTORS, TARGETS, Prototype
from mtlir.errors import BridgeError, MtlirError

__all__ = ["MTLSizeStruct", "CSignature", "ctypes_signature", "NativeMemory", "ForeignCall", "Unfit", "checker",
           "compile_fast", "arg_names", "ret_kind", "U64_MAX"]

U64_MAX = (1 << 64) - 1


class MTLSizeStruct(ctypes.Structure):
    """``MTLSize {NSUInteger width, height, depth}``: 24 bytes (Apple's Metal headers), passed by value on x86_64
    (System V class MEMORY: copied onto the stack)."""

    _fields_ = [("width", ctypes.c_uint64), ("height", ctypes.c_uint64), ("depth", ctypes.c_uint64)]


_SCALAR_CTYPES: dict[DType, Any] = {
    dtypes.int8: ctypes.c_int8, dtypes.int16: ctypes.c_int16, dtypes.int32: ctypes.c_int32,
    dtypes.int64: ctypes.c_int64, dtypes.uint8: ctypes.c_uint8, dtypes.uint16: ctypes.c_uint16,
    dtypes.uint32: ctypes.c_uint32, dtypes.uint64: ctypes.c_uint64,
    dtypes.float32: ctypes.c_float, dtypes.float64: ctypes.c_double,
    dtypes.id: ctypes.c_void_p, dtypes.SEL: ctypes.c_void_p,
}


@dataclass(frozen=True)
class CSignature:
    """The ctypes form of one Prototype on one target: ``restype`` (None for void) and ``argtypes``."""

    restype: Any
    argtypes: tuple[Any, ...]


def _ctype(dt: DType, target: str, where: str, ret: bool) -> Any:
    """The ctypes type of ``dt`` as an argument (``ret`` False) or a result; raises ``BridgeError``."""
    if isinstance(dt, PtrDType):
        return ctypes.c_void_p
    if dt is dtypes.void:
        if ret:
            return None
        raise BridgeError(f"{where}: void is not an argument type")
    if dt is dtypes.bool:
        # BOOL is C bool on arm64 and signed char on x86_64 (objc.h); a result is read from the low byte only.
        return ctypes.c_uint8 if ret else (ctypes.c_bool if target == "arm64" else ctypes.c_int8)
    if dt is dtypes.MTLSize:
        if ret:
            raise BridgeError(f"{where}: no selector returns an MTLSize (it would need objc_msgSend_stret on x86_64)")
        if target == "arm64":
            raise BridgeError(f"{where}: MTLSize by value on arm64: AAPCS64 passes composites over 16 bytes by "
                              "reference, so the abi pass must hand a pointer to a copy (MTLSize*)")
        return MTLSizeStruct
    if dt is dtypes.NSRange:
        raise BridgeError(f"{where}: NSRange by value: it travels as two uint64 words (abi_prototype splits it)")
    ct = _SCALAR_CTYPES.get(dt)
    if ct is None:
        raise BridgeError(f"{where}: dtype {dt.name} has no C calling convention here")
    return ct


@functools.lru_cache(maxsize=None)
def ctypes_signature(proto: Prototype, target: str, name: str = "call") -> CSignature:
    """The exact ctypes ``restype`` and ``argtypes`` of ``proto`` on ``target`` (``"arm64"`` or ``"x86_64"``).

    The table in this module's docstring (METAL.md §2). ``name`` (a selector or C function) only names the call in
    errors. Raises ``BridgeError`` for an unknown target or a dtype that cannot travel as given (MTLSize by value
    on arm64, NSRange by value, a void argument, a struct result)."""
    if target not in TARGETS:
        raise BridgeError(f"{name}: unknown target {target!r}: expected arm64 or x86_64")
    restype = _ctype(proto.ret, target, f"{name}: result", ret=True)
    argtypes = tuple(_ctype(a, target, f"{name}: argument {i}", ret=False) for i, a in enumerate(proto.args))
    return CSignature(restype, argtypes)


# ---- argument checks: ctypes wraps silently, so every value is checked against its dtype before the call ----

class Unfit(MtlirError):
    """An argument value that does not fit its dtype; the bridge turns it into a BridgeError with the call's name."""


def _as_int(v: Any) -> int:
    if isinstance(v, (float, complex, str, bytes, tuple, list)) or v is None:
        raise Unfit(f"{v!r} is not an integer")
    try:
        return operator.index(v)
    except TypeError:
        raise Unfit(f"{v!r} is not an integer") from None


def _int_checker(dt: DType) -> Callable[[Any], Any]:
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    unit = "a 64-bit address" if dt.kind in ("ptr", "id", "sel") else dt.name

    def check(v: Any) -> int:
        i = _as_int(v)
        if not lo <= i <= hi:
            raise Unfit(f"{i:#x} does not fit {unit} ({lo} .. {hi:#x})" if i >= 0 else
                         f"{i} does not fit {unit} ({lo} .. {hi:#x})")
        return i
    return check


def _bool_check(v: Any) -> int:
    i = _as_int(v)
    if i not in (0, 1):
        raise Unfit(f"{i} is not a BOOL (0 or 1)")
    return i


def _float_check(v: Any) -> float:
    if not isinstance(v, (int, float)):
        raise Unfit(f"{v!r} is not a number")
    return float(v)


def _mtlsize_check(v: Any) -> MTLSizeStruct:
    if not isinstance(v, (tuple, list)) or len(v) != 3:
        raise Unfit(f"{v!r} is not an MTLSize: expected a tuple (width, height, depth)")
    words = [_as_int(x) for x in v]
    for name, w in zip(MTLSizeStruct._fields_, words):
        if not 0 <= w <= U64_MAX:
            raise Unfit(f"MTLSize.{name[0]} = {w} does not fit an NSUInteger (0 .. 2**64-1)")
    return MTLSizeStruct(*words)


def checker(dt: DType) -> Callable[[Any], Any]:
    if dt is dtypes.bool:
        return _bool_check
    if dt.kind == "float":
        return _float_check
    if dt is dtypes.MTLSize:
        return _mtlsize_check
    return _int_checker(dt)


def arg_names(selector: str, nargs: int) -> list[str]:
    """Readable names of objc_msgSend's arguments: self, _cmd, then the selector's keywords (NSRange's two words
    as ``withRange:.location`` / ``.length``); plain indices when the selector's table entry does not line up."""
    names = ["self", "_cmd"]
    sig = SELECTORS.get(selector)
    keywords = [k + ":" for k in selector.split(":")[:-1]]
    if sig is not None and len(keywords) == len(sig.args):
        for kw, a in zip(keywords, sig.args):
            names += [f"{kw}.location", f"{kw}.length"] if a is dtypes.NSRange else [kw]
    if len(names) != nargs:
        names = ["self", "_cmd"] + [f"#{i}" for i in range(2, nargs)]
    return names


class ForeignCall:
    """One cached foreign function: the ctypes function, a check per argument (the slow, diagnosing path), the
    result kind, the call's name for errors, and ``fast``: the wrapper ``compile_fast`` made for it."""

    __slots__ = ("fn", "checks", "ret_kind", "name", "proto", "fast")

    def __init__(self, fn: Any, checks: tuple[Callable[[Any], Any], ...], ret_kind: str, name: str,
                 proto: Prototype) -> None:
        self.fn, self.checks, self.ret_kind, self.name, self.proto = fn, checks, ret_kind, name, proto
        self.fast: Callable[[tuple[Any, ...]], Any] = self.fn


def ret_kind(dt: DType) -> str:
    if dt is dtypes.void:
        return "void"
    if dt is dtypes.bool:
        return "bool"
    if isinstance(dt, PtrDType) or dt.kind in ("id", "sel"):
        return "ptr"
    return "plain"


_RETURNS = {"void": "None", "bool": "1 if r & 255 else 0", "ptr": "r or 0", "plain": "r"}


def compile_fast(call: ForeignCall, slow: Callable[[tuple[Any, ...]], Any]) -> Callable[[tuple[Any, ...]], Any]:
    """A wrapper specialised to ``call``'s prototype that checks the arguments with chained comparisons and lets
    ctypes convert them; anything it does not accept outright (a wrong count, a non-integer, a value out of range)
    goes to ``slow``, which diagnoses it (``BridgeError``) or converts it (numpy integers).

    For ``uint64 (id, SEL, uint64, MTLSize)`` on x86_64 it is, in effect::

        def fast(args):
            try:
                a0, a1, a2, a3 = args
                w3, h3, d3 = a3
                if 0 <= a0 <= 0xffffffffffffffff and ... and 0 <= d3 <= 0xffffffffffffffff:
                    r = fn(a0, a1, a2, S(w3, h3, d3))
                else:
                    return slow(args)
            except (TypeError, ValueError, ArgumentError):
                return slow(args)
            return r
    """
    params, pre, conds = [], [], []
    for i, dt in enumerate(call.proto.args):
        if dt is dtypes.MTLSize:
            pre.append(f"w{i}, h{i}, d{i} = a{i}")
            conds += [f"0 <= {c}{i} <= {U64_MAX:#x}" for c in "whd"]
            params.append(f"S(w{i}, h{i}, d{i})")
        elif dt.kind == "float":
            params.append(f"a{i}")  # ctypes takes ints and floats for a double and refuses anything else
        else:
            conds.append(f"{dtypes.min(dt)} <= a{i} <= {dtypes.max(dt):#x}")
            params.append(f"a{i}")
    unpack = "".join(f"a{i}, " for i in range(len(params)))
    lines = ["def fast(args):", "    try:",
             f"        ({unpack}) = args",
             *(f"        {p}" for p in pre),
             f"        if {' and '.join(conds) or 'True'}:",
             f"            r = fn({', '.join(params)})",
             "        else:",
             "            return slow(args)",
             "    except (TypeError, ValueError, ArgumentError):",
             "        return slow(args)",
             f"    return {_RETURNS[call.ret_kind]}"]
    namespace: dict[str, Any] = {"fn": call.fn, "slow": slow, "S": MTLSizeStruct,
                                 "ArgumentError": ctypes.ArgumentError}
    exec(compile("\n".join(lines), f"<mtlir fast call {call.name}>", "exec"), namespace)
    fast: Callable[[tuple[Any, ...]], Any] = namespace["fast"]
    return fast


# ---- host memory ----

class NativeMemory:
    """Zeroed host memory owned by ctypes, and typed loads and stores at any host address.

    ``malloc`` blocks are 16-byte aligned and stay alive until ``free``. Addresses are Python ints; address 0,
    negative or over-64-bit addresses raise ``BridgeError``. A ``read``/``write`` that starts inside a ``malloc``
    block must end inside the size asked for (``BridgeError`` before any byte moves). Anywhere else (``contents``
    of an MTLBuffer, whose length the bridge is not told) the memory is not the bridge's and bounds are the
    caller's job: ``DeviceContext`` and a linked Program's ``read_buffer``/``write_buffer`` check theirs in bytes."""

    def __init__(self) -> None:
        self._blocks: dict[int, Any] = {}
        self._sizes: dict[int, tuple[int, int]] = {}  # block start -> (the size asked for, the bytes it spans)
        self._starts: list[int] = []  # the live blocks' starts, sorted (bisect finds the block of an address)
        self._structs: dict[DType, struct.Struct] = {}

    @staticmethod
    def _addr(addr: Any, what: str) -> int:
        try:
            a = operator.index(addr)
        except TypeError:
            raise BridgeError(f"{what}: address {addr!r} is not an integer") from None
        if a == 0:
            raise BridgeError(f"{what}: address 0 (NULL)")
        if not 0 < a <= U64_MAX:
            raise BridgeError(f"{what}: address {a:#x} is not a 64-bit address")
        return a

    def malloc(self, nbytes: int) -> int:
        """``nbytes`` zeroed bytes (at least one 16-byte unit, so every block has its own address); raises
        ``BridgeError`` for a negative size."""
        try:
            n = operator.index(nbytes)
        except TypeError:
            raise BridgeError(f"malloc: size {nbytes!r} is not an integer") from None
        if n < 0:
            raise BridgeError(f"malloc: negative size {n}")
        words = 2 * max(1, -(-n // 16))
        block = (ctypes.c_uint64 * words)()
        addr = ctypes.addressof(block)
        if addr % 16:  # ctypes arrays are 8-byte aligned at least: take one word more and step to 16
            block = (ctypes.c_uint64 * (words + 1))()
            addr = ctypes.addressof(block)
            addr += -addr % 16
        self._blocks[addr] = block
        self._sizes[addr] = (n, 16 * max(1, -(-n // 16)))
        bisect.insort(self._starts, addr)
        return addr

    def free(self, addr: int) -> None:
        """Give back a block from ``malloc``; raises ``BridgeError`` for any other address (or a second free)."""
        if self._blocks.pop(addr, None) is None:
            raise BridgeError(f"free: {addr:#x} is not a live block from this bridge's malloc" if isinstance(addr, int)
                              else f"free: {addr!r} is not an address")
        del self._sizes[addr]
        del self._starts[bisect.bisect_left(self._starts, addr)]

    def _past(self, a: int, nbytes: int, start: int, what: str) -> BridgeError:
        """The error of a ``what`` of ``[a, a + nbytes)`` that starts in the malloc block at ``start`` and runs
        past the size asked for it (it would overwrite or read the memory after the block)."""
        return BridgeError(f"{what}: {nbytes} bytes at {a:#x} run past the end of the malloc block of "
                           f"{self._sizes[start][0]} bytes at {start:#x}")

    @staticmethod
    def _count(nbytes: Any, a: int) -> int:
        """``nbytes`` of a read at ``a`` as an int >= 0, else ``BridgeError``."""
        if type(nbytes) is int and nbytes >= 0:
            return nbytes
        try:
            n = operator.index(nbytes) if not isinstance(nbytes, bool) else None
        except TypeError:
            n = None
        if n is None:
            raise BridgeError(f"read at {a:#x}: size {nbytes!r} is not an integer")
        if n < 0:
            raise BridgeError(f"read at {a:#x}: negative size {n}")
        return n

    def read(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at ``addr``. Raises ``BridgeError`` for a bad address, a size that is not an int >= 0,
        or a range that starts in a ``malloc`` block and runs past it."""
        a = self._addr(addr, "read")
        n = self._count(nbytes, a)
        starts = self._starts
        i = bisect.bisect_right(starts, a)
        if i:  # inside a malloc block (its span): the range must end inside the size asked for
            start = starts[i - 1]
            size, span = self._sizes[start]
            if a < start + span and a + n > start + size:
                raise self._past(a, n, start, "read")
        return ctypes.string_at(a, n)

    def write(self, addr: int, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` (its bytes, in C order: a memoryview of float32 is 4 bytes an element) to ``addr``. Raises
        ``BridgeError`` for a bad address, data without the buffer protocol (a str, an int), or a range that starts
        in a ``malloc`` block and runs past it."""
        a = self._addr(addr, "write")
        if type(data) is bytes:
            raw = data
        else:
            try:
                raw = memoryview(data).tobytes()
            except TypeError:
                raise BridgeError(f"write at {a:#x}: data is {type(data).__name__}, not bytes-like") from None
        n = len(raw)
        starts = self._starts
        i = bisect.bisect_right(starts, a)
        if i:  # as read's
            start = starts[i - 1]
            size, span = self._sizes[start]
            if a < start + span and a + n > start + size:
                raise self._past(a, n, start, "write")
        ctypes.memmove(a, raw, n)

    def _struct(self, dt: DType) -> struct.Struct:
        st = self._structs.get(dt)
        if st is None:
            if not dt.fmt or dt.itemsize == 0:
                raise BridgeError(f"no host value of dtype {dt.name}")
            st = self._structs[dt] = struct.Struct("<" + dt.fmt)
        return st

    def load(self, addr: int, dtype: DType) -> Any:
        """One ``dtype`` value at ``addr``: an int (bool as 0/1), a float, or a tuple for MTLSize/NSRange."""
        a = self._addr(addr, f"load {dtype.name}")
        st = self._struct(dtype)
        vals = st.unpack(ctypes.string_at(a, st.size))
        if isinstance(dtype, StructDType):
            return vals
        return int(vals[0]) if dtype is dtypes.bool else vals[0]

    def store(self, addr: int, dtype: DType, value: Any) -> None:
        """Write one ``dtype`` value at ``addr``; raises ``BridgeError`` when ``value`` does not fit ``dtype``."""
        a = self._addr(addr, f"store {dtype.name}")
        st = self._struct(dtype)
        try:
            if isinstance(dtype, StructDType):
                if not isinstance(value, (tuple, list)) or len(value) != len(dtype.fields):
                    raise Unfit(f"{value!r} is not a {dtype.name} ({', '.join(dtype.fields)})")
                words = [_int_checker(dtypes.uint64)(v) for v in value]
                raw = st.pack(*words)
            else:
                raw = st.pack(checker(dtype)(value) if dtype is not dtypes.bool else bool(_bool_check(value)))
        except Unfit as e:
            raise BridgeError(f"store {dtype.name} at {a:#x}: {e}") from None
        ctypes.memmove(a, raw, len(raw))
