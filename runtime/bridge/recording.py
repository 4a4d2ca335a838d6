"""Recording: ``RecordingBridge`` records the messages sent through another Bridge, objects by name and structs
decoded per target; ``FakeDevice`` is the Bridge it records when there is no device (``mtlir lower --json``).

``FakeDevice`` answers just enough of Metal for link and a submit to run: fresh 64-bit handles, host memory of
its own (``mtlir.runtime.bridge.memory.HostMemory``, the simulated device's), every command buffer NotEnqueued
until its commit and Completed from then on, ``signaledValue`` the highest value a committed command buffer
signalled on that event. What it answers each selector with is the table ``_ANSWERS``; nothing executes kernels.
"""
from __future__ import annotations

import bisect
import itertools
import struct
import time
from collections.abc import Callable
from typing import Any

from mtlir.errors import ArgumentError, BridgeError
from mtlir.ir.dtypes import DType, PtrDType, dtypes
from mtlir.metal import MTL, SELECTORS, TARGETS, Prototype
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.bridge.memory import HostMemory

__all__ = ["RecordingBridge", "FakeDevice", "Message"]

Message = dict[str, Any]

_NAMED_RESULTS = {"commandBuffer": "cmdbuf", "computeCommandEncoder": "encoder", "blitCommandEncoder": "blit"}


def _check_target(target: str) -> str:
    if target not in TARGETS:
        raise ArgumentError(f"unknown target {target!r}: expected arm64 or x86_64")
    return target


