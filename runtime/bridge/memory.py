"""Host memory of a device that lives in this process: one 64-bit address space for ``malloc`` blocks and the
``contents`` of shared MTLBuffers. The simulated device (``mtlir.runtime.sim``) and the standalone device of a
``RecordingBridge`` (``mtlir.runtime.bridge.recording``) both keep their host memory here.

Every block is a numpy ``uint8`` array placed at an address at or above 2**32 with an unmapped guard gap after
it, so an address cut to 32 bits, an access past the end of a block, or an access to freed memory is refused
with a ``BridgeError`` that says which. A shared MTLBuffer's ``contents`` is a block of this space: on the
simulated device the bytes the program patches are the very array the kernels run on (Metal's shared storage
mode, METAL.md §2 ``contents``). A big block costs no memory until it is touched (numpy's zeroed allocation is
mapped lazily by the OS), so a trace's 4 GiB buffer costs nothing until something writes it.
"""
from __future__ import annotations

import bisect
import struct
from typing import Any

import numpy as np

from mtlir.ir.dtypes import DType
from mtlir.errors import BridgeError

__all__ = ["HostMemory", "Region", "HOST_BASE", "PAGE"]

HOST_BASE = 0x1_2000_0000   # first host address: above 2**32, like a macOS arm64 malloc zone
PAGE = 0x4000               # 16 KiB pages (Apple silicon); every block starts on a page, a free page follows it
_CUT_HINT = " (a 64-bit address cut to 32 bits?)"


class Region:
    """One block of host memory: ``base`` address, ``size`` in bytes, ``data`` (numpy uint8, ``size`` long),
    ``owner`` (the simulated object whose memory it is, e.g. an MTLBuffer, or None for ``malloc``), ``what``
    (a short description for messages), ``alive`` (False once freed)."""

    __slots__ = ("base", "size", "data", "owner", "what", "alive")

    def __init__(self, base: int, data: np.ndarray, owner: Any, what: str) -> None:
        self.base, self.size, self.data, self.owner, self.what, self.alive = base, len(data), data, owner, what, True

    def __repr__(self) -> str:
        return f"Region({self.what} at {self.base:#x}, {self.size} bytes{'' if self.alive else ', freed'})"


