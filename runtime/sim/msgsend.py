"""How the simulated objc_msgSend checks and decodes what the abi pass produced.

``msg_send(proto, (receiver, sel, *args))`` must use exactly ``abi_prototype(selector, target)``
(mtlir.metal): NSRange as two uint64 words on both targets; MTLSize as a pointer to a 24-byte copy in host memory
on arm64 (AAPCS64: composites over 16 bytes go by reference) and as a tuple of three ints by value on x86_64
(System V class MEMORY). Anything else is refused with a ``BridgeError`` naming the selector and the argument —
the refusal real hardware would turn into garbage registers.

A ``MethodTable`` says which selectors each simulated class answers and which classes its object arguments must
have: each module of ``methods`` fills its own with the ``method`` decorator, and the device joins them into one
(``device.METHODS``). ``ArgumentDecoder`` decodes one selector's arguments on one target (built once per selector,
its fast path the common case), ``result_value`` what the call returns.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mtlir.ir.dtypes import DType, PtrDType, dtypes
from mtlir.metal import Prototype
from mtlir.errors import BridgeError
from mtlir.runtime.bridge.memory import HostMemory
from mtlir.runtime.sim.objects import SimObject

__all__ = ["Method", "MethodTable", "ArgumentDecoder", "check_prototype", "compile_call", "compile_send", "decode_word",
           "decode_size", "result_value", "NIL"]

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


_WORD, _ID, _SIZE, _FLOAT = range(4)


class ArgumentDecoder:
    """The argument decoder of one selector on one target, computed once: the prototype, the argument count (self
    and _cmd included) and per argument its kind, dtype and integer bounds (``SimDevice.msg_send`` keeps one per
    selector)."""

    __slots__ = ("proto", "nargs", "kinds", "dtypes", "lo", "hi", "seen", "held")

    def __init__(self, proto: Prototype) -> None:
        self.proto, self.nargs = proto, len(proto.args)
        # the ids of prototype objects found equal to ``proto`` (``held`` keeps them alive, so no id is reused)
        self.seen: set[int] = {id(proto)}
        self.held: list[Prototype] = [proto]
        args = proto.args[2:]
        self.dtypes = args
        self.kinds = tuple(_ID if dt is dtypes.id else _SIZE if dt is _MTLSIZE_PTR or dt is dtypes.MTLSize
                           else _FLOAT if dt.kind == "float" else _WORD for dt in args)
        self.lo = tuple(dtypes.min(dt) if k == _WORD else 0 for dt, k in zip(args, self.kinds))
        self.hi = tuple((dtypes.max(dt) if dt.kind != "ptr" else (1 << 64) - 1) if k == _WORD else 0
                        for dt, k in zip(args, self.kinds))

    def decode(self, name: str, args: tuple[Any, ...], method: Method, objects: Mapping[int, SimObject],
               lookup: Callable[[Any, str], SimObject], mem: HostMemory) -> list[Any]:
        """The arguments of selector ``name`` after self and _cmd, checked and decoded (the fast path for the common
        case: an int that fits, a live object of an accepted class; anything else gets the full check and its
        error). ``objects``: the device's live objects by handle; ``lookup``: the device's look-up that names a
        dead or unknown handle (``BridgeError``); ``mem``: host memory, where arm64's MTLSize pointers point."""
        out: list[Any] = []
        specs = iter(method.objects)
        columns = zip(self.kinds, self.dtypes, self.lo, self.hi, args[2:])
        for i, (kind, dt, lo, hi, value) in enumerate(columns, start=1):
            if kind == _WORD:
                if type(value) is int and lo <= value <= hi:
                    out.append(value)
                else:
                    out.append(decode_word(name, i, dt, value))
            elif kind == _ID:
                spec = next(specs, (SimObject,))
                obj = objects.get(value) if type(value) is int else None
                if obj is not None and isinstance(obj, spec[0]):
                    out.append(obj)
                else:
                    out.append(_arg_object(name, i, value, spec, lookup))
            elif kind == _SIZE:
                if type(value) is tuple and dt is dtypes.MTLSize and len(value) == 3 \
                        and all(type(v) is int and 0 <= v <= _U64_MAX for v in value):
                    out.append(value)  # x86_64's by-value MTLSize of three NSUIntegers: nothing to convert
                else:
                    out.append(decode_size(name, i, dt, value, mem))
            else:
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise BridgeError(f"{name}: argument {i} ({dt.name}) must be a number, got {value!r}")
                out.append(float(value))
        return out


_BUILTINS = {"int": int, "tuple": tuple, "float": float, "type": type, "isinstance": isinstance, "len": len,
             "SimObject": SimObject}


def _fast_type(ret: DType) -> type | None:
    """The Python type a method's result already has when ``result_value`` would return it unchanged through
    ``ret``: int for integer and pointer returns, float for a double; None for void and BOOL (converted)."""
    if ret is dtypes.void or ret.kind == "bool":
        return None
    return float if ret.kind == "float" else int


