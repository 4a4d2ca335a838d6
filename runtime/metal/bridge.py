"""MetalBridge: the Bridge of docs/internals.md on the real Objective-C runtime (libobjc) and Metal, via ctypes.

Every call goes through one exact ctypes prototype per C signature, built once and cached: never variadic (Apple's
arm64 ABI passes variadic arguments on the stack, so a variadic ``objc_msgSend`` sends garbage), never without
argtypes (ctypes then cuts integers to 32 bits). How each dtype travels, the argument checks and the host memory
live in ``mtlir.runtime.metal.marshal`` (METAL.md §2, docs/metal-bridge.md); this module loads the libraries, resolves
selectors and classes, caches one call per prototype and answers the Bridge protocol.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
from collections.abc import Mapping
from typing import Any, Callable

from mtlir.ir.dtypes import dtypes
from mtlir.metal import C_FUNCTIONS, TARGETS, Prototype, abi_prototype
from mtlir.runtime.metal.marshal import (CSignature, ForeignCall, MTLSizeStruct, NativeMemory, Unfit, arg_names,
                                         checker, compile_fast, ctypes_signature, ret_kind)
from mtlir.errors import ArgumentError, BridgeError, NoDeviceError

__all__ = ["MetalBridge", "host_target", "metal_available", "library_paths", "DEFAULT_LIBOBJC", "DEFAULT_METAL",
           "DEFAULT_COREGRAPHICS", "LIBS_ENV", "NOT_AVAILABLE"]

DEFAULT_LIBOBJC = "/usr/lib/libobjc.A.dylib"
DEFAULT_METAL = "/System/Library/Frameworks/Metal.framework/Metal"
DEFAULT_COREGRAPHICS = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"
LIBS_ENV = "MTLIR_METAL_LIBS"
NOT_AVAILABLE = "MetalBridge needs macOS with Metal; use --device sim"
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


def library_paths(environ: Mapping[str, str] | None = None) -> tuple[str, str, str | None]:
    """The libraries a ``MetalBridge`` loads by default: ``(libobjc, Metal, CoreGraphics or None)``.

    macOS's (``DEFAULT_LIBOBJC``, ``DEFAULT_METAL``, ``DEFAULT_COREGRAPHICS``) unless the debug variable
    ``MTLIR_METAL_LIBS`` (``LIBS_ENV``) in ``environ`` (default ``os.environ``) names others as
    ``LIBOBJC:METAL[:COREGRAPHICS]``: then CoreGraphics is loaded only when given (the fake Metal of tests/native
    needs none). Raises ``ArgumentError`` for a value without both of the first two paths."""
    value = (os.environ if environ is None else environ).get(LIBS_ENV, "")
    if not value:
        return DEFAULT_LIBOBJC, DEFAULT_METAL, DEFAULT_COREGRAPHICS
    parts = value.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ArgumentError(f"{LIBS_ENV}={value!r}: expected LIBOBJC:METAL[:COREGRAPHICS] (library paths)")
    return parts[0], parts[1], (parts[2] or None) if len(parts) == 3 else None


# ---- the bridge ----

def _load(path: str, what: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise NoDeviceError(f"{NOT_AVAILABLE} (could not load {what} from {path!r}: {e})") from None


class MetalBridge(NativeMemory):
    """The Bridge protocol (runtime/bridge/bridge.py, docs/internals.md) on libobjc and Metal.framework through ctypes.

    ``target`` is the ABI the calls follow (default: this machine's, ``host_target()``); the library paths not
    given are ``library_paths()``'s: macOS's, or those of the debug variable ``MTLIR_METAL_LIBS`` (the fake Metal
    of tests/native over GNU's libobjc on Linux). CoreGraphics is loaded first (METAL.md §2: without it
    ``MTLCreateSystemDefaultDevice`` finds no device); ``coregraphics=None`` skips it. A bridge for a foreign
    target can build and show prototypes (``signature``) but refuses calls. Raises ``NoDeviceError`` with
    ``NOT_AVAILABLE`` when the libraries cannot be loaded (any machine but a Mac with default paths) or libobjc
    lacks ``objc_msgSend``, ``sel_registerName`` or ``objc_getClass``.
    Host memory (``malloc``, ``free``, ``read``, ``write``, ``load``, ``store``) is ``NativeMemory``'s."""

    def __init__(self, target: str | None = None, libobjc: str | None = None, metal: str | None = None,
                 coregraphics: str | None = DEFAULT_COREGRAPHICS) -> None:
        if libobjc is None or metal is None:
            env_objc, env_metal, env_cg = library_paths()
            libobjc, metal = libobjc or env_objc, metal or env_metal
            if coregraphics == DEFAULT_COREGRAPHICS:
                coregraphics = env_cg
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
                raise NoDeviceError(f"{NOT_AVAILABLE} ({libobjc!r} has no {sym})")
        self._msgsend_addr = ctypes.cast(self._objc.objc_msgSend, ctypes.c_void_p).value or 0
        self._sel_register = self._objc.sel_registerName
        self._sel_register.argtypes, self._sel_register.restype = [ctypes.c_char_p], ctypes.c_void_p
        self._get_class = self._objc.objc_getClass
        self._get_class.argtypes, self._get_class.restype = [ctypes.c_char_p], ctypes.c_void_p
        self._sels: dict[str, int] = {}
        self._sel_names: dict[int, str] = {}
        self._classes: dict[str, int] = {}
        self._msg_calls: dict[Prototype, ForeignCall] = {}
        self._c_calls: dict[tuple[str, Prototype], ForeignCall] = {}
        self._fast: dict[Any, Callable[[tuple[Any, ...]], Any]] = {}  # by id(proto): no hashing per call
        self._fast_keep: dict[Any, Prototype] = {}
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

    def _build(self, addr: int, proto: Prototype, name: str, message: bool) -> ForeignCall:
        if not self.native:
            raise BridgeError(f"{name}: this bridge is for target {self.target} but the machine's ABI is "
                              f"{host_target()}: the arguments would land in the wrong registers; it cannot call")
        sig = ctypes_signature(proto, self.target, name)
        fn = ctypes.CFUNCTYPE(sig.restype, *sig.argtypes)(addr)
        call = ForeignCall(fn, tuple(checker(a) for a in proto.args), ret_kind(proto.ret), name, proto)
        call.fast = compile_fast(call, lambda args: self._invoke(call, args, message))
        return call

    def _msg_call(self, proto: Prototype, name: str) -> ForeignCall:
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

    def _invoke(self, call: ForeignCall, args: tuple[Any, ...], message: bool) -> Any:
        """The slow path: check every argument against ``call``'s prototype, then call and convert the result.
        ``message``: an objc_msgSend, whose errors name the selector (``args[1]``) and its keyword."""
        conv: list[Any] = []
        try:
            if not isinstance(args, (tuple, list)) or len(args) != len(call.checks):
                raise Unfit("")
            for chk, v in zip(call.checks, args):
                conv.append(chk(v))
        except Unfit as e:
            raise self._unfit(call, args, len(conv), str(e), message) from None
        res = call.fn(*conv)
        kind = call.ret_kind
        if kind == "ptr":
            return res or 0
        if kind == "bool":
            return 1 if res & 0xFF else 0  # BOOL: the low byte only; the rest of x0/rax is undefined
        return res

    def _unfit(self, call: ForeignCall, args: Any, i: int, why: str, message: bool) -> BridgeError:
        if not isinstance(args, (tuple, list)):
            return BridgeError(f"{call.name}: arguments {args!r} are not a tuple")
        selector = self.selector_name(args[1]) if message and len(args) > 1 else None
        label = call.name if not message else f"objc_msgSend {selector!r}"
        if len(args) != len(call.checks):
            return BridgeError(f"{label}: {len(args)} arguments given, the prototype {call.proto!r} takes "
                               f"{len(call.checks)}")
        names = arg_names(selector, len(args)) if selector is not None else [f"#{k}" for k in range(len(args))]
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
        """An NSString (+0, autoreleased) holding ``s``: ``[NSString stringWithUTF8String:]``, which copies the
        bytes (Apple's documentation: "a string created by copying the data from a given C array"), so the C
        string lives only for the call (it was kept with the bridge for good: every MSL text, once per string).
        Raises ``BridgeError`` for a string with a NUL or a nil result."""
        if not isinstance(s, str) or "\0" in s:
            raise BridgeError(f"make_string: {s!r} is not a string without NUL characters")
        buf = ctypes.create_string_buffer(s.encode("utf-8"))  # alive until the call returns (a local)
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
    """True where the Metal libraries load and give a default device (for ``--device auto``): a Mac, or the
    libraries ``MTLIR_METAL_LIBS`` names; False anywhere else.

    Loads the libraries (``library_paths``) and calls ``MTLCreateSystemDefaultDevice`` once (the device is
    released); the answer is cached for the process."""
    if host_target() is None:
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