class HostMemory:
    """The host address space: ``alloc``/``free`` blocks, ``find`` the block holding an address range, and
    ``read``/``write``/``load``/``store`` bytes and typed values (little-endian, like arm64 and x86_64).

    Addresses are Python ints; sizes are bytes. Every error is a ``BridgeError`` naming the address."""

    def __init__(self, base: int = HOST_BASE) -> None:
        self._next = base
        self._bases: list[int] = []
        self._regions: list[Region] = []
        self._last: Region | None = None

    def alloc(self, nbytes: int, owner: Any = None, what: str = "malloc block",
              data: np.ndarray | None = None) -> Region:
        """A new zeroed block of ``nbytes`` bytes (or the given uint8 ``data``), page aligned, with a free page
        after it. Raises ``BridgeError`` for a negative size and ``MemoryError`` when numpy cannot allocate."""
        if nbytes < 0:
            raise BridgeError(f"cannot allocate {nbytes} bytes of host memory: the size is negative")
        if data is None:
            data = np.zeros(nbytes, dtype=np.uint8)
        base = self._next
        self._next = base + (max(nbytes, 1) + PAGE - 1) // PAGE * PAGE + PAGE
        reg = Region(base, data, owner, what)
        self._regions.append(reg)  # before the base: a lock-free find never indexes past the regions
        self._bases.append(base)
        return reg

    def release(self, reg: Region) -> None:
        """Unmap ``reg``: later accesses to it are refused as accesses to freed memory."""
        reg.alive = False
        reg.data = np.zeros(0, dtype=np.uint8)
        if self._last is reg:
            self._last = None

    def free(self, addr: int) -> None:
        """``free(addr)`` of a ``malloc`` block. Raises ``BridgeError`` when ``addr`` is not the start of a live
        ``malloc`` block (a double free, an interior pointer, a buffer's contents)."""
        reg = self._lookup(addr)
        if reg is None or reg.base != addr:
            raise BridgeError(f"free({addr:#x}): not the start of a block from malloc"
                              + (_CUT_HINT if 0 < addr < 1 << 32 else ""))
        if not reg.alive:
            raise BridgeError(f"free({addr:#x}): double free of {reg.what}")
        if reg.owner is not None:
            raise BridgeError(f"free({addr:#x}): {reg.what} is not malloc memory (release its object instead)")
        self.release(reg)

    def _lookup(self, addr: int) -> Region | None:
        i = bisect.bisect_right(self._bases, addr) - 1
        if i < 0:
            return None
        reg = self._regions[i]
        return reg if addr < reg.base + max(reg.size, 1) else None

    def find(self, addr: int, nbytes: int) -> tuple[Region, int]:
        """The live block holding ``[addr, addr + nbytes)`` and the offset of ``addr`` in it.

        Raises ``BridgeError`` for an address that is not an int, unmapped (cut to 32 bits, a guard gap),
        freed, or a range running past the end of its block."""
        if type(addr) is not int:
            if isinstance(addr, (bool, float)) or not isinstance(addr, int):
                raise BridgeError(f"host address {addr!r} is not an integer")
            addr = int(addr)
        last = self._last
        if last is not None and last.base <= addr and addr + nbytes <= last.base + last.size:
            return last, addr - last.base
        reg = self._lookup(addr)
        if reg is None:
            raise BridgeError(f"host address {addr:#x} is not mapped" + (_CUT_HINT if 0 <= addr < 1 << 32 else ""))
        if not reg.alive:
            raise BridgeError(f"host address {addr:#x} is in freed memory ({reg.what})")
        off = addr - reg.base
        if off + nbytes > reg.size:
            raise BridgeError(f"{nbytes} bytes at host address {addr:#x} run past the end of {reg.what} "
                              f"({reg.size} bytes at {reg.base:#x})")
        self._last = reg
        return reg, off

    def region_of(self, addr: int) -> Region | None:
        """The block (live or freed) an address falls in, or None."""
        return self._lookup(addr)

    def read(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at ``addr``."""
        reg, off = self.find(addr, nbytes)
        return reg.data[off:off + nbytes].tobytes()

    def write(self, addr: int, data: bytes) -> Region:
        """Copy ``data`` to ``addr``; returns the block written (the device checks rule 15 on it)."""
        if type(data) is not bytes:  # its bytes first: len() of a memoryview counts elements, not bytes
            data = memoryview(data).tobytes()
        n = len(data)
        reg, off = self.find(addr, n)
        reg.data[off:off + n] = np.frombuffer(data, dtype=np.uint8)
        return reg

    def view(self, addr: int, nbytes: int) -> memoryview | None:
        """A writable view (format ``B``) of the ``nbytes`` bytes at ``addr`` when they lie in a ``malloc`` block
        (``owner`` None: plain host memory, where a write is only a copy), for a host that reads and writes a small
        table at every submit (a Session's ``cbslots``); None inside an object's memory (a buffer's ``contents``:
        the device checks each CPU write there, METAL.md §3 rule 15). Valid until the block is freed: a view kept
        past ``free`` reads and writes a detached copy, so its holder drops it with the block. Raises
        ``BridgeError`` as ``find``."""
        reg, off = self.find(addr, nbytes)
        if reg.owner is not None:
            return None
        return reg.data.data[off:off + nbytes]

    def load(self, addr: int, dtype: DType) -> Any:
        """One value of ``dtype`` at ``addr`` (a struct dtype loads as a tuple of ints)."""
        reg, off = self.find(addr, dtype.itemsize)
        vals = struct.unpack_from("<" + dtype.fmt, reg.data.data, off)
        return vals if len(vals) != 1 else vals[0]

    def store(self, addr: int, dtype: DType, value: Any) -> Region:
        """Write one value of ``dtype`` at ``addr``; returns the block. Raises ``BridgeError`` when the value
        does not fit the dtype (a negative uint64, a 65-bit int, a float for an int)."""
        reg, off = self.find(addr, dtype.itemsize)
        if type(value) is int and dtype.kind != "float":  # the usual store: one integer (a handle, a count)
            try:
                struct.pack_into("<" + dtype.fmt, reg.data.data, off, value)
            except struct.error as e:
                raise BridgeError(f"store of {value!r} as {dtype.name} at {addr:#x}: does not fit ({e})") from None
            return reg
        vals = value if isinstance(value, tuple) else (value,)
        try:
            if dtype.kind != "float" and any(isinstance(v, float) for v in vals):
                raise struct.error("a float for an integer type")
            struct.pack_into("<" + dtype.fmt, reg.data.data, off, *vals)
        except struct.error as e:
            raise BridgeError(f"store of {value!r} as {dtype.name} at {addr:#x}: does not fit ({e})") from None
        return reg

    def read_cstring(self, addr: int) -> str:
        """The NUL-terminated UTF-8 string at ``addr``, read up to the end of its malloc block (C and Metal put
        no length limit on a string such as an MSL source: only the block bounds it). Raises ``BridgeError``
        when no NUL ends it inside its block or the bytes are not UTF-8."""
        reg, off = self.find(addr, 1)
        end, step = off, 4096  # scanned in growing windows: a short string in a huge block touches a page or two
        while True:
            window = reg.data[end:end + step]
            nul = np.flatnonzero(window == 0)
            if len(nul):
                raw = reg.data[off:end + int(nul[0])].tobytes()
                break
            if end + step >= len(reg.data):
                raise BridgeError(f"C string at {addr:#x} has no terminating NUL inside {reg.what}")
            end, step = end + step, step * 2
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BridgeError(f"C string at {addr:#x} is not UTF-8: {e}") from None
