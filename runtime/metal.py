"""MetalBridge: the Bridge of docs/internals.md on the real Objective-C runtime (libobjc) and Metal, via ctypes.

Every call goes through one exact ctypes prototype per C signature, built once and cached: never variadic (Apple's
arm64 ABI passes variadic arguments on the stack, so a variadic ``objc_msgSend`` sends garbage), never without
argtypes (ctypes then cuts integers to 32 bits). How each dtype travels (METAL.md §2, docs/metal-bridge.md):

| dtype | argument | return |
|---|---|---|
| id, SEL, pointers | ``c_void_p`` | ``c_void_p`` (NULL -> 0) |
| uint64 / int64 and smaller ints | ``c_uint64`` / ``c_int64`` ... | the same |
| BOOL | ``c_bool`` (arm64) / ``c_int8`` (x86_64: ``signed char``) | ``c_uint8``: the low byte only |
| double | ``c_double`` | ``c_double`` (d0 / xmm0) |
| MTLSize | arm64: ``c_void_p`` (a pointer to a copy); x86_64: a 24-byte Structure by value | never returned |
| NSRange | two ``c_uint64`` words (the abi pass splits it) | never returned |

Arguments are checked before the call, since ctypes would silently wrap them: a value that does not fit its
dtype (negative for an unsigned word, over 64 bits, a tuple for a pointer) raises ``BridgeError`` naming the
selector and the argument. Host memory is ctypes-owned and zeroed; the bridge keeps each block alive until freed.
"""
from __future__ import annotations

import ctypes
import functools
import operator
import platform
import struct
import sys
from dataclasses import dataclass
from typing import Any, Callable

from mtlir.dtypes import DType, PtrDType, StructDType, dtypes
from mtlir.metal import C_FUNCTIONS, SELECTORS, TARGETS, Prototype, abi_prototype
from mtlir.runtime.errors import BridgeError

__all__ = ["MetalBridge", "NativeMemory", "CSignature", "MTLSizeStruct", "ctypes_signature", "host_target",
           "metal_available", "DEFAULT_LIBOBJC", "DEFAULT_METAL", "DEFAULT_COREGRAPHICS", "NOT_AVAILABLE"]

DEFAULT_LIBOBJC = "/usr/lib/libobjc.A.dylib"
DEFAULT_METAL = "/System/Library/Frameworks/Metal.framework/Metal"
DEFAULT_COREGRAPHICS = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"
NOT_AVAILABLE = "MetalBridge needs macOS with Metal; use --device sim"
_U64_MAX = (1 << 64) - 1
_FAST_CACHE = 4096  # prototypes remembered by identity


def host_target() -> str | None:
    """This machine's ABI as a target name: ``"arm64"``, ``"x86_64"``, or None for any other machine.

    ``platform.machine()`` says ``arm64`` on Apple silicon (``aarch64`` on Linux) and ``x86_64`` on Intel (also
    under Rosetta, whose ABI is x86_64)."""
    machine = platform.machine().lower()
    if machine in ("arm64", "aarch64"):
        return "arm64"
    if machine in ("x86_64", "amd64"):
        return "x86_64"
    return None


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

class _Unfit(Exception):
    """An argument value that does not fit its dtype; the bridge turns it into a BridgeError with the call's name."""


def _as_int(v: Any) -> int:
    if isinstance(v, (float, complex, str, bytes, tuple, list)) or v is None:
        raise _Unfit(f"{v!r} is not an integer")
    try:
        return operator.index(v)
    except TypeError:
        raise _Unfit(f"{v!r} is not an integer") from None


def _int_checker(dt: DType) -> Callable[[Any], Any]:
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    unit = "a 64-bit address" if dt.kind in ("ptr", "id", "sel") else dt.name

    def check(v: Any) -> int:
        i = _as_int(v)
        if not lo <= i <= hi:
            raise _Unfit(f"{i:#x} does not fit {unit} ({lo} .. {hi:#x})" if i >= 0 else
                         f"{i} does not fit {unit} ({lo} .. {hi:#x})")
        return i
    return check


def _bool_check(v: Any) -> int:
    i = _as_int(v)
    if i not in (0, 1):
        raise _Unfit(f"{i} is not a BOOL (0 or 1)")
    return i


