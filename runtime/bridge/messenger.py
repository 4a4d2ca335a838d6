"""Messenger: the one way the runtime sends an Objective-C message by selector name, through any Bridge.

``send(receiver, selector, *args)`` takes the arguments in Metal's own terms (mtlir.metal.SELECTORS) and lays them
out as ``abi_prototype(selector, bridge.target)`` says, as the abi pass does for a Program (METAL.md §2): an
NSRange ``(location, length)`` as two words; an MTLSize ``(w, h, d)`` as a pointer to a 24-byte copy in host
memory on arm64 and as the tuple itself on x86_64. Link, ``Linked``, the Session's bookkeeping, the device probe
and scripts or tests that talk to a device by hand all send through one; the lowered Program sends its own.

```python
m = Messenger(SimDevice("arm64"))
dev = m.device()
queue = m.send(dev, "newCommandQueueWithMaxCommandBufferCount:", 4)
```
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import SELECTORS, Prototype, abi_prototype, c_prototype
from mtlir.runtime.bridge.bridge import Bridge

__all__ = ["Messenger"]

_POOL_PUSH, _POOL_POP = c_prototype("objc_autoreleasePoolPush"), c_prototype("objc_autoreleasePoolPop")
_CREATE_DEVICE = c_prototype("MTLCreateSystemDefaultDevice")
_STRUCTS = (dtypes.NSRange, dtypes.MTLSize)


class Messenger:
    """Sends messages through ``bridge`` by selector name (``send``), with the exact prototype of its target.

    Each selector is resolved once (its prototype and SEL). The MTLSize copies a message passes by pointer (arm64)
    live in one block of host memory that every message reuses (the callee reads them during the call);
    ``size`` and ``cstring`` make copies that stay until ``close``, which frees everything this messenger
    allocated."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.target = bridge.target
        self._plans: dict[str, tuple[Prototype, int, tuple[DType, ...] | None]] = {}
        self._sizes = 0  # the reused block of MTLSize copies (arm64), 24 bytes per MTLSize argument
        self._scratch: list[int] = []

    def sel(self, name: str) -> int:
        """The SEL of ``name``, from the Bridge (which registers a name once), for any name."""
        plan = self._plans.get(name)
        return plan[1] if plan is not None else self.bridge.sel_registerName(name)

    def _plan(self, selector: str) -> tuple[Prototype, int, tuple[DType, ...] | None]:
        """(prototype, SEL, the argument types when one of them is a struct to lay out, else None)."""
        plan = self._plans.get(selector)
        if plan is None:
            proto = abi_prototype(selector, self.target)
            args = SELECTORS[selector].args
            plan = (proto, self.bridge.sel_registerName(selector), args if any(a in _STRUCTS for a in args) else None)
            self._plans[selector] = plan
        return plan

    def send(self, receiver: int, selector: str, *args: Any) -> Any:
        """``objc_msgSend(receiver, selector, *args)`` through ``abi_prototype(selector, target)``; ``args`` as
        ``marshal`` takes them. Raises ``AbiError`` for a selector missing from mtlir.metal.SELECTORS, ``ValueError``
        for a wrong argument count, and what the Bridge raises."""
        plan = self._plans.get(selector)
        proto, sel, structs = plan if plan is not None else self._plan(selector)
        if structs is None:
            if len(args) != len(proto.args) - 2:
                raise ValueError(f"{selector} takes {len(proto.args) - 2} arguments, got {len(args)}")
            return self.bridge.msg_send(proto, (receiver, sel, *args))
        return self.bridge.msg_send(proto, (receiver, sel, *self.marshal(selector, args)))

    def getter(self, selector: str) -> Callable[[int], Any]:
        """``send(receiver, selector)`` for a selector without arguments (``status``, ``release``), resolved once:
        a function of the receiver that sends the message straight to the Bridge (what a Session's wait sends for
        every submit). Raises ``ValueError`` for a selector that takes arguments, ``AbiError`` as ``send``."""
        proto, sel, _ = self._plan(selector)
        if len(proto.args) != 2:
            raise ValueError(f"{selector} takes {len(proto.args) - 2} arguments: getter is for none")
        bridge = self.bridge
        make = getattr(bridge, "getter", None)
        if make is not None:  # a SimDevice: the (prototype, SEL) pair's look-ups done once, its checks per message
            return make(proto, sel)  # type: ignore[no-any-return]

        def get(receiver: int) -> Any:
            return bridge.msg_send(proto, (receiver, sel))  # looked up per call, as send does
        return get

    def marshal(self, selector: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` in Metal's terms (NSRange and MTLSize as tuples) laid out for ``abi_prototype``; on arm64 the
        MTLSize copies go to the reused block (valid until the next message). Raises ``KeyError`` for a selector
        missing from mtlir.metal.SELECTORS and ``ValueError`` for a wrong count."""
        sig = SELECTORS[selector]
        if len(args) != len(sig.args):
            raise ValueError(f"{selector} takes {len(sig.args)} arguments, got {len(args)}")
        out: list[Any] = []
        copies = 0
        for dt, a in zip(sig.args, args):
            if dt is dtypes.NSRange:
                out += [int(a[0]), int(a[1])]
            elif dt is dtypes.MTLSize and self.target == "arm64":
                out.append(self._size_copy(copies, a))
                copies += 1
            elif dt is dtypes.MTLSize:
                out.append(tuple(int(v) for v in a))
            else:
                out.append(a)
        return tuple(out)

    def _size_copy(self, i: int, size: tuple[int, int, int]) -> int:
        """The address of MTLSize copy ``i`` of the current message, written into the reused block."""
        if not self._sizes:
            most = max(sum(a is dtypes.MTLSize for a in s.args) for s in SELECTORS.values())
            self._sizes = self.bridge.malloc(24 * most)
            self._scratch.append(self._sizes)
        addr = self._sizes + 24 * i
        self.bridge.store(addr, dtypes.MTLSize, tuple(int(v) for v in size))
        return addr

    def size(self, size: tuple[int, int, int]) -> int:
        """A host copy of an MTLSize (24 bytes) of its own, freed by ``close``; its address (for a message laid
        out by hand)."""
        addr = self.bridge.malloc(24)
        self._scratch.append(addr)
        self.bridge.store(addr, dtypes.MTLSize, tuple(int(v) for v in size))
        return addr

    def cstring(self, s: str) -> int:
        """A NUL-terminated UTF-8 copy of ``s`` in host memory (freed by ``close``); its address."""
        raw = s.encode() + b"\0"
        addr = self.bridge.malloc(len(raw))
        self._scratch.append(addr)
        self.bridge.write(addr, raw)
        return addr

    def cls(self, name: str) -> int:
        """The class object ``name`` (the Bridge's ``objc_getClass``; ``BridgeError`` when there is none)."""
        return int(self.bridge.objc_getClass(name))

    def string(self, s: str) -> int:
        """An NSString (+0) made with ``stringWithUTF8String:`` on the NSString class (0 when nil), from a C
        string copy freed once the NSString has copied it."""
        raw = s.encode() + b"\0"
        addr = self.bridge.malloc(len(raw))
        try:
            self.bridge.write(addr, raw)
            return int(self.send(self.cls("NSString"), "stringWithUTF8String:", addr) or 0)
        finally:
            self.bridge.free(addr)

    def device(self) -> int:
        """``MTLCreateSystemDefaultDevice()`` (+1); 0 when there is no Metal device."""
        return int(self.bridge.c_call("MTLCreateSystemDefaultDevice", _CREATE_DEVICE, ()) or 0)

    def push(self) -> int:
        """``objc_autoreleasePoolPush()``: a pool token."""
        return int(self.bridge.c_call("objc_autoreleasePoolPush", _POOL_PUSH, ()))

    def pop(self, token: int) -> None:
        """``objc_autoreleasePoolPop(token)``."""
        self.bridge.c_call("objc_autoreleasePoolPop", _POOL_POP, (token,))

    def close(self) -> None:
        """Free the host memory this messenger allocated (the MTLSize block and the copies of ``size`` and
        ``cstring``); it can go on sending afterwards."""
        scratch, self._scratch, self._sizes = self._scratch, [], 0
        for addr in scratch:
            self.bridge.free(addr)
