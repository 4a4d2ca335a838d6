"""The Bridge: the one seam between a lowered Program and a device (real Metal through libobjc, or simulated).

A Bridge is objc_msgSend, sel_registerName, objc_getClass, the few C functions a program calls, and host memory.
Values are Python ints (ids, SELs, addresses, integers), floats (double) and tuples (a struct by value).
docs/internals.md is the contract. The Bridges: ``mtlir.runtime.metal.bridge.MetalBridge`` (real Metal),
``mtlir.runtime.sim.SimDevice`` (the simulated device), ``mtlir.runtime.bridge.recording.RecordingBridge`` (records
the messages sent through another Bridge) and its ``FakeDevice`` (``mtlir lower --json`` needs no device);
``mtlir.runtime.bridge.messenger.Messenger`` sends a message through any of them by selector name.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from mtlir.ir.dtypes import DType
from mtlir.metal import Prototype

__all__ = ["Bridge"]


@runtime_checkable
class Bridge(Protocol):
    """What a device offers a Program (docs/internals.md). ``target`` is the ABI it decodes (arm64, x86_64)."""

    target: str

    def sel_registerName(self, name: str) -> int:
        """The SEL for ``name`` (registered once)."""
        ...

    def objc_getClass(self, name: str) -> int:
        """The class object named ``name``; raises ``BridgeError`` when there is none."""
        ...

    def c_call(self, fn: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """Call the C function ``fn`` (``MTLCreateSystemDefaultDevice``, ``objc_autoreleasePoolPush``, ...)."""
        ...

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """``objc_msgSend(self, _cmd, ...)`` through exactly ``proto``; ``args[0]`` is the receiver, ``args[1]``
        the SEL, the rest as the abi pass produced them."""
        ...

    def malloc(self, nbytes: int) -> int:
        """Zeroed host memory of ``nbytes`` bytes; its address (8-byte aligned at least)."""
        ...

    def free(self, addr: int) -> None:
        """Give back memory from ``malloc``."""
        ...

    def read(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes of host memory at ``addr``."""
        ...

    def write(self, addr: int, data: bytes) -> None:
        """Copy ``data`` to host memory at ``addr``."""
        ...

    def load(self, addr: int, dtype: DType) -> Any:
        """One value of ``dtype`` at ``addr``."""
        ...

    def store(self, addr: int, dtype: DType, value: Any) -> None:
        """Write one value of ``dtype`` at ``addr``."""
        ...

    def make_string(self, s: str) -> int:
        """An NSString (+0, autoreleased) holding ``s``."""
        ...

    def read_cstring(self, addr: int) -> str:
        """The NUL-terminated UTF-8 string at ``addr``."""
        ...