def _float_check(v: Any) -> float:
    if not isinstance(v, (int, float)):
        raise _Unfit(f"{v!r} is not a number")
    return float(v)


def _mtlsize_check(v: Any) -> MTLSizeStruct:
    if not isinstance(v, (tuple, list)) or len(v) != 3:
        raise _Unfit(f"{v!r} is not an MTLSize: expected a tuple (width, height, depth)")
    words = [_as_int(x) for x in v]
    for name, w in zip(MTLSizeStruct._fields_, words):
        if not 0 <= w <= _U64_MAX:
            raise _Unfit(f"MTLSize.{name[0]} = {w} does not fit an NSUInteger (0 .. 2**64-1)")
    return MTLSizeStruct(*words)


def _checker(dt: DType) -> Callable[[Any], Any]:
    if dt is dtypes.bool:
        return _bool_check
    if dt.kind == "float":
        return _float_check
    if dt is dtypes.MTLSize:
        return _mtlsize_check
    return _int_checker(dt)


def _arg_names(selector: str, nargs: int) -> list[str]:
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


class _Call:
    """One cached foreign function: the ctypes function, a check per argument (the slow, diagnosing path), the
    result kind, the call's name for errors, and ``fast``: the wrapper ``_compile_fast`` made for it."""

    __slots__ = ("fn", "checks", "ret_kind", "name", "proto", "fast")

    def __init__(self, fn: Any, checks: tuple[Callable[[Any], Any], ...], ret_kind: str, name: str,
                 proto: Prototype) -> None:
        self.fn, self.checks, self.ret_kind, self.name, self.proto = fn, checks, ret_kind, name, proto
        self.fast: Callable[[tuple[Any, ...]], Any] = self.fn


def _ret_kind(dt: DType) -> str:
    if dt is dtypes.void:
        return "void"
    if dt is dtypes.bool:
        return "bool"
    if isinstance(dt, PtrDType) or dt.kind in ("id", "sel"):
        return "ptr"
    return "plain"


_RETURNS = {"void": "None", "bool": "1 if r & 255 else 0", "ptr": "r or 0", "plain": "r"}


