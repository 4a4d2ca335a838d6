"""The state of one run of link and the messages every builder of ``mtlir.runtime.link.kinds`` sends through it:
a message by selector (``abi_prototype`` for the bridge's target), keeping a made object for ``Linked.release``,
naming objects and host memory for a ``RecordingBridge``, nil and NSError checks, NSStrings, MTLSize arguments."""
from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from mtlir.ir.dtypes import dtypes
from mtlir.metal import Obj, abi_prototype
from mtlir.program.instructions import Struct
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.errors import LinkError
from mtlir.runtime.link.linked import Linked

__all__ = ["LinkerBase"]


def _name(x: Any) -> str:
    return x.name if isinstance(x, Obj) else str(x)


class LinkerBase:
    """One run of link: its state (the ``Linked`` it fills) and the helpers that send the messages."""

    def __init__(self, program: Program, bridge: Bridge, initial: Mapping[str, Any], max_command_buffers: int,
                 buffer_options: int) -> None:
        self.p, self.b, self.t = program, bridge, bridge.target
        self.initial = initial
        self.max_cbs = max_command_buffers
        self.buffer_options = buffer_options
        self.out = Linked(program, bridge)
        self.sels: dict[str, int] = {}
        self.size_buf = 0
        self.max_threads: dict[str, int] = {}  # pipeline name -> maxTotalThreadsPerThreadgroup
        self.structs: dict[int, Struct] | None = None  # register -> its STRUCT instruction

    # ---- helpers

    def send(self, recv: int, selector: str, *args: Any) -> Any:
        sel = self.sels.get(selector)
        if sel is None:
            sel = self.sels[selector] = self.b.sel_registerName(selector)
        return self.b.msg_send(abi_prototype(selector, self.t), (recv, sel, *args))

    def keep(self, name: str, value: int, how: str = "release") -> int:
        """Remember ``value`` under ``name`` and how to give it back."""
        self.out.handles[name] = value
        self.out.names[value] = name
        self.out.cleanup.append((how, value, name))
        namer = getattr(self.b, "name_object", None)
        if namer is not None:
            namer(value, name)
        return value

    def region(self, addr: int, nbytes: int, name: str) -> None:
        """Name host memory for a RecordingBridge (pointers into it are recorded as ``name+offset``)."""
        namer = getattr(self.b, "name_region", None)
        if namer is not None:
            namer(addr, nbytes, name)

    def label(self, value: int, name: str) -> int:
        """Name a temporary object (descriptor, string) for a RecordingBridge; not released by ``Linked``."""
        namer = getattr(self.b, "name_object", None)
        if namer is not None:
            namer(value, name)
        return value

    def checked(self, value: Any, what: str) -> int:
        if not value:
            raise LinkError(f"{what}: Metal returned nil")
        return int(value)

    def error_text(self, errptr: int) -> str:
        err = int(self.b.load(errptr, dtypes.uint64) or 0)
        if not err:
            return "no NSError given"
        desc = self.send(err, "localizedDescription")
        code = self.send(err, "code")
        text = self.b.read_cstring(self.send(desc, "UTF8String")) if desc else "(no description)"
        return f"{text} (NSError code {code})"

    def with_error(self, what: str, recv: int, selector: str, *args: Any) -> int:
        """A call whose last argument is an NSError**: nil -> LinkError with the error's description."""
        errptr = self.b.malloc(8)
        try:
            ret = self.send(recv, selector, *args, errptr)
            if not ret:
                raise LinkError(f"{what}: {selector} returned nil: {self.error_text(errptr)}")
            return int(ret)
        finally:
            self.b.free(errptr)

    def nsstring(self, s: str) -> int:
        data = s.encode() + b"\0"
        addr = self.b.malloc(len(data))
        try:
            self.b.write(addr, data)
            return self.label(self.checked(self.send(self.b.objc_getClass("NSString"), "stringWithUTF8String:", addr),
                                           f"NSString of {s[:40]!r}"), "nsstring")
        finally:
            self.b.free(addr)

    def mtlsize(self, *sizes: tuple[int, int, int]) -> tuple[Any, ...]:
        """The MTLSize arguments as the target passes them (METAL.md §2)."""
        if self.t == "x86_64":
            return tuple(tuple(s) for s in sizes)
        if not self.size_buf:
            self.size_buf = self.keep("mtlsize:link", self.b.malloc(48), "free")
        out = []
        for i, s in enumerate(sizes):
            self.b.write(self.size_buf + 24 * i, struct.pack("<3Q", *s))
            out.append(self.size_buf + 24 * i)
        return tuple(out)