RouteCall = Callable[[Any, SimObject, tuple[Any, ...]], Any]  # a route's generated call: (device, receiver, args)


def compile_call(name: str, method: Method, decoder: ArgumentDecoder, objects: Mapping[int, SimObject],
                 lookup: Callable[[Any, str], SimObject], mem: HostMemory) -> RouteCall:
    """``call(device, receiver, args)``: ``method`` for selector ``name`` on already checked ``args`` (self, _cmd and
    the arguments), its arguments decoded and its result converted as ``ArgumentDecoder.decode`` and
    ``result_value`` do, in one generated function per (selector, class) (``SimDevice.msg_send``'s fast path: a
    message costs ~1 µs of Python, and the generic decoding loop was a good part of it). The common case is
    inline (an int that fits, a live object of an accepted class, an x86_64 MTLSize of three ints, a number for a
    float); anything else takes ``decode``, which raises its errors. ``objects``, ``lookup`` and ``mem`` are the
    device's (its object table, its look-up of a bad handle, its host memory)."""
    slow = _slow_call(name, method, decoder, objects, lookup, mem)
    env: dict[str, Any] = {"get": objects.get, "result_value": result_value, "RET": decoder.proto.ret,
                           "FAST": _fast_type(decoder.proto.ret), **_BUILTINS}
    body = _decode_lines(decoder, env, "    ")
    if body is None:  # arm64's MTLSize pointer: read from host memory, with its errors
        return slow
    _bind_method(env, method, slow)
    exec("\n".join(["def call(dev, obj, args):"] + body), env)  # noqa: S102 (from the decoder's kinds alone)
    return env["call"]  # type: ignore[no-any-return]


def compile_send(name: str, decoder: ArgumentDecoder, dev: Any, other: Callable[[tuple[Any, ...]], Any],
                 full: Callable[[Any, tuple[Any, ...]], Any], getter_sel: Any = None) -> tuple[
                     Callable[[Any], Any], Callable[[type, Method], None]] | None:
    """``(send, specialize)``: a generated ``send(args)`` for messages of selector ``name`` through the prototype
    object ``decoder.proto`` stands for (``SimDevice.sender``), with msg_send's fast path, the receiver check under
    the device lock and the arguments' decoding in one function, once ``specialize(cls, method)`` has named the
    receiver class it is for (a lockless getter runs without the lock, starting a GPU a host may be polling, as
    msg_send does); until then, and for a receiver of any other class, ``send`` is ``other(args)``. A receiver
    no longer live under the lock takes ``full(proto, args)`` (msg_send's full path, with its errors), an
    argument the inline decoding does not take the method's ``decode`` (with its errors). With ``getter_sel`` (the
    SEL of a selector without arguments) it is ``send(receiver)``, the message ``(receiver, getter_sel)``. None
    where the arguments cannot be decoded inline (arm64's MTLSize pointers). ``dev``: the SimDevice (its
    ``_deferred``, lock, GPU and object table)."""
    env: dict[str, Any] = {"get": dev._objects.get, "result_value": result_value, "RET": decoder.proto.ret,
                           "dev": dev, "lock": dev._lock, "gpu": dev.gpu, "other": other, "full": full,
                           "PROTO": decoder.proto, "NARGS": decoder.nargs, "CLS": None, "LOCKLESS": False,
                           "FAST": _fast_type(decoder.proto.ret),
                           **_BUILTINS}
    body = _decode_lines(decoder, env, "            ")
    if body is None:
        return None
    head = ["def send(args):", "    recv = args[0]"] if getter_sel is None else \
        ["def send(recv):", "    args = (recv, SEL)"]
    env["SEL"] = getter_sel
    lines = [*head,
             "    if dev._deferred is not None:",  # also set on a closed device (SimDevice.close)
             "        dev._raise_deferred(args)",
             "    obj = get(recv) if type(recv) is int else None",
             "    if obj is None or type(obj) is not CLS" + (" or len(args) != NARGS:" if getter_sel is None else ":"),
             "        return other(args)",
             "    if LOCKLESS:",  # a one-field getter: no lock (a host polling status never stalls the GPU)
             "        if gpu.unwoken and gpu.polling(obj):",  # a host may be polling: the GPU starts now
             "            with lock:",
             "                gpu.wake()",
             "        result = fn(dev, obj)",
             "        return result if type(result) is FAST else result_value(RET, result)",
             "    with lock:",
             "        if gpu.fresh is not None:",  # the host goes on encoding after a commit
             "            gpu.moved_on()",
             "        if get(recv) is obj:",
             *body,
             "    return full(PROTO, args)"]
    exec("\n".join(lines), env)  # noqa: S102 (generated from the decoder's kinds alone, no outside text)

    def specialize(cls: type, method: Method) -> None:
        _bind_method(env, method, _slow_call(name, method, decoder, dev._objects, dev._lookup, dev.memory))
        env["LOCKLESS"] = method.lockless
        env["CLS"] = cls
    return env["send"], specialize


