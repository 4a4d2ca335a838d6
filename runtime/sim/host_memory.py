"""The Bridge's host memory calls of ``SimDevice`` (``HostCalls``, a base class of it): ``malloc``/``free``, ``read``/
``write``, ``load``/``store`` of one value, a view of a ``malloc`` block, a C string, over the device's
``HostMemory`` (runtime/bridge/memory.py). A CPU write into bytes an in-flight command buffer reads is refused in
strict mode (METAL.md §3 rule 15, ``checks.check_buffer_write``)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

from mtlir.ir.dtypes import DType, dtypes
from mtlir.runtime.bridge.memory import HostMemory
from mtlir.runtime.sim.msgsend import decode_word
from mtlir.runtime.sim.objects import Buffer
from mtlir.runtime.sim.rules.checks import check_buffer_write

if TYPE_CHECKING:
    from mtlir.runtime.sim.device import SimDevice

__all__ = ["HostCalls"]


class HostCalls:
    """The host memory part of ``SimDevice``'s Bridge. Each call takes the device lock itself where it needs it."""

    # provided by SimDevice
    _lock: threading.Lock
    memory: HostMemory
    strict: bool

    def malloc(self, nbytes: int) -> int:
        """Zeroed host memory of ``nbytes`` bytes, page aligned, at an address >= 2**32."""
        n = decode_word("malloc", 1, dtypes.uint64, nbytes)
        with self._lock:
            return self.memory.alloc(n).base

    def free(self, addr: int) -> None:
        """Free a ``malloc`` block; ``BridgeError`` for anything else (double free, a buffer's contents)."""
        with self._lock:
            self.memory.free(addr)

    def read(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at ``addr`` (``BridgeError``: unmapped, freed, past the end of its block)."""
        return self.memory.read(addr, nbytes)

    def _check_cpu_write(self, addr: int, nbytes: int, call: str) -> None:
        reg, off = self.memory.find(addr, nbytes)
        owner = reg.owner
        if self.strict and isinstance(owner, Buffer) and owner.readers:
            with self._lock:
                check_buffer_write(cast("SimDevice", self), owner, off, nbytes, f"{call} at {addr:#x}")

    def write(self, addr: int, data: bytes) -> None:
        """Copy ``data`` to ``addr``. Strict mode refuses a write into bytes an in-flight command buffer reads
        (rule 15); faithful mode lets the race happen."""
        self._check_cpu_write(addr, len(data), "write")
        self.memory.write(addr, data)

    def host_view(self, addr: int, nbytes: int) -> memoryview | None:
        """A writable view of ``nbytes`` bytes of ``malloc`` memory at ``addr`` (``HostMemory.view``; None for a
        buffer's contents, where rule 15 checks every CPU write): what ``read`` and ``write`` there do, without
        their look-up per call (a Session reads its cbslots table at every submit). Valid until ``free``. The
        compiled replay then stores there without calling ``store``: a subclass that does more in ``store`` or
        ``write`` returns None here."""
        return self.memory.view(addr, nbytes)

    def load(self, addr: int, dtype: DType) -> Any:
        """One ``dtype`` value at ``addr`` (a struct loads as a tuple)."""
        return self.memory.load(addr, dtype)

    def store(self, addr: int, dtype: DType, value: Any) -> None:
        """Write one ``dtype`` value at ``addr`` (rule 15 as ``write``; ``BridgeError`` when it does not fit)."""
        self._check_cpu_write(addr, dtype.itemsize, "store")
        self.memory.store(addr, dtype, value)