class RecordingBridge:
    """A Bridge that records every ``msg_send`` as ``{"receiver": NAME, "selector": SEL, "args": [...]}``.

    Objects are recorded by name (``names``: handle -> name, filled by ``link``; results of ``commandBuffer`` are
    named ``"cmdbuf"``, of ``computeCommandEncoder`` ``"encoder"``, classes by their class name), integers as
    numbers, BOOL as true/false, structs as lists (NSRange ``[location, length]``, MTLSize ``[w, h, d]``) decoded
    with the target's ABI rules (METAL.md §2: on arm64 the 24 bytes behind the MTLSize pointer are read), so a
    record is the same on both targets. An object with no name is recorded as ``"0x…"``.

    ``inner``: the bridge that does the work; ``None`` makes a ``FakeDevice`` of ``target`` (docs/runtime.md).
    ``target`` defaults to the inner bridge's, else ``"arm64"``. Set ``recording = False`` to pass calls through
    without recording. Raises ``ValueError`` for an unknown target or one that disagrees with the inner bridge's,
    ``BridgeError`` for a message with a SEL it does not know and whatever the inner bridge raises."""

    def __init__(self, inner: Bridge | None = None, *, target: str | None = None,
                 names: dict[int, str] | None = None) -> None:
        tgt = _check_target(target or (inner.target if inner is not None else "arm64"))
        if inner is not None and inner.target != tgt:
            raise ValueError(f"target {tgt!r} disagrees with the inner bridge's target {inner.target!r}")
        self.target = tgt
        self.inner: Bridge = inner if inner is not None else FakeDevice(tgt)
        self.names: dict[int, str] = dict(names or {})
        self.messages: list[Message] = []
        self.recording = True
        self._starts: list[int] = []
        self._regions: list[tuple[int, int, str]] = []
        self._sels: dict[int, str] = {}
        self._sel_ids: dict[str, int] = {}
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
        """The inner bridge's SEL of ``name``, remembered for naming messages."""
        sel = self._sel_ids.get(name)
        if sel is None:
            sel = self._sel_ids[name] = self.inner.sel_registerName(name)
            self._sels[sel] = name
        return sel

    def objc_getClass(self, name: str) -> int:
        """The inner bridge's class object ``name``; recorded messages name it by class."""
        cls = self.inner.objc_getClass(name)
        self.names.setdefault(cls, name)
        return cls

    def c_call(self, fn: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """A C function call, passed to the inner bridge; not recorded. The SEL of ``sel_registerName`` and the
        class of ``objc_getClass`` are remembered by name, as their Bridge methods are."""
        ret = self.inner.c_call(fn, proto, args)
        if ret and fn in ("sel_registerName", "objc_getClass"):
            name = self.inner.read_cstring(int(args[0]))
            if fn == "sel_registerName":
                self._sel_ids.setdefault(name, int(ret))
                self._sels[int(ret)] = name
            else:
                self.names.setdefault(int(ret), name)
        return ret

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """Record the message (when ``recording``), then send it through the inner bridge; ``BridgeError`` for a
        SEL this bridge did not register."""
        selector = self._sels.get(args[1])
        if selector is None:
            raise BridgeError(f"objc_msgSend with an unknown SEL 0x{int(args[1]):x} (receiver 0x{int(args[0]):x})")
        if self.recording:
            self.messages.append({"receiver": self.name_of(args[0]), "selector": selector,
                                  "args": self._decode(selector, proto, args)})
        ret = self.inner.msg_send(proto, args)
        label = _NAMED_RESULTS.get(selector)
        if label is not None and ret:
            self.names[ret] = label
        return ret

    def malloc(self, nbytes: int) -> int:
        """Host memory of the inner bridge."""
        return self.inner.malloc(nbytes)

    def free(self, addr: int) -> None:
        """Free host memory of the inner bridge."""
        self.inner.free(addr)

    def read(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at ``addr`` (inner bridge)."""
        return self.inner.read(addr, nbytes)

    def write(self, addr: int, data: bytes) -> None:
        """Copy ``data`` to ``addr`` (inner bridge)."""
        self.inner.write(addr, data)

    def load(self, addr: int, dtype: DType) -> Any:
        """One ``dtype`` value at ``addr`` (inner bridge)."""
        return self.inner.load(addr, dtype)

    def store(self, addr: int, dtype: DType, value: Any) -> None:
        """Write one ``dtype`` value at ``addr`` (inner bridge)."""
        self.inner.store(addr, dtype, value)

    def make_string(self, s: str) -> int:
        """An NSString holding ``s`` (inner bridge)."""
        return self.inner.make_string(s)

    def read_cstring(self, addr: int) -> str:
        """The NUL-terminated string at ``addr`` (inner bridge)."""
        return self.inner.read_cstring(addr)


class FakeDevice:
    """A Bridge with enough of Metal for link and a submit to run, and nothing more (module docstring): what a
    ``RecordingBridge`` records when there is no device.

    Handles (objects, classes, SELs, autorelease pools) are fresh 64-bit values from ``HANDLE_BASE`` (2**36) up;
    host memory is a ``HostMemory`` from ``MEMORY_BASE``. A message to nil returns nil (0, or None for void).
    Raises ``ValueError`` for an unknown target, ``BridgeError`` for a SEL it did not hand out, a C function or an
    integer-returning selector it does not know, and what ``HostMemory`` raises."""

    HANDLE_BASE = 0x10_0000_0000
    HANDLE_STEP = 0x10
    MEMORY_BASE = 0x20_0000_0000

    def __init__(self, target: str = "arm64") -> None:
        self.target = _check_target(target)
        self.memory = HostMemory(self.MEMORY_BASE)
        self._next = itertools.count(self.HANDLE_BASE, self.HANDLE_STEP)
        self._sel_ids: dict[str, int] = {}
        self._sel_names: dict[int, str] = {}
        self.classes: dict[str, int] = {}
        self.strings: dict[int, str] = {}                     # NSString -> its text
        self.cstrings: dict[int, int] = {}                    # NSString -> its UTF8String copy
        self.buffers: dict[int, tuple[int, int]] = {}         # MTLBuffer -> (length, contents)
        self.signaled: dict[int, int] = {}                    # MTLSharedEvent -> signaledValue
        self.pending: dict[int, list[tuple[int, int]]] = {}   # command buffer -> [(event, value)] until its commit
        self.committed: dict[int, float] = {}                 # command buffer -> host seconds of its commit
        self.commands: dict[tuple[int, int], int] = {}        # (ICB, index) -> its indirect compute command

    def new_handle(self) -> int:
        """A fresh handle."""
        return next(self._next)

    # ---- the Bridge

    def sel_registerName(self, name: str) -> int:
        """The SEL of ``name``: a fresh handle the first time."""
        sel = self._sel_ids.get(name)
        if sel is None:
            sel = self._sel_ids[name] = self.new_handle()
            self._sel_names[sel] = name
        return sel

    def objc_getClass(self, name: str) -> int:
        """The class object ``name``: a fresh handle the first time (every class exists)."""
        cls = self.classes.get(name)
        if cls is None:
            cls = self.classes[name] = self.new_handle()
        return cls

    def c_call(self, fn: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """``MTLCreateSystemDefaultDevice``, ``objc_autoreleasePoolPush`` (fresh handles), ``objc_autoreleasePoolPop``
        (nothing), ``sel_registerName`` and ``objc_getClass`` (of a C string)."""
        if fn in ("MTLCreateSystemDefaultDevice", "objc_autoreleasePoolPush"):
            return self.new_handle()
        if fn == "objc_autoreleasePoolPop":
            return None
        if fn == "sel_registerName":
            return self.sel_registerName(self.memory.read_cstring(int(args[0])))
        if fn == "objc_getClass":
            return self.objc_getClass(self.memory.read_cstring(int(args[0])))
        raise BridgeError(f"C function {fn!r} is unknown to the recording bridge")

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """The answer of ``_ANSWERS`` for the selector; else by the return type: nothing, a fresh handle, YES, 0.0,
        or 0 for a selector of ``mtlir.metal.SELECTORS``."""
        selector = self._sel_names.get(args[1])
        if selector is None:
            raise BridgeError(f"objc_msgSend with an unknown SEL 0x{int(args[1]):x} (receiver 0x{int(args[0]):x})")
        recv = int(args[0])
        if recv == 0:
            return None if proto.ret is dtypes.void else 0
        answer = _ANSWERS.get(selector)
        if answer is not None:
            return answer(self, recv, args[2:])
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

    def malloc(self, nbytes: int) -> int:
        """Zeroed host memory (``HostMemory.alloc``)."""
        return self.memory.alloc(nbytes).base

    def free(self, addr: int) -> None:
        """Free a block from ``malloc``."""
        self.memory.free(addr)

    def read(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at ``addr``."""
        return self.memory.read(addr, nbytes)

    def write(self, addr: int, data: bytes) -> None:
        """Copy ``data`` to ``addr``."""
        self.memory.write(addr, data)

    def load(self, addr: int, dtype: DType) -> Any:
        """One ``dtype`` value at ``addr``."""
        return self.memory.load(addr, dtype)

    def store(self, addr: int, dtype: DType, value: Any) -> None:
        """Write one ``dtype`` value at ``addr``."""
        self.memory.store(addr, dtype, value)

    def make_string(self, s: str) -> int:
        """An NSString holding ``s``."""
        h = self.new_handle()
        self.strings[h] = s
        return h

    def read_cstring(self, addr: int) -> str:
        """The NUL-terminated UTF-8 string at ``addr``."""
        return self.memory.read_cstring(addr)

    # ---- answers of the selectors that need state (``_ANSWERS``)

    def new_buffer(self, length: int) -> int:
        """``newBufferWithLength:options:``: a buffer whose ``contents`` is a fresh block of host memory."""
        h = self.new_handle()
        self.buffers[h] = (length, self.memory.alloc(length, h, f"contents of buffer 0x{h:x}").base)
        return h

    def commit(self, cb: int) -> None:
        """``commit``: the command buffer is Completed at once; the values it encoded are signalled."""
        for event, value in self.pending.pop(cb, []):
            self.signaled[event] = max(self.signaled.get(event, 0), value)
        self.committed[cb] = time.perf_counter()

    def command(self, icb: int, index: int) -> int:
        """``indirectComputeCommandAtIndex:``: the same handle for the same ICB and index."""
        key = (icb, index)
        if key not in self.commands:
            self.commands[key] = self.new_handle()
        return self.commands[key]

    def utf8(self, string: int) -> int:
        """``UTF8String``: a C string copy of the NSString (made once, owned by it)."""
        if string not in self.cstrings:
            data = self.strings.get(string, "").encode() + b"\0"
            self.cstrings[string] = addr = self.memory.alloc(len(data), string, "UTF8String").base
            self.memory.write(addr, data)
        return self.cstrings[string]


_Answer = Callable[[FakeDevice, int, tuple[Any, ...]], Any]

# selector -> answer(device, receiver, arguments after self and _cmd) of a FakeDevice
_ANSWERS: dict[str, _Answer] = {
    "newBufferWithLength:options:": lambda d, r, a: d.new_buffer(int(a[0])),
    "contents": lambda d, r, a: d.buffers[r][1] if r in d.buffers else 0,
    "length": lambda d, r, a: d.buffers[r][0] if r in d.buffers else 0,
    "encodeSignalEvent:value:": lambda d, r, a: d.pending.setdefault(r, []).append((int(a[0]), int(a[1]))),
    "commit": lambda d, r, a: d.commit(r),
    "signaledValue": lambda d, r, a: d.signaled.get(r, 0),
    "waitUntilSignaledValue:timeoutMS:": lambda d, r, a: d.signaled.get(r, 0) >= int(a[0]),
    "status": lambda d, r, a: MTL.StatusCompleted if r in d.committed else MTL.StatusNotEnqueued,
    "GPUStartTime": lambda d, r, a: d.committed.get(r, 0.0),
    "GPUEndTime": lambda d, r, a: d.committed.get(r, 0.0),
    "maxTotalThreadsPerThreadgroup": lambda d, r, a: 1024,
    "indirectComputeCommandAtIndex:": lambda d, r, a: d.command(r, int(a[0])),
    "stringWithUTF8String:": lambda d, r, a: d.make_string(d.memory.read_cstring(int(a[0]))),
    "localizedDescription": lambda d, r, a: d.make_string("no error"),
    "UTF8String": lambda d, r, a: d.utf8(r),
    "retain": lambda d, r, a: r,
    "error": lambda d, r, a: 0,
    "code": lambda d, r, a: 0,
    "gpuAddress": lambda d, r, a: d.new_handle(),
}