def _slow_call(name: str, method: Method, decoder: ArgumentDecoder, objects: Mapping[int, SimObject],
               lookup: Callable[[Any, str], SimObject], mem: HostMemory) -> RouteCall:
    """``call(dev, obj, args)`` through ``ArgumentDecoder.decode`` (every argument checked, with its errors)."""
    fn, ret = method.fn, decoder.proto.ret
    void = ret is dtypes.void

    def slow(dev: Any, obj: SimObject, args: tuple[Any, ...]) -> Any:
        result = fn(dev, obj, *decoder.decode(name, args, method, objects, lookup, mem))
        return None if void else result_value(ret, result)
    return slow


def _bind_method(env: dict[str, Any], method: Method, slow: RouteCall) -> None:
    """The names the lines of ``_decode_lines`` take from ``method``: ``fn``, ``slow`` and each ``id`` argument's
    accepted classes ``C<k>``."""
    env["fn"], env["slow"] = method.fn, slow
    specs = iter(method.objects)
    for k in env.get("_ids", ()):
        env[f"C{k}"] = tuple(c for c in next(specs, (SimObject,)) if c is not None) or SimObject


def _decode_lines(decoder: ArgumentDecoder, env: dict[str, Any], pad: str) -> list[str] | None:
    """The lines (indented by ``pad``) that decode ``args[2:]`` inline and call ``fn(dev, obj, ...)``, returning its
    result as ``result_value``; anything unusual returns ``slow(dev, obj, args)``. Fills ``env`` with the bounds
    (``L<k>``, ``H<k>``) and ``_ids`` (the ``id`` arguments, whose classes ``_bind_method`` adds). None for an
    argument kind not decoded inline (arm64's MTLSize pointer)."""
    lines, names, ids = [], [], []
    for k, (kind, dt, lo, hi) in enumerate(zip(decoder.kinds, decoder.dtypes, decoder.lo, decoder.hi)):
        v = f"v{k}"
        names.append(v)
        lines.append(f"{pad}{v} = args[{k + 2}]")
        if kind == _WORD:
            env[f"L{k}"], env[f"H{k}"] = lo, hi
            lines.append(f"{pad}if type({v}) is not int or not L{k} <= {v} <= H{k}: return slow(dev, obj, args)")
        elif kind == _ID:
            ids.append(k)
            lines.append(f"{pad}{v} = get({v}) if type({v}) is int else None")
            lines.append(f"{pad}if {v} is None or not isinstance({v}, C{k}): return slow(dev, obj, args)")
        elif kind == _SIZE and dt is dtypes.MTLSize:
            lines.append(f"{pad}if type({v}) is not tuple or len({v}) != 3: return slow(dev, obj, args)")
            for j in range(3):
                lines.append(f"{pad}if type({v}[{j}]) is not int or not 0 <= {v}[{j}] <= {_U64_MAX}: "
                             "return slow(dev, obj, args)")
        elif kind == _FLOAT:
            lines.append(f"{pad}if type({v}) is not float and type({v}) is not int: return slow(dev, obj, args)")
            lines.append(f"{pad}{v} = float({v})")
        else:
            return None
    env["_ids"] = tuple(ids)
    call = f"fn(dev, obj{''.join(', ' + n for n in names)})"
    void = decoder.proto.ret is dtypes.void
    if void:
        lines.append(f"{pad}{call}\n{pad}return None")
    elif decoder.proto.ret is dtypes.id:  # an object's handle, inline
        lines.append(f"{pad}result = {call}\n{pad}return result.handle if isinstance(result, SimObject) else "
                     "result_value(RET, result)")
    else:  # a plain int (float) for an integer (double) return is returned as it is: result_value's answer
        lines.append(f"{pad}result = {call}\n{pad}return result if type(result) is FAST else "
                     "result_value(RET, result)")
    return lines


def _arg_object(name: str, i: int, value: Any, spec: tuple[Any, ...],
                lookup: Callable[[Any, str], SimObject]) -> SimObject | None:
    """An ``id`` argument the fast path did not accept: nil where ``spec`` allows it, else the live object of an
    accepted class; ``BridgeError`` naming the argument otherwise."""
    classes = tuple(c for c in spec if c is not None)
    wanted = " or ".join(getattr(c, "objc_class", c.__name__) for c in classes) or "object"
    if value == 0 and type(value) is int:
        if None in spec:
            return None
        raise BridgeError(f"{name}: argument {i} is nil, expected a {wanted}")
    obj = lookup(value, f"{name}: argument {i}")
    if classes and not isinstance(obj, classes):
        raise BridgeError(f"{name}: argument {i} must be a {wanted}, got {obj.describe()}")
    return obj


def result_value(ret: DType, result: Any) -> Any:
    """What objc_msgSend returns for a method's ``result`` through return type ``ret``: None (void), an object's
    handle, 0 for nil, a bool, a float or an int."""
    if ret is dtypes.void:
        return None
    if isinstance(result, SimObject):
        return result.handle
    if result is None:
        return 0
    if ret.kind == "bool":
        return bool(result)
    if ret.kind == "float":
        return float(result)
    return int(result)
