"""The Bridge: the one seam between a lowered Program and a device (real Metal through libobjc, or simulated).

A Bridge is objc_msgSend, sel_registerName, objc_getClass, the few C functions a program calls, and host memory.
Values are Python ints (ids, SELs, addresses, integers), floats (double) and tuples (a struct by value).
docs/internals.md is the contract; ``RecordingBridge`` wraps any bridge and records the messages it sends, and
without an inner bridge it is a small fake device of its own (``mtlir lower --json`` needs no device).
"""
from __future__ import annotations

import bisect
import itertools
import mmap
import struct
import time
from typing import Any, Protocol, runtime_checkable

from mtlir.ir.dtypes import DType, PtrDType, dtypes
from mtlir.metal import MTL, SELECTORS, TARGETS, Prototype
from mtlir.errors import BridgeError

__all__ = ["Bridge", "HostMemory", "RecordingBridge", "Message"]

Message = dict[str, Any]


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


class HostMemory:
    """Host memory of a fake device: blocks of bytes at increasing addresses from ``BASE`` (above 2**32, so a value
    cut to 32 bits is caught). Allocations are 16-byte aligned and never reused; ``free`` only checks. A block of
    ``BIG`` bytes or more is an anonymous memory map, whose pages the OS only provides when they are touched: a
    trace's 4 GiB buffer costs no memory until something writes it.

    Raises ``BridgeError`` for an access outside one allocation or a ``free`` of an address ``malloc`` did not give,
    ``MemoryError`` when the memory cannot be had."""

    BASE = 0x20_0000_0000
    BIG = 1 << 20

    def __init__(self) -> None:
        self.starts: list[int] = []                       # block addresses, increasing
        self.blocks: list[bytearray | mmap.mmap] = []
        self.next = self.BASE
        self.live: dict[int, int] = {}

    def malloc(self, nbytes: int) -> int:
        """``nbytes`` zeroed bytes, 16-byte aligned, at a fresh address; ``BridgeError`` for a negative size."""
        if nbytes < 0:
            raise BridgeError(f"malloc of a negative size ({nbytes} bytes)")
        size = (max(nbytes, 1) + 15) & ~15
        try:
            block: bytearray | mmap.mmap = mmap.mmap(-1, size) if size >= self.BIG else bytearray(size)
        except (OSError, OverflowError) as e:  # the OS refused the map: out of memory, as for a bytearray
            raise MemoryError(f"malloc of {nbytes} bytes: {e}") from None
        addr = self.next
        self.starts.append(addr)
        self.blocks.append(block)
        self.next = addr + size
        self.live[addr] = nbytes
        return addr

    def free(self, addr: int) -> None:
        """Check that ``addr`` is a live ``malloc`` block and forget it (the bytes stay: addresses are never reused);
        ``BridgeError`` for any other address or a second free."""
        if self.live.pop(addr, None) is None:
            raise BridgeError(f"free of 0x{addr:x}: not an address malloc returned (or freed twice)")

    def _at(self, addr: int, nbytes: int) -> tuple[bytearray | mmap.mmap, int]:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0:
            block, off = self.blocks[i], addr - self.starts[i]
            if off + nbytes <= len(block):
                return block, off
        raise BridgeError(f"host access of {nbytes} bytes at 0x{addr:x} is outside host memory")

    def read(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at ``addr``; ``BridgeError`` outside an allocation."""
        block, off = self._at(addr, nbytes)
        return bytes(block[off:off + nbytes])

    def write(self, addr: int, data: bytes) -> None:
        """Copy ``data`` to ``addr``; ``BridgeError`` outside an allocation."""
        block, off = self._at(addr, len(data))
        block[off:off + len(data)] = data

    def load(self, addr: int, dtype: DType) -> Any:
        """One ``dtype`` value at ``addr`` (a struct dtype loads as a tuple)."""
        block, off = self._at(addr, dtype.itemsize)
        v = struct.unpack_from("<" + dtype.fmt, block, off)
        return v[0] if len(v) == 1 else v

    def store(self, addr: int, dtype: DType, value: Any) -> None:
        """Write one ``dtype`` value at ``addr``: integers wrap to the dtype's width, a struct takes a tuple."""
        block, off = self._at(addr, dtype.itemsize)
        if dtype.is_word and dtype.kind != "bool":
            value = int(value) & ((1 << dtype.bits) - 1)
            struct.pack_into("<" + {1: "B", 2: "H", 4: "I", 8: "Q"}[dtype.itemsize], block, off, value)
        elif isinstance(value, tuple):
            struct.pack_into("<" + dtype.fmt, block, off, *value)
        else:
            struct.pack_into("<" + dtype.fmt, block, off, value)

    def read_cstring(self, addr: int) -> str:
        """The NUL-terminated UTF-8 string at ``addr``; ``BridgeError`` without a terminator in its allocation."""
        block, off = self._at(addr, 1)
        end = block.find(b"\x00", off)
        if end < 0:
            raise BridgeError(f"string at 0x{addr:x} has no NUL terminator in host memory")
        return bytes(block[off:end]).decode()


_NAMED_RESULTS = {"commandBuffer": "cmdbuf", "computeCommandEncoder": "encoder"}


class RecordingBridge:
    """A Bridge that records every ``msg_send`` as ``{"receiver": NAME, "selector": SEL, "args": [...]}``.

    Objects are recorded by name (``names``: handle -> name, filled by ``link``; results of ``commandBuffer`` are
    named ``"cmdbuf"``, of ``computeCommandEncoder`` ``"encoder"``, classes by their class name), integers as
    numbers, BOOL as true/false, structs as lists (NSRange ``[location, length]``, MTLSize ``[w, h, d]``) decoded
    with the target's ABI rules (METAL.md §2: on arm64 the 24 bytes behind the MTLSize pointer are read), so a
    record is the same on both targets. An object with no name is recorded as ``"0x…"``.

    ``inner``: the bridge that does the work; ``None`` makes this a standalone fake device (fresh 64-bit handles
    at or above 2**36, its own host memory, status Completed, ``signaledValue`` the last value signalled on that
    event by a committed command buffer). ``target`` defaults to the inner bridge's, else ``"arm64"``.
    Set ``recording = False`` to pass calls through without recording. Raises ``ValueError`` for an unknown
    target, ``BridgeError`` for a selector the fake device does not know."""

    def __init__(self, inner: Bridge | None = None, *, target: str | None = None,
                 names: dict[int, str] | None = None) -> None:
        tgt = target or (inner.target if inner is not None else "arm64")
        if tgt not in TARGETS:
            raise ValueError(f"unknown target {tgt!r}: expected arm64 or x86_64")
        if inner is not None and inner.target != tgt:
            raise ValueError(f"target {tgt!r} disagrees with the inner bridge's target {inner.target!r}")
        self.target = tgt
        self.inner = inner
        self.names: dict[int, str] = dict(names or {})
        self.messages: list[Message] = []
        self.recording = True
        self._starts: list[int] = []
        self._regions: list[tuple[int, int, str]] = []
        self._sels: dict[int, str] = {}
        self._sel_ids: dict[str, int] = {}
        if inner is None:
            self._fake = _FakeDevice(self)
        for sel in SELECTORS:  # know every selector's name, whoever resolved the SELs of a program
            self.sel_registerName(sel)

    # ---- naming and records

    def name_object(self, handle: int, name: str) -> None:
        """Record ``handle`` as ``name`` from now on (link calls this for every object it creates); an inner bridge
        that names objects too is told as well."""
        self.names[handle] = name
        namer = getattr(self.inner, "name_object", None)
        if namer is not None:
            namer(handle, name)

    def name_region(self, addr: int, nbytes: int, name: str) -> None:
        """Name the host memory ``[addr, addr + nbytes)``: a pointer into it is recorded as ``"name+offset"``
        (link names a buffer's ``contents`` and its host tables this way)."""
        self.names[addr] = name
        i = bisect.bisect(self._starts, addr)
        self._starts.insert(i, addr)
        self._regions.insert(i, (addr, addr + nbytes, name))
        namer = getattr(self.inner, "name_region", None)
        if namer is not None:
            namer(addr, nbytes, name)

    def name_of(self, handle: Any) -> Any:
        """The name of an object handle or host address (``"name+offset"`` inside a named region); ``None`` for
        nil; ``"0x…"`` when it has no name."""
        if not handle:
            return None
        name = self.names.get(handle)
        if name is not None:
            return name
        i = bisect.bisect(self._starts, handle) - 1
        if i >= 0 and self._regions[i][0] <= handle < self._regions[i][1]:
            return f"{self._regions[i][2]}+{handle - self._regions[i][0]}"
        return f"0x{int(handle):x}"

    def clear(self) -> list[Message]:
        """The messages recorded so far; the record starts again empty."""
        out, self.messages = self.messages, []
        return out

    def selector_name(self, sel: int) -> str:
        """The selector name of a SEL value this bridge has seen; raises ``BridgeError`` otherwise."""
        name = self._sels.get(sel)
        if name is None:
            raise BridgeError(f"unknown SEL 0x{sel:x}: not registered through this bridge")
        return name

    def _decode(self, selector: str, proto: Prototype, args: tuple[Any, ...]) -> list[Any]:
        sig = SELECTORS.get(selector)
        flat = list(args[2:])
        if sig is None:  # not in the table: the raw words
            return [self._word(p, v) for p, v in zip(proto.args[2:], flat)]
        out: list[Any] = []
        i = 0
        for a in sig.args:
            if a is dtypes.NSRange:
                out.append([int(flat[i]), int(flat[i + 1])])
                i += 2
                continue
            v = flat[i]
            i += 1
            if a is dtypes.MTLSize:
                if isinstance(v, tuple):
                    out.append([int(x) for x in v])
                else:
                    out.append(list(struct.unpack("<3Q", self.read(int(v), 24))))
            else:
                out.append(self._word(a, v))
        if i != len(flat):
            raise BridgeError(f"{selector}: {len(flat)} argument words where the prototype {proto!r} takes {i}")
        return out

    def _word(self, dtype: DType, v: Any) -> Any:
        if dtype.kind in ("id", "ptr") or isinstance(dtype, PtrDType):
            return self.name_of(v)
        if dtype.kind == "bool":
            return bool(v)
        if dtype.kind == "float":
            return float(v)
        return v if isinstance(v, (int, float)) else list(v) if isinstance(v, tuple) else v

    # ---- the Bridge

    def sel_registerName(self, name: str) -> int:
        """The SEL of ``name`` (the inner bridge's, or a fresh handle), remembered for naming messages."""
        sel = self._sel_ids.get(name)
        if sel is None:
            sel = self.inner.sel_registerName(name) if self.inner is not None else self._fake.new_handle()
            self._sel_ids[name] = sel
            self._sels[sel] = name
        return sel

    def objc_getClass(self, name: str) -> int:
        """The class object ``name`` (the inner bridge's, or a fake one); recorded messages name it by class."""
        cls = self.inner.objc_getClass(name) if self.inner is not None else self._fake.get_class(name)
        self.names.setdefault(cls, name)
        return cls

    def c_call(self, fn: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """A C function call, passed to the inner bridge or answered by the fake device; not recorded."""
        if self.inner is not None:
            return self.inner.c_call(fn, proto, args)
        return self._fake.c_call(fn, args)

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """Record the message (when ``recording``), then send it through the inner bridge or the fake device;
        ``BridgeError`` for a SEL this bridge did not register."""
        selector = self._sels.get(args[1])
        if selector is None:
            raise BridgeError(f"objc_msgSend with an unknown SEL 0x{int(args[1]):x} (receiver 0x{int(args[0]):x})")
        if self.recording:
            self.messages.append({"receiver": self.name_of(args[0]), "selector": selector,
                                  "args": self._decode(selector, proto, args)})
        ret = self.inner.msg_send(proto, args) if self.inner is not None else self._fake.msg_send(selector, proto, args)
        label = _NAMED_RESULTS.get(selector)
        if label is not None and ret:
            self.names[ret] = label
        return ret

    def malloc(self, nbytes: int) -> int:
        """Host memory from the inner bridge or the fake device's ``HostMemory``."""
        return self.inner.malloc(nbytes) if self.inner is not None else self._fake.mem.malloc(nbytes)

    def free(self, addr: int) -> None:
        """Free host memory (inner bridge or fake device)."""
        self.inner.free(addr) if self.inner is not None else self._fake.mem.free(addr)

    def read(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at ``addr`` (inner bridge or fake device)."""
        return self.inner.read(addr, nbytes) if self.inner is not None else self._fake.mem.read(addr, nbytes)

    def write(self, addr: int, data: bytes) -> None:
        """Copy ``data`` to ``addr`` (inner bridge or fake device)."""
        self.inner.write(addr, data) if self.inner is not None else self._fake.mem.write(addr, data)

    def load(self, addr: int, dtype: DType) -> Any:
        """One ``dtype`` value at ``addr`` (inner bridge or fake device)."""
        return self.inner.load(addr, dtype) if self.inner is not None else self._fake.mem.load(addr, dtype)

    def store(self, addr: int, dtype: DType, value: Any) -> None:
        """Write one ``dtype`` value at ``addr`` (inner bridge or fake device)."""
        if self.inner is not None:
            self.inner.store(addr, dtype, value)
        else:
            self._fake.mem.store(addr, dtype, value)

    def make_string(self, s: str) -> int:
        """An NSString holding ``s`` (inner bridge or fake device)."""
        return self.inner.make_string(s) if self.inner is not None else self._fake.new_string(s)

    def read_cstring(self, addr: int) -> str:
        """The NUL-terminated string at ``addr`` (inner bridge or fake device)."""
        return self.inner.read_cstring(addr) if self.inner is not None else self._fake.mem.read_cstring(addr)


class _FakeDevice:
    """The standalone answers of a ``RecordingBridge`` without an inner bridge: enough of Metal for link and a
    submit to run (every command buffer completes at commit; nothing executes kernels)."""

    HANDLE_BASE = 0x10_0000_0000

    def __init__(self, owner: RecordingBridge) -> None:
        self.owner = owner
        self.mem = HostMemory()
        self._next = itertools.count(self.HANDLE_BASE, 0x10)
        self.classes: dict[str, int] = {}
        self.strings: dict[int, str] = {}
        self.cstrings: dict[int, int] = {}
        self.buffers: dict[int, tuple[int, int]] = {}  # buffer -> (length, contents)
        self.signaled: dict[int, int] = {}
        self.pending: dict[int, list[tuple[int, int]]] = {}  # command buffer -> [(event, value)]
        self.times: dict[int, float] = {}
        self.commands: dict[tuple[int, int], int] = {}

    def new_handle(self) -> int:
        return next(self._next)

    def get_class(self, name: str) -> int:
        if name not in self.classes:
            self.classes[name] = self.new_handle()
        return self.classes[name]

    def new_string(self, s: str) -> int:
        h = self.new_handle()
        self.strings[h] = s
        return h

    def c_call(self, fn: str, args: tuple[Any, ...]) -> Any:
        if fn in ("MTLCreateSystemDefaultDevice", "objc_autoreleasePoolPush"):
            return self.new_handle()
        if fn == "objc_autoreleasePoolPop":
            return None
        if fn == "sel_registerName":
            return self.owner.sel_registerName(self.mem.read_cstring(int(args[0])))
        if fn == "objc_getClass":
            return self.owner.objc_getClass(self.mem.read_cstring(int(args[0])))
        raise BridgeError(f"C function {fn!r} is unknown to the recording bridge")

    def msg_send(self, selector: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
        recv = int(args[0])
        if recv == 0:
            return None if proto.ret is dtypes.void else 0
        a = args[2:]
        if selector == "newBufferWithLength:options:":
            h = self.new_handle()
            self.buffers[h] = (int(a[0]), self.mem.malloc(int(a[0])))
            return h
        if selector == "contents":
            return self.buffers[recv][1] if recv in self.buffers else 0
        if selector == "length":
            return self.buffers[recv][0] if recv in self.buffers else 0
        if selector == "encodeSignalEvent:value:":
            self.pending.setdefault(recv, []).append((int(a[0]), int(a[1])))
            return None
        if selector == "commit":
            for event, value in self.pending.pop(recv, []):
                self.signaled[event] = max(self.signaled.get(event, 0), value)
            self.times[recv] = time.perf_counter()
            return None
        if selector == "signaledValue":
            return self.signaled.get(recv, 0)
        if selector == "waitUntilSignaledValue:timeoutMS:":
            return self.signaled.get(recv, 0) >= int(a[0])
        if selector == "status":  # completed at commit; NotEnqueued before
            return MTL.StatusCompleted if recv in self.times else MTL.StatusNotEnqueued
        if selector in ("GPUStartTime", "GPUEndTime"):
            return self.times.get(recv, 0.0)
        if selector == "maxTotalThreadsPerThreadgroup":
            return 1024
        if selector == "indirectComputeCommandAtIndex:":
            key = (recv, int(a[0]))
            if key not in self.commands:
                self.commands[key] = self.new_handle()
            return self.commands[key]
        if selector == "stringWithUTF8String:":
            return self.new_string(self.mem.read_cstring(int(a[0])))
        if selector == "localizedDescription":
            return self.new_string("no error")
        if selector == "UTF8String":
            if recv not in self.cstrings:
                data = self.strings.get(recv, "").encode() + b"\0"
                self.cstrings[recv] = addr = self.mem.malloc(len(data))
                self.mem.write(addr, data)
            return self.cstrings[recv]
        if selector == "retain":
            return recv
        if selector in ("error", "code", "gpuAddress"):
            return 0 if selector != "gpuAddress" else self.new_handle()
        ret = proto.ret
        if ret is dtypes.void:
            return None
        if ret.kind == "id":
            return self.new_handle()
        if ret.kind == "bool":
            return True
        if ret.kind == "float":
            return 0.0
        if selector not in SELECTORS:
            raise BridgeError(f"selector {selector!r} is unknown to the recording bridge")
        return 0
