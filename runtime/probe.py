"""What a Metal device offers, asked through a Bridge before lowering: residency sets and indirect command buffers.

``mtlir run --device metal`` lowers for the device it runs on: a Mac before macOS 15 has no ``MTLResidencySet``
(the submit then lists its resources with ``useResources:count:usage:``), and paravirtual Metal (a macOS virtual
machine) has neither residency sets nor ICBs (the submit then takes the direct path). Each capability is probed
with the very messages link will send (METAL.md §2), so a device that answers the probe also answers link:

- residency sets: ``objc_getClass("MTLResidencySetDescriptor")`` exists and
  ``newResidencySetWithDescriptor:error:`` on the device returns an object;
- ICBs: ``newIndirectCommandBufferWithDescriptor:maxCommandCount:options:`` returns an object for the descriptor
  link uses (ConcurrentDispatch, inherit nothing, one buffer binding) and one command.

What the probe makes is released before it returns; it runs inside its own autorelease pool.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.bridge.messenger import Messenger
from mtlir.errors import BridgeError, LinkError

__all__ = ["DeviceCaps", "probe_device"]


@dataclass(frozen=True)
class DeviceCaps:
    """What the device offers: ``residency_sets`` (MTLResidencySet, macOS 15+), ``icb`` (indirect command
    buffers), and ``notes``: why a capability is missing, one line each."""

    residency_sets: bool
    icb: bool
    notes: tuple[str, ...] = ()


class _Prober:
    """The messages of one probe (``m``) and the +1 objects it made (``made``), released by ``release_all``."""

    def __init__(self, m: Messenger) -> None:
        self.m = m
        self.made: list[int] = []  # +1 objects to release, newest last

    def new(self, class_name: str) -> int:
        """``[class new]`` (+1, released at the end); 0 when the runtime has no such class."""
        try:
            cls = self.m.cls(class_name)
        except BridgeError:
            return 0
        obj = int(self.m.send(cls, "new") or 0) if cls else 0
        if obj:
            self.made.append(obj)
        return obj

    def keep(self, obj: Any) -> bool:
        if obj:
            self.made.append(int(obj))
        return bool(obj)

    def error_text(self, errptr: int) -> str:
        """The localizedDescription of the NSError an out-parameter holds ("" when none)."""
        b = self.m.bridge
        err = int(b.load(errptr, dtypes.id) or 0)
        text = int(self.m.send(err, "localizedDescription") or 0) if err else 0
        return b.read_cstring(self.m.send(text, "UTF8String")) if text else ""

    def release_all(self) -> None:
        """Release what the probe made, newest first."""
        while self.made:
            self.m.send(self.made.pop(), "release")


def probe_device(bridge: Bridge) -> DeviceCaps:
    """Ask the device behind ``bridge`` (``MTLCreateSystemDefaultDevice``) whether it makes residency sets and
    ICBs (module docstring). Raises ``LinkError`` when there is no device; whatever the Bridge raises otherwise
    passes through."""
    m = Messenger(bridge)
    p = _Prober(m)
    pool = m.push()
    try:
        device = m.device()
        if not device:
            raise LinkError("MTLCreateSystemDefaultDevice returned nil: this machine has no Metal device")
        p.made.append(device)
        notes: list[str] = []
        residency = False
        desc = p.new("MTLResidencySetDescriptor")
        if not desc:
            notes.append("no class MTLResidencySetDescriptor (residency sets need macOS 15 or later)")
        else:
            err = bridge.malloc(8)
            try:
                residency = p.keep(m.send(device, "newResidencySetWithDescriptor:error:", desc, err))
                why = "" if residency else p.error_text(err)
            finally:
                bridge.free(err)
            if not residency:
                notes.append(f"newResidencySetWithDescriptor:error: returned nil ({why or 'no residency sets'})")
        icb = False
        desc = p.new("MTLIndirectCommandBufferDescriptor")
        if desc:
            m.send(desc, "setCommandTypes:", MTL.IndirectCommandTypeConcurrentDispatch)
            m.send(desc, "setInheritBuffers:", False)
            m.send(desc, "setInheritPipelineState:", False)
            m.send(desc, "setMaxKernelBufferBindCount:", 1)
            icb = p.keep(m.send(device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", desc, 1,
                                0))
        if not icb:
            notes.append("newIndirectCommandBufferWithDescriptor:maxCommandCount:options: returned nil (no indirect "
                         "command buffers: paravirtual Metal?)")
        return DeviceCaps(residency, icb, tuple(notes))
    finally:
        try:
            p.release_all()
        finally:
            m.pop(pool)
