"""Linked: the device objects of one linked Program (``mtlir.runtime.link.link.link`` makes it), its buffers read and
written through ``contents``, a buffer added after link (``new_buffer``), and ``release``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mtlir.metal import MTL, Obj
from mtlir.program.payloads import IcbCommand
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.bridge.messenger import Messenger
from mtlir.errors import ArgumentError, LinkError, MetalValidationError
from mtlir.runtime.executors.executor import prepare_registers

__all__ = ["Linked", "above_max_buffer_length"]


@dataclass
class Linked:
    """The device objects of one linked Program.

    ``messenger``: what link, ``new_buffer``, ``release`` and the Session send through (its host memory is freed
    by ``release``); ``objects``: every placeholder by name (``collect_objects``); ``device``: the MTLDevice;
    ``registers``: the prepared register file (``mtlir.runtime.executors.interpreter.prepare_registers``);
    ``handles``: name -> handle or host address (``"queue"``, ``"buffer:7"``, ``"pipeline:E_5_8_2"``, ``"icb[3]"``,
    ``"cbslots"``, ...); ``names``: the reverse map (for ``RecordingBridge``); ``buffers``: name -> (handle,
    contents address, length in bytes); ``icb``: the ICB's commands as built. ``release()`` gives everything
    back (idempotent)."""

    program: Program
    bridge: Bridge
    messenger: Messenger
    objects: dict[str, Obj] = field(default_factory=dict)
    device: int = 0
    registers: list[Any] = field(default_factory=list)
    handles: dict[str, int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    buffers: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    icb: list[IcbCommand] = field(default_factory=list)
    cleanup: list[tuple[str, int, str]] = field(default_factory=list)  # ("release"|"free"|"remove"|"commit", ...)

    def of_kind(self, kind: str) -> list[str]:
        """The names of the placeholders of ``kind`` (``"event"``, ``"cbslots"``, ``"buffer"``, ...)."""
        return [name for name, o in self.objects.items() if o.kind == kind]

    def registers_for(self, other: Program) -> list[Any]:
        """A register file for another Program over these objects (e.g. a timeline read of the same event).
        Raises ``LinkError`` naming a placeholder this link did not make."""
        objects = {}
        for r, obj in other.objects.items():
            if obj.name not in self.handles:
                raise LinkError(f"placeholder {obj.name!r} of the other Program was not linked here")
            objects[r] = self.handles[obj.name]
        return prepare_registers(other, self.bridge, objects)

    def _buffer(self, name: str, offset: int, nbytes: int) -> tuple[int, int]:
        if name not in self.buffers:
            raise ArgumentError(f"no buffer named {name!r}: the linked buffers are {', '.join(self.buffers)}")
        _, contents, length = self.buffers[name]
        if offset < 0 or nbytes < 0 or offset + nbytes > length:
            raise ArgumentError(f"{name}: bytes [{offset}, {offset + nbytes}) are outside its {length} bytes")
        return contents, length

    def read_buffer(self, name: str, offset: int = 0, nbytes: int | None = None) -> bytes:
        """``nbytes`` bytes (default: to the end) of buffer ``name`` from byte ``offset``, through ``contents``.
        Raises ``KeyError`` for an unknown buffer, ``ValueError`` for a range outside it."""
        length = self.buffers[name][2] if name in self.buffers else 0
        contents, _ = self._buffer(name, offset, length - offset if nbytes is None else nbytes)
        return self.bridge.read(contents + offset, length - offset if nbytes is None else nbytes)

    def write_buffer(self, name: str, data: bytes, offset: int = 0) -> None:
        """Copy ``data`` (its bytes: a memoryview of float32 is 4 bytes an element) into buffer ``name`` at byte
        ``offset``; errors as ``read_buffer``."""
        raw = data if type(data) is bytes else memoryview(data).tobytes()  # len() of a memoryview counts elements
        contents, _ = self._buffer(name, offset, len(raw))
        self.bridge.write(contents + offset, raw)

    def new_buffer(self, name: str, nbytes: int, data: bytes = b"", *,
                   options: int = MTL.ResourceStorageModeShared) -> int:
        """A new MTLBuffer of ``nbytes`` bytes named ``name`` (e.g. an input to give a buffer variable of the
        Program), filled with ``data`` from byte 0; added to the residency set when there is one (``addAllocation:``
        + ``commit``); released with the rest. Returns its handle. Raises ``LinkError`` for a name in use, a size
        below 1, data that does not fit, or nil from Metal."""
        if name in self.handles:
            raise LinkError(f"new_buffer: the name {name!r} is taken")
        if nbytes < 1 or len(data) > nbytes:
            raise LinkError(f"new_buffer {name!r}: {len(data)} bytes of data in a buffer of {nbytes} bytes")
        m = self.messenger
        buf = int(m.send(self.device, "newBufferWithLength:options:", nbytes, options) or 0)
        if not buf:
            above_max_buffer_length(m, self.device, f"new_buffer {name!r}", nbytes)
            raise LinkError(f"new_buffer {name!r} ({nbytes} bytes): Metal returned nil")
        self.handles[name], self.names[buf] = buf, name
        self.cleanup.append(("release", buf, name))
        namer = getattr(self.bridge, "name_object", None)
        if namer is not None:
            namer(buf, name)
        contents = int(m.send(buf, "contents") or 0)
        self.buffers[name] = (buf, contents, nbytes)
        if data:
            self.bridge.write(contents, bytes(data))
        rset = self.handles.get("residency_set")
        if rset:
            m.send(rset, "addAllocation:", buf)
            m.send(rset, "commit")
        return buf

    def release(self) -> None:
        """Release the objects and free the host memory link made, newest first, then the messenger's; errors
        are collected and raised together at the end as one ``LinkError`` (everything is attempted).

        With work in flight every object is treated by Metal's lifetime table (docs/simulator.md, "Object
        lifetimes"), not by its kind here: what a command buffer encoded directly (the ICB, a pipeline bound for the
        warm-up) is kept alive by it and freed when it completes; a buffer or pipeline only ICB commands reach is a
        use-after-free, which a device may refuse (``MetalValidationError``: the simulated device in strict mode).
        A refused object stays alive and stays in ``cleanup``: call ``release()`` again once the work completes.
        Any other failure drops the object (it is gone, or the Bridge cannot release it)."""
        errors: list[str] = []
        refused: list[tuple[str, int, str]] = []
        while self.cleanup:
            how, value, name = self.cleanup.pop()
            try:
                if how == "release":
                    self.messenger.send(value, "release")
                elif how == "remove":  # out of a shared residency set (link's ``shared``)
                    self.messenger.send(self.handles["residency_set"], "removeAllocation:", value)
                elif how == "commit":
                    self.messenger.send(value, "commit")
                else:
                    self.bridge.free(value)
            except MetalValidationError as e:  # refused, still alive: kept for the next release()
                refused.append((how, value, name))
                errors.append(f"{name}: {e}")
            except Exception as e:  # keep going: release everything that can be
                errors.append(f"{name}: {e}")
        self.cleanup = refused[::-1]
        try:
            self.messenger.close()
        except Exception as e:
            errors.append(f"the messenger's host memory: {e}")
        if errors:
            again = f" ({len(refused)} refused, kept: call release() again once the work in flight completes)" \
                if refused else ""
            raise LinkError("release failed for " + "; ".join(errors) + again)


def above_max_buffer_length(messenger: Messenger, device: int, what: str, nbytes: int) -> None:
    """After ``newBufferWithLength:options:`` returned nil for ``nbytes``: a ``LinkError`` naming ``what``, the size
    and the device's ``maxBufferLength`` (asked now) when the size is above it; returns when that does not explain
    the nil (the caller then says nil), or the device cannot be asked."""
    try:
        limit = int(messenger.send(device, "maxBufferLength") or 0)
    except Exception:  # a device without the property (a stand-in): the caller's plain message
        return
    if 0 < limit < nbytes:
        raise LinkError(f"{what} ({nbytes} bytes): the size is above the device's maxBufferLength ({limit} bytes): "
                        "Metal returned nil")
