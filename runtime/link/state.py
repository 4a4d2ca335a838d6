"""The state of one run of link (``LinkState``), which ``link`` hands to every builder of ``mtlir.runtime.link.kinds``
explicitly: what it has made so far (a ``Linked``), the Messenger it sends through, and the bookkeeping around the
messages: keeping a made object for ``Linked.release``, naming objects and host memory for a ``RecordingBridge``,
nil and NSError checks, NSStrings."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtlir.errors import LinkError
from mtlir.ir.dtypes import dtypes
from mtlir.metal import Obj
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.bridge.messenger import Messenger
from mtlir.runtime.link.linked import Linked

__all__ = ["LinkState", "obj_name"]


def obj_name(x: Any) -> str:
    """The name of a placeholder given as an ``Obj`` or by its name."""
    return x.name if isinstance(x, Obj) else str(x)


class LinkState:
    """One run of link: the ``program``, the ``bridge`` and its ``messenger``, the ``initial`` data (buffer name ->
    bytes or ``(offset, bytes)``), the queue's ``max_command_buffers``, the ``buffer_options``
    (MTLResourceOptions); ``out``: the ``Linked`` it fills; ``max_threads``: each pipeline's
    ``maxTotalThreadsPerThreadgroup`` once asked."""

    def __init__(self, program: Program, bridge: Bridge, initial: Mapping[str, Any], max_command_buffers: int,
                 buffer_options: int, shared: Mapping[str, int] | None = None) -> None:
        self.program, self.bridge = program, bridge
        self.shared = dict(shared or {})
        self.messenger = Messenger(bridge)
        self.initial = initial
        self.max_command_buffers = max_command_buffers
        self.buffer_options = buffer_options
        self.out = Linked(program, bridge, self.messenger)
        self.max_threads: dict[str, int] = {}

    def keep(self, name: str, value: int, how: str = "release") -> int:
        """Remember ``value`` under ``name`` in ``out`` and how ``Linked.release`` gives it back (``"release"`` an
        object, ``"free"`` host memory); the object is named for a ``RecordingBridge``. Returns ``value``."""
        self.out.handles[name] = value
        self.out.names[value] = name
        self.out.cleanup.append((how, value, name))
        self.label(value, name)
        return value

    def adopt(self, name: str) -> bool:
        """Use the object ``shared[name]`` (made and owned by someone else, e.g. a ``DeviceContext``: its queue,
        event, fence, pipelines, residency set) for placeholder ``name``: it is named in ``out`` but never released
        by it. Returns False when ``name`` is not shared (link makes it)."""
        value = self.shared.get(name)
        if value is None:
            return False
        self.out.handles[name] = value
        self.out.names.setdefault(value, name)
        return True

    def region(self, addr: int, nbytes: int, name: str) -> None:
        """Name host memory for a RecordingBridge (pointers into it are recorded as ``name+offset``)."""
        namer = getattr(self.bridge, "name_region", None)
        if namer is not None:
            namer(addr, nbytes, name)

    def label(self, value: int, name: str) -> int:
        """Name an object for a RecordingBridge (a temporary one, a descriptor or a string, is not released by
        ``Linked``). Returns ``value``."""
        namer = getattr(self.bridge, "name_object", None)
        if namer is not None:
            namer(value, name)
        return value

    def checked(self, value: Any, what: str) -> int:
        """``value`` as an int; ``LinkError`` naming ``what`` when Metal returned nil."""
        if not value:
            raise LinkError(f"{what}: Metal returned nil")
        return int(value)

    def error_text(self, errptr: int) -> str:
        """The localizedDescription and code of the NSError an out-parameter holds."""
        m = self.messenger
        err = int(self.bridge.load(errptr, dtypes.uint64) or 0)
        if not err:
            return "no NSError given"
        desc = m.send(err, "localizedDescription")
        code = m.send(err, "code")
        text = self.bridge.read_cstring(m.send(desc, "UTF8String")) if desc else "(no description)"
        return f"{text} (NSError code {code})"

    def with_error(self, what: str, recv: int, selector: str, *args: Any) -> int:
        """Send ``selector`` with an NSError** out-parameter after ``args``: nil -> ``LinkError`` naming ``what``
        with the error's description and code."""
        errptr = self.bridge.malloc(8)
        try:
            ret = self.messenger.send(recv, selector, *args, errptr)
            if not ret:
                raise LinkError(f"{what}: {selector} returned nil: {self.error_text(errptr)}")
            return int(ret)
        finally:
            self.bridge.free(errptr)

    def nsstring(self, s: str) -> int:
        """An NSString holding ``s`` (``stringWithUTF8String:``), named ``nsstring``; ``LinkError`` for nil."""
        return self.label(self.checked(self.messenger.string(s), f"NSString of {s[:40]!r}"), "nsstring")