def _compile_fast(call: _Call, slow: Callable[[tuple[Any, ...]], Any]) -> Callable[[tuple[Any, ...]], Any]:
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
            conds += [f"0 <= {c}{i} <= {_U64_MAX:#x}" for c in "whd"]
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

    ``malloc`` blocks are 16-byte aligned and stay alive until ``free``. Addresses are Python ints; reads and
    writes may also target memory the bridge did not allocate (``contents`` of an MTLBuffer), so bounds are the
    caller's job; address 0, negative or over-64-bit addresses raise ``BridgeError``."""

    def __init__(self) -> None:
        self._blocks: dict[int, Any] = {}
        self._structs: dict[DType, struct.Struct] = {}

    @staticmethod
    def _addr(addr: Any, what: str) -> int:
        try:
            a = operator.index(addr)
        except TypeError:
            raise BridgeError(f"{what}: address {addr!r} is not an integer") from None
        if a == 0:
            raise BridgeError(f"{what}: address 0 (NULL)")
        if not 0 < a <= _U64_MAX:
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
        return addr

    def free(self, addr: int) -> None:
        """Give back a block from ``malloc``; raises ``BridgeError`` for any other address (or a second free)."""
        if self._blocks.pop(addr, None) is None:
            raise BridgeError(f"free: {addr:#x} is not a live block from this bridge's malloc" if isinstance(addr, int)
                              else f"free: {addr!r} is not an address")

    def read(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at ``addr``."""
        a = self._addr(addr, "read")
        if nbytes < 0:
            raise BridgeError(f"read at {a:#x}: negative size {nbytes}")
        return ctypes.string_at(a, nbytes)

    def write(self, addr: int, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` to ``addr``."""
        a = self._addr(addr, "write")
        raw = bytes(data)
        ctypes.memmove(a, raw, len(raw))

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
                    raise _Unfit(f"{value!r} is not a {dtype.name} ({', '.join(dtype.fields)})")
                words = [_int_checker(dtypes.uint64)(v) for v in value]
                raw = st.pack(*words)
            else:
                raw = st.pack(_checker(dtype)(value) if dtype is not dtypes.bool else bool(_bool_check(value)))
        except _Unfit as e:
            raise BridgeError(f"store {dtype.name} at {a:#x}: {e}") from None
        ctypes.memmove(a, raw, len(raw))


# ---- the bridge ----

def _load(path: str, what: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise BridgeError(f"{NOT_AVAILABLE} (could not load {what} from {path!r}: {e})") from None


class MetalBridge(NativeMemory):
    """The Bridge protocol (runtime/bridge.py, docs/internals.md) on libobjc and Metal.framework through ctypes.

    ``target`` is the ABI the calls follow (default: this machine's, ``host_target()``); the library paths
    default to macOS's (tests point them at a stand-in). CoreGraphics is loaded first (METAL.md §2: without it
    ``MTLCreateSystemDefaultDevice`` finds no device); ``coregraphics=None`` skips it. A bridge for a foreign
    target can build and show prototypes (``signature``) but refuses calls. Raises ``BridgeError`` with
    ``NOT_AVAILABLE`` when the libraries cannot be loaded (any machine but a Mac with default paths).
    Host memory (``malloc``, ``free``, ``read``, ``write``, ``load``, ``store``) is ``NativeMemory``'s."""

    def __init__(self, target: str | None = None, libobjc: str = DEFAULT_LIBOBJC, metal: str = DEFAULT_METAL,
                 coregraphics: str | None = DEFAULT_COREGRAPHICS) -> None:
        host = host_target()
        self.target: str = target if target is not None else (host or "")
        if self.target not in TARGETS:
            raise BridgeError(f"MetalBridge: unknown target {target!r} (this machine is {platform.machine()!r}): "
                              "expected arm64 or x86_64")
        self.native = self.target == host
        self._coregraphics = _load(coregraphics, "CoreGraphics") if coregraphics is not None else None
        self._objc = _load(libobjc, "libobjc")
        self._metal = _load(metal, "Metal")
        for sym in ("objc_msgSend", "sel_registerName", "objc_getClass"):
            if not hasattr(self._objc, sym):
                raise BridgeError(f"{NOT_AVAILABLE} ({libobjc!r} has no {sym})")
        self._msgsend_addr = ctypes.cast(self._objc.objc_msgSend, ctypes.c_void_p).value or 0
        self._sel_register = self._objc.sel_registerName
        self._sel_register.argtypes, self._sel_register.restype = [ctypes.c_char_p], ctypes.c_void_p
        self._get_class = self._objc.objc_getClass
        self._get_class.argtypes, self._get_class.restype = [ctypes.c_char_p], ctypes.c_void_p
        self._sels: dict[str, int] = {}
        self._sel_names: dict[int, str] = {}
        self._classes: dict[str, int] = {}
        self._msg_calls: dict[Prototype, _Call] = {}
        self._c_calls: dict[tuple[str, Prototype], _Call] = {}
        self._fast: dict[Any, Callable[[tuple[Any, ...]], Any]] = {}  # by id(proto): no hashing per call
        self._fast_keep: dict[Any, Prototype] = {}
        self._cstrings: list[Any] = []
        super().__init__()

    def __repr__(self) -> str:
        return f"MetalBridge(target={self.target!r}, libobjc={self._objc._name!r})"

    # -- names --

    def sel_registerName(self, name: str) -> int:
        """The SEL of ``name`` (interned by libobjc; cached here); raises ``BridgeError`` for a bad name."""
        sel = self._sels.get(name)
        if sel is None:
            if not isinstance(name, str) or not name or "\0" in name:
                raise BridgeError(f"sel_registerName: {name!r} is not a selector name")
            sel = self._sel_register(name.encode()) or 0
            if sel == 0:
                raise BridgeError(f"sel_registerName({name!r}) returned NULL")
            self._sels[name], self._sel_names[sel] = sel, name
        return sel

    def objc_getClass(self, name: str) -> int:
        """The class object named ``name``; raises ``BridgeError`` when libobjc has no such class."""
        cls = self._classes.get(name)
        if cls is None:
            if not isinstance(name, str) or "\0" in name:
                raise BridgeError(f"objc_getClass: {name!r} is not a class name")
            cls = self._get_class(name.encode()) or 0
            if cls == 0:
                raise BridgeError(f"objc_getClass: no Objective-C class named {name!r} (is its framework loaded?)")
            self._classes[name] = cls
        return cls

    def selector_name(self, sel: int) -> str:
        """The name of a SEL this bridge registered, else its hex value (for messages)."""
        return self._sel_names.get(sel, f"SEL {sel:#x}" if isinstance(sel, int) else repr(sel))

    # -- calls --

    def signature(self, proto: Prototype, name: str = "call") -> CSignature:
        """The ctypes argtypes/restype this bridge uses for ``proto`` on its target (``ctypes_signature``)."""
        return ctypes_signature(proto, self.target, name)

    def _build(self, addr: int, proto: Prototype, name: str, message: bool) -> _Call:
        if not self.native:
            raise BridgeError(f"{name}: this bridge is for target {self.target} but the machine's ABI is "
                              f"{host_target()}: the arguments would land in the wrong registers; it cannot call")
        sig = ctypes_signature(proto, self.target, name)
        fn = ctypes.CFUNCTYPE(sig.restype, *sig.argtypes)(addr)
        call = _Call(fn, tuple(_checker(a) for a in proto.args), _ret_kind(proto.ret), name, proto)
        call.fast = _compile_fast(call, lambda args: self._invoke(call, args, message))
        return call

    def _msg_call(self, proto: Prototype, name: str) -> _Call:
        call = self._msg_calls.get(proto)
        if call is None:
            call = self._msg_calls[proto] = self._build(self._msgsend_addr, proto, name, True)
        return call

    def function(self, proto: Prototype, name: str = "objc_msgSend") -> Any:
        """The cached ctypes function of ``objc_msgSend`` with exactly ``proto`` (its ``argtypes`` and
        ``restype`` show the marshalling); raises ``BridgeError`` when ``proto`` cannot travel on this target."""
        return self._msg_call(proto, name).fn

    def caller(self, proto: Prototype, name: str = "objc_msgSend") -> Callable[[tuple[Any, ...]], Any]:
        """The function ``msg_send(proto, args)`` uses: ``caller(proto)(args)`` does the same checks and call
        without one Python call layer (for a replay loop that resolves its prototypes once)."""
        return self._msg_call(proto, name).fast

    def _invoke(self, call: _Call, args: tuple[Any, ...], message: bool) -> Any:
        """The slow path: check every argument against ``call``'s prototype, then call and convert the result.
        ``message``: an objc_msgSend, whose errors name the selector (``args[1]``) and its keyword."""
        conv: list[Any] = []
        try:
            if not isinstance(args, (tuple, list)) or len(args) != len(call.checks):
                raise _Unfit("")
            for chk, v in zip(call.checks, args):
                conv.append(chk(v))
        except _Unfit as e:
            raise self._unfit(call, args, len(conv), str(e), message) from None
        res = call.fn(*conv)
        kind = call.ret_kind
        if kind == "ptr":
            return res or 0
        if kind == "bool":
            return 1 if res & 0xFF else 0  # BOOL: the low byte only; the rest of x0/rax is undefined
        return res

    def _unfit(self, call: _Call, args: Any, i: int, why: str, message: bool) -> BridgeError:
        if not isinstance(args, (tuple, list)):
            return BridgeError(f"{call.name}: arguments {args!r} are not a tuple")
        selector = self.selector_name(args[1]) if message and len(args) > 1 else None
        label = call.name if not message else f"objc_msgSend {selector!r}"
        if len(args) != len(call.checks):
            return BridgeError(f"{label}: {len(args)} arguments given, the prototype {call.proto!r} takes "
                               f"{len(call.checks)}")
        names = _arg_names(selector, len(args)) if selector is not None else [f"#{k}" for k in range(len(args))]
        return BridgeError(f"{label}: argument {i} {names[i]!r} ({call.proto.args[i].name}): {why}")

    def _remember(self, key: Any, proto: Prototype, fast: Callable[[tuple[Any, ...]], Any]) -> None:
        """Cache ``fast`` under the identity of ``proto`` (kept alive with it, so the id is never reused);
        bounded, for callers that build a new Prototype per call."""
        if len(self._fast) >= _FAST_CACHE:
            self._fast.clear()
            self._fast_keep.clear()
        self._fast[key] = fast
        self._fast_keep[key] = proto

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """``objc_msgSend(receiver, SEL, ...)`` through exactly ``proto`` (``abi_prototype`` of the selector).

        ``args[0]`` is the receiver, ``args[1]`` the SEL, the rest follow ``proto.args[2:]``: ints for words,
        floats for doubles, a 3-tuple for an MTLSize by value (x86_64). Returns an int (id, pointer, integer,
        BOOL as 0/1), a float (double) or None (void). Raises ``BridgeError`` naming the selector and the
        argument when a value does not fit, or when the prototype cannot travel on this target."""
        fast = self._fast.get(id(proto))
        if fast is None:
            sel = args[1] if isinstance(args, (tuple, list)) and len(args) > 1 else None
            fast = self._msg_call(proto, f"objc_msgSend {self.selector_name(sel)!r}" if sel is not None
                                  else "objc_msgSend").fast
            self._remember(id(proto), proto, fast)
        return fast(args)

    def c_call(self, fn: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """Call the C function ``fn`` (looked up in Metal, libobjc, CoreGraphics) through ``proto``.

        ``objc_msgSend`` goes to ``msg_send``. A function of ``mtlir.metal.C_FUNCTIONS`` must be called with its
        table prototype. Raises ``BridgeError`` for an unknown symbol, a prototype mismatch or an unfit argument."""
        if fn == "objc_msgSend":
            return self.msg_send(proto, args)
        fast = self._fast.get((fn, id(proto)))
        if fast is None:
            call = self._c_calls.get((fn, proto))
            if call is None:
                want = C_FUNCTIONS.get(fn)
                if want is not None and want != proto:
                    raise BridgeError(f"{fn}: prototype {proto!r} differs from the C function's {want!r}")
                addr = 0
                for lib in (self._metal, self._objc, self._coregraphics):
                    if lib is not None and hasattr(lib, fn):
                        addr = ctypes.cast(getattr(lib, fn), ctypes.c_void_p).value or 0
                        break
                if addr == 0:
                    raise BridgeError(f"C function {fn!r} is in none of the loaded libraries")
                call = self._c_calls[(fn, proto)] = self._build(addr, proto, fn, False)
            fast = call.fast
            self._remember((fn, id(proto)), proto, fast)
        return fast(args)

    # -- strings --

    def make_string(self, s: str) -> int:
        """An NSString (+0, autoreleased) holding ``s``: ``[NSString stringWithUTF8String:]``; the C string is
        kept alive with the bridge. Raises ``BridgeError`` for a string with a NUL or a nil result."""
        if not isinstance(s, str) or "\0" in s:
            raise BridgeError(f"make_string: {s!r} is not a string without NUL characters")
        buf = ctypes.create_string_buffer(s.encode("utf-8"))
        self._cstrings.append(buf)
        sel = self.sel_registerName("stringWithUTF8String:")
        proto = abi_prototype("stringWithUTF8String:", self.target)
        obj = self.msg_send(proto, (self.objc_getClass("NSString"), sel, ctypes.addressof(buf)))
        if obj == 0:
            raise BridgeError(f"make_string: stringWithUTF8String: returned nil for {s[:40]!r}")
        return int(obj)

    def read_cstring(self, addr: int) -> str:
        """The NUL-terminated UTF-8 string at ``addr`` (invalid bytes replaced); raises ``BridgeError`` for 0."""
        a = NativeMemory._addr(addr, "read_cstring")
        return ctypes.string_at(a).decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=1)
def metal_available() -> bool:
    """True on a Mac whose Metal gives a default device (for ``--device auto``); False anywhere else.

    Loads the libraries and calls ``MTLCreateSystemDefaultDevice`` once (the device is released); the answer is
    cached for the process."""
    if sys.platform != "darwin" or host_target() is None:
        return False
    try:
        bridge = MetalBridge()
        proto = C_FUNCTIONS["MTLCreateSystemDefaultDevice"]
        device = bridge.c_call("MTLCreateSystemDefaultDevice", proto, ())
        if not device:
            return False
        release = Prototype(dtypes.void, (dtypes.id, dtypes.SEL))
        bridge.msg_send(release, (device, bridge.sel_registerName("release")))
        return True
    except BridgeError:
        return False
