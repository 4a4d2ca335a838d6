"""The compiled replay's way into ``SimDevice.msg_send`` (``Senders``, a base class of ``SimDevice``): ``sender(proto,
sel)`` is ``msg_send`` for one (prototype, SEL) pair with the pair's look-ups done once, ``getter(proto, sel)`` the
same for a selector without arguments taking the receiver alone (a Session's wait: status, GPU times, release).
Every check of ``msg_send`` stays per message; once the first receiver class is known the whole message is one
generated function (``msgsend.compile_send``). docs/performance.md, "Session 8: the eager call's host side"."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mtlir.metal import SELECTORS, Prototype, abi_prototype
from mtlir.runtime.sim.gpu import GPU
from mtlir.runtime.sim.msgsend import ArgumentDecoder, Method, compile_send, result_value
from mtlir.runtime.sim.objects import SimObject

if TYPE_CHECKING:
    from mtlir.runtime.sim.device import _Route

__all__ = ["Senders"]


class _Inline:
    """The generated functions of one (prototype, SEL) pair (``SimDevice.sender`` and ``getter``), specialized
    together on the first receiver class a message of the pair resolves (``msgsend.compile_send``), once (two host
    threads resolving at the same time take turns: a function never sees one class's method with another class)."""

    __slots__ = ("first", "specializers", "lock")

    def __init__(self) -> None:
        self.first: tuple[type, Method] | None = None
        self.specializers: list[Callable[[type, Method], None]] = []
        self.lock = threading.Lock()

    def add(self, specialize: Callable[[type, Method], None]) -> None:
        with self.lock:
            self.specializers.append(specialize)
            if self.first is not None:
                specialize(*self.first)

    def resolve(self, cls: type, method: Method) -> None:
        with self.lock:
            if self.first is None:
                self.first = (cls, method)
                for specialize in self.specializers:
                    specialize(cls, method)


class Senders:
    """``sender`` and ``getter`` of ``SimDevice`` (whose attributes these are)."""

    # provided by SimDevice
    target: str
    gpu: GPU
    _lock: threading.Lock
    _objects: dict[int, SimObject]
    _deferred: Exception | None
    _sel_names: dict[int, str]
    _decoders: dict[str, ArgumentDecoder]
    _routes: dict[tuple[int, type], _Route]
    _senders: dict[tuple[Any, ...], tuple[Prototype, Callable[[Any], Any]]]
    _inline: dict[tuple[int, Any], _Inline]
    _plain_msg_send: Callable[..., Any]  # SimDevice.msg_send itself: a subclass may override msg_send
    msg_send: Callable[[Prototype, tuple[Any, ...]], Any]
    _msg_send: Callable[[Prototype, tuple[Any, ...]], Any]
    _raise_deferred: Callable[[Any], None]

    def getter(self, proto: Prototype, sel: Any) -> Callable[[int], Any]:
        """``get(receiver)``: ``sender(proto, sel)((receiver, sel))`` for a selector without arguments (``status``,
        ``release``: what a Session's wait sends per command buffer, ``Messenger.getter``), the message's tuple made
        inside. The same checks and errors as ``sender``'s."""
        made = self._senders.get((id(proto), sel, "getter"))
        if made is not None and made[0] is proto:
            return made[1]
        send = self.sender(proto, sel)
        name = self._sel_names.get(sel) if type(sel) is int else None
        decoder = self._decoders.get(name) if name is not None else None
        inline = self._inline.get((id(proto), sel))
        if decoder is None or decoder.nargs != 2 or inline is None:  # a pair refused per message, a subclass's own
            return lambda receiver: send((receiver, sel))
        compiled = compile_send(name, decoder, self, send, self._msg_send, getter_sel=sel)  # type: ignore[arg-type]
        if compiled is None:
            return lambda receiver: send((receiver, sel))
        get, specialize = compiled
        inline.add(specialize)
        self._senders[(id(proto), sel, "getter")] = (proto, get)
        return get

    def sender(self, proto: Prototype, sel: Any) -> Callable[[tuple[Any, ...]], Any]:
        """``send(args)``, the same as ``msg_send(proto, args)`` for messages of one SEL through one prototype
        object (``args``: the receiver, ``sel`` and the arguments), with the look-ups that depend only on the pair
        done once: a compiled replay sends each of its messages through one (``CompiledReplay``). Every check of
        ``msg_send`` stays per message: an error the device deferred and a closed device, the receiver a live
        object (under the lock), the argument count, each argument decoded, the GPU's hooks (``moved_on``, and
        ``wake`` for a lockless getter). A pair ``msg_send`` would refuse (an unknown SEL, another prototype) and
        a receiver class seen for the first time take ``msg_send``'s full path, with its errors, at the message; on
        a subclass that overrides ``msg_send`` (a test's fault injection) ``send`` is that ``msg_send``. The first
        receiver class gets the whole message in one generated function
        (``msgsend.compile_send``: the checks, the lock and the arguments' decoding inline)."""
        made = self._senders.get((id(proto), sel))
        if made is not None and made[0] is proto:  # one per pair for the device: every Session's replay shares it
            return made[1]
        name = self._sel_names.get(sel) if type(sel) is int else None
        if (name is None or name not in SELECTORS or not isinstance(proto, Prototype)
                or type(self).msg_send is not type(self)._plain_msg_send):  # refused per message; an override
            return lambda args: self.msg_send(proto, args)
        decoder = self._decoders.get(name)
        if decoder is None:
            decoder = self._decoders[name] = ArgumentDecoder(abi_prototype(name, self.target))
        if id(proto) not in decoder.seen:
            if proto != decoder.proto or len(decoder.held) >= 16:
                return lambda args: self.msg_send(proto, args)
            decoder.held.append(proto)
            decoder.seen.add(id(proto))
        nargs, objects, lock, gpu, full = decoder.nargs, self._objects, self._lock, self.gpu, self._msg_send
        get = objects.get
        routes: dict[type, _Route] = {}  # the receiver classes seen: their route (``_route``)

        def send(args: tuple[Any, ...]) -> Any:
            if self._deferred is not None:
                self._raise_deferred(args)
            recv = args[0]
            obj = get(recv) if type(recv) is int else None
            if obj is not None and len(args) == nargs:
                route = routes.get(type(obj))
                if route is not None:
                    if route.method.lockless:
                        if gpu.unwoken and gpu.polling(obj):  # as msg_send: a host polling starts the GPU
                            with lock:
                                gpu.wake()
                        return result_value(route.ret, route.method.fn(self, obj))
                    with lock:
                        if gpu.fresh is not None:  # the host goes on encoding after a commit
                            gpu.moved_on()
                        if get(recv) is obj:
                            return route.call(self, obj, args)
                else:
                    result = full(proto, args)
                    known = self._routes.get((sel, type(obj)))
                    if known is not None:
                        routes[type(obj)] = known
                        inline.resolve(type(obj), known.method)  # the first receiver class: inline from now on
                    return result
            return full(proto, args)
        inline = self._inline[(id(proto), sel)] = _Inline()
        compiled = compile_send(name, decoder, self, send, full)
        fast: Callable[[tuple[Any, ...]], Any] = send  # arm64's MTLSize pointers: decoded by the route's call
        if compiled is not None:
            fast = compiled[0]
            inline.add(compiled[1])
        self._senders[(id(proto), sel)] = (proto, fast)  # (the prototype held: its id is not reused)
        return fast
