"""Messenger: send Objective-C messages through any Bridge by selector name, marshalled as the abi pass would.

For scripts and tests that talk to a device by hand (the lowered Program does this itself): ``send`` looks up
``abi_prototype(selector, bridge.target)`` and lays the arguments out as that prototype says (METAL.md §2): an
NSRange ``(location, length)`` as two words; an MTLSize ``(w, h, d)`` as a pointer to a 24-byte copy in host
memory on arm64 and as the tuple itself on x86_64.

```python
m = Messenger(SimDevice("arm64"))
dev = m.device()
queue = m.send(dev, "newCommandQueueWithMaxCommandBufferCount:", 4)
```
"""
from __future__ import annotations

from typing import Any

from mtlir.ir.dtypes import dtypes
from mtlir.metal import SELECTORS, abi_prototype, c_prototype
from mtlir.runtime.bridge.bridge import Bridge

__all__ = ["Messenger"]


class Messenger:
    """Sends messages through ``bridge`` by selector name (``send``), with the exact prototype of its target.
    Host copies of MTLSize arguments (arm64) come from ``bridge.malloc`` and are freed by ``close``."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.target = bridge.target
        self._sels: dict[str, int] = {}
        self._scratch: list[int] = []

    def sel(self, name: str) -> int:
        """The SEL of ``name`` (registered once)."""
        sel = self._sels.get(name)
        if sel is None:
            sel = self._sels[name] = self.bridge.sel_registerName(name)
        return sel

    def marshal(self, selector: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` in Metal's terms (NSRange and MTLSize as tuples) laid out for ``abi_prototype``. Raises
        ``KeyError`` for a selector missing from mtlir.metal.SELECTORS and ``ValueError`` for a wrong count."""
        sig = SELECTORS[selector]
        if len(args) != len(sig.args):
            raise ValueError(f"{selector} takes {len(sig.args)} arguments, got {len(args)}")
        out: list[Any] = []
        for dt, a in zip(sig.args, args):
            if dt is dtypes.NSRange:
                out += [int(a[0]), int(a[1])]
            elif dt is dtypes.MTLSize:
                out.append(self.size(a) if self.target == "arm64" else tuple(int(v) for v in a))
            else:
                out.append(a)
        return tuple(out)

    def size(self, size: tuple[int, int, int]) -> int:
        """A host copy of an MTLSize (24 bytes); its address."""
        addr = self.bridge.malloc(24)
        self.bridge.store(addr, dtypes.MTLSize, tuple(int(v) for v in size))
        self._scratch.append(addr)
        return addr

    def send(self, receiver: int, selector: str, *args: Any) -> Any:
        """``objc_msgSend(receiver, selector, *args)`` through ``abi_prototype(selector, target)``."""
        proto = abi_prototype(selector, self.target)
        return self.bridge.msg_send(proto, (receiver, self.sel(selector), *self.marshal(selector, args)))

    def cstring(self, s: str) -> int:
        """A NUL-terminated UTF-8 copy of ``s`` in host memory (freed by ``close``); its address."""
        raw = s.encode() + b"\0"
        addr = self.bridge.malloc(len(raw))
        self.bridge.write(addr, raw)
        self._scratch.append(addr)
        return addr

    def cls(self, name: str) -> int:
        """``objc_getClass(name)``."""
        return int(self.bridge.c_call("objc_getClass", c_prototype("objc_getClass"), (self.cstring(name),)))

    def string(self, s: str) -> int:
        """An NSString (+0) made with ``stringWithUTF8String:`` on the NSString class."""
        return int(self.send(self.cls("NSString"), "stringWithUTF8String:", self.cstring(s)))

    def device(self) -> int:
        """``MTLCreateSystemDefaultDevice()`` (+1)."""
        return int(self.bridge.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"),
                                      ()))

    def push(self) -> int:
        """``objc_autoreleasePoolPush()``: a pool token."""
        return int(self.bridge.c_call("objc_autoreleasePoolPush", c_prototype("objc_autoreleasePoolPush"), ()))

    def pop(self, token: int) -> None:
        """``objc_autoreleasePoolPop(token)``."""
        self.bridge.c_call("objc_autoreleasePoolPop", c_prototype("objc_autoreleasePoolPop"), (token,))

    def close(self) -> None:
        """Free the host copies this messenger made."""
        for addr in self._scratch:
            self.bridge.free(addr)
        self._scratch.clear()
