"""link: every placeholder (``mtlir.metal.Obj``) of a Program becomes a device object, once, through a Bridge.

What each kind becomes is docs/internals.md's table; the messages and their order are METAL.md §1 and §2:

- ``device``: ``MTLCreateSystemDefaultDevice()`` (a C call); ``queue``: ``newCommandQueueWithMaxCommandBufferCount:``;
  ``event``: ``newSharedEvent`` (the timeline); ``fence``: ``newFence``.
- ``buffer`` / ``varbuf``: ``newBufferWithLength:options:`` (shared storage), filled from ``initial`` through
  ``contents``.
- ``pipeline``: ``stringWithUTF8String:`` on NSString, ``newLibraryWithSource:options:error:`` (NSError** checked),
  ``newFunctionWithName:``, an MTLComputePipelineDescriptor with ``setComputeFunction:`` and
  ``setSupportIndirectCommandBuffers: YES``, ``newComputePipelineStateWithDescriptor:options:reflection:error:``.
- ``icb``: an MTLIndirectCommandBufferDescriptor (ConcurrentDispatch, inherit nothing, the bind count),
  ``newIndirectCommandBufferWithDescriptor:maxCommandCount:options:``, then per command
  ``indirectComputeCommandAtIndex:`` (retained), ``setComputePipelineState:``, ``setKernelBuffer:offset:atIndex:``
  per binding, ``concurrentDispatchThreadgroups:threadsPerThreadgroup:``, ``setBarrier``; each command's
  threadgroup is checked against its pipeline's ``maxTotalThreadsPerThreadgroup``, and so is every constant
  threadgroup of the direct path's ``dispatchThreadgroups:threadsPerThreadgroup:`` (sizes set per submit are
  the device's to check: the simulated device raises in strict mode).
- residency: with ``program.device.residency_set``, an MTLResidencySet holding every buffer and the ICB,
  committed and added to the queue; without, the ``resources`` placeholder (a host array for
  ``useResources:count:usage:``) is all there is.
- host tables: ``contents`` (a buffer's host pointer), ``resources``, ``cbslots``, ``struct`` (a constant MTLSize
  copy), ``scratch`` through ``bridge.malloc``; ``icbcmd``: the retained command of the ICB.

Every message uses ``mtlir.metal.abi_prototype(selector, bridge.target)``: an MTLSize is a pointer to a 24-byte
copy on arm64 and a 3-tuple on x86_64.
"""
from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator, Mapping
from typing import Any

from mtlir.metal import MTL, Kernel, Obj, c_prototype
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.errors import LinkError
from mtlir.runtime.executors.interpreter import prepare_registers
from mtlir.runtime.link.kinds import KindBuilders, icb_commands
from mtlir.runtime.link.state import _name
from mtlir.runtime.link.linked import Linked

__all__ = ["link", "Linked", "icb_commands", "collect_objects"]

_OBJECT_KINDS = ("device", "queue", "event", "fence", "buffer", "varbuf", "pipeline", "icb", "icbcmd", "resources",
                 "cbslots", "struct", "scratch", "contents", "table")


def _walk(value: Any) -> Iterator[Obj]:
    """Every Obj inside ``value`` (tuples, lists, dicts, dataclasses), depth first."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, Obj):
            yield v
            stack.extend(reversed(v.payload))
        elif isinstance(v, (tuple, list)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif dataclasses.is_dataclass(v) and not isinstance(v, (type, Kernel)):
            stack.extend(reversed([getattr(v, f.name) for f in dataclasses.fields(v)]))


def collect_objects(program: Program) -> dict[str, Obj]:
    """Every placeholder of ``program`` by name: those in registers and those inside payloads (the ICB's
    buffers and pipelines). Raises ``LinkError`` when two different placeholders share a name."""
    found: dict[str, Obj] = {}
    for obj in _walk(list(program.objects.values())):
        prev = found.setdefault(obj.name, obj)
        if prev != obj:
            raise LinkError(f"two different placeholders are named {obj.name!r}: {prev!r} and {obj!r}")
        if obj.kind not in _OBJECT_KINDS:
            raise LinkError(f"placeholder {obj!r}: unknown kind {obj.kind!r} (docs/internals.md lists the kinds)")
    return found


class _Linker(KindBuilders):
    """One run of link: sends the messages and fills a ``Linked`` (the builders of each kind are
    ``mtlir.runtime.link.kinds``, the message helpers ``mtlir.runtime.link.state``)."""

    def run(self) -> Linked:
        objs = self.out.objects = collect_objects(self.p)
        by_kind: dict[str, list[Obj]] = {}
        for o in objs.values():
            by_kind.setdefault(o.kind, []).append(o)
        for name, data in self.initial.items():
            if name not in objs or objs[name].kind not in ("buffer", "varbuf"):
                raise LinkError(f"initial data for {name!r}, which is not a buffer of the Program "
                                f"(buffers: {', '.join(o.name for o in by_kind.get('buffer', []))})")
            _check_initial(name, data)
        pool = self.b.c_call("objc_autoreleasePoolPush", c_prototype("objc_autoreleasePoolPush"), ())
        try:
            self.make_all(by_kind)
        except BaseException:
            self.b.c_call("objc_autoreleasePoolPop", c_prototype("objc_autoreleasePoolPop"), (pool,))
            try:
                self.out.release()
            except LinkError:
                pass
            raise
        self.b.c_call("objc_autoreleasePoolPop", c_prototype("objc_autoreleasePoolPop"), (pool,))
        regs = {r: self.out.handles[o.name] for r, o in self.p.objects.items()}
        self.out.registers = prepare_registers(self.p, self.b, regs)
        return self.out

    def make_all(self, by_kind: dict[str, list[Obj]]) -> None:
        b, h = self.b, self.out.handles
        dev_name = by_kind["device"][0].name if "device" in by_kind else "device"
        device = self.keep(dev_name, self.checked(b.c_call("MTLCreateSystemDefaultDevice",
                                                           c_prototype("MTLCreateSystemDefaultDevice"), ()),
                                                  "MTLCreateSystemDefaultDevice (no Metal device)"))
        self.out.device = device
        for o in by_kind.get("queue", []):
            self.keep(o.name, self.checked(self.send(device, "newCommandQueueWithMaxCommandBufferCount:",
                                                     self.max_cbs), f"command queue {o.name!r}"))
        for kind, sel in (("event", "newSharedEvent"), ("fence", "newFence")):
            for o in by_kind.get(kind, []):
                self.keep(o.name, self.checked(self.send(device, sel), f"{kind} {o.name!r}"))
        for o in by_kind.get("buffer", []) + by_kind.get("varbuf", []):
            self.make_buffer(device, o)
        for o in by_kind.get("pipeline", []):
            self.make_pipeline(device, o)
        icbs = by_kind.get("icb", [])
        if len(icbs) > 1:
            raise LinkError(f"a Program with {len(icbs)} ICBs ({', '.join(o.name for o in icbs)}): one is supported")
        for o in icbs:
            self.make_icb(device, o)
        self.check_direct_dispatches()
        if self.p.device.residency_set:
            self.make_residency_set(device, by_kind)
        for o in by_kind.get("contents", []):
            src = o.payload[0] if o.payload else o.name.partition(":")[2]
            src = _name(src)
            if src not in self.out.buffers:
                raise LinkError(f"{o.name}: no buffer named {src!r}")
            h[o.name] = self.out.buffers[src][1]
            self.out.names.setdefault(h[o.name], o.name)
            self.region(h[o.name], self.out.buffers[src][2], o.name)
        for o in by_kind.get("icbcmd", []):
            idx = int(o.payload[-1]) if o.payload else -1
            key = f"{icbs[0].name}[{idx}]" if icbs else ""
            if key not in h:
                raise LinkError(f"{o.name}: no ICB command {idx} (the ICB has {len(self.out.icb)} commands)")
            h[o.name] = h[key]
        for o in by_kind.get("resources", []):
            missing = [_name(n) for n in o.payload if _name(n) not in h]
            if missing:
                raise LinkError(f"{o.name}: names objects link did not make: {', '.join(missing)}")
            table = self.keep(o.name, b.malloc(8 * max(len(o.payload), 1)), "free")
            self.region(table, 8 * len(o.payload), o.name)
            b.write(table, struct.pack(f"<{len(o.payload)}Q", *(h[_name(n)] for n in o.payload)))
        for o in by_kind.get("table", []):
            self.make_table(o)
        for o in by_kind.get("cbslots", []):
            self.region(self.keep(o.name, b.malloc(8 * max(int(o.payload[0]), 1)), "free"), 8 * int(o.payload[0]),
                        o.name)
        for o in by_kind.get("struct", []):
            addr = self.keep(o.name, b.malloc(8 * len(o.payload)), "free")
            b.write(addr, struct.pack(f"<{len(o.payload)}Q", *(int(v) for v in o.payload)))
        for o in by_kind.get("scratch", []):
            self.region(self.keep(o.name, b.malloc(max(int(o.payload[0]), 1)), "free"), int(o.payload[0]), o.name)


def _check_initial(name: str, data: Any) -> None:
    """``initial[name]`` must be bytes-like, or ``(offset, bytes-like)`` with an int offset: ``TypeError`` naming
    the buffer otherwise (before anything is created)."""
    blob = (bytes, bytearray, memoryview)
    if isinstance(data, blob):
        return
    if (isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], int) and not isinstance(data[0], bool)
            and isinstance(data[1], blob)):
        return
    shown = repr(data) if len(repr(data)) <= 40 else repr(data)[:37] + "..."
    raise TypeError(f"initial data for {name!r} must be bytes (or a tuple (byte offset, bytes)), got "
                    f"{type(data).__name__} {shown}")


def link(program: Program, bridge: Bridge, *, initial: Mapping[str, Any] | None = None,
         max_command_buffers: int = 1024, buffer_options: int = MTL.ResourceStorageModeShared) -> Linked:
    """Create every device object ``program`` needs through ``bridge``, once; returns a ``Linked``.

    ``initial``: buffer name -> bytes written from byte 0 (or ``(offset, bytes)``) after the buffer is created.
    ``max_command_buffers``: the queue's maxCommandBufferCount. ``buffer_options``: MTLResourceOptions of every
    buffer (shared storage by default: the CPU writes them through ``contents``). When ``bridge`` has
    ``name_object`` (a ``RecordingBridge``), every object is named there too.

    Raises ``TypeError`` for initial data that is not bytes (or ``(offset, bytes)``), naming the buffer;
    ``LinkError`` naming the object when Metal returns nil (with the NSError's localizedDescription where
    the call has an error out-parameter) or the host memory for a buffer cannot be allocated, for initial data that
    names no buffer or does not fit, a constant
    threadgroup (of an ICB command or a direct dispatch) above its pipeline's ``maxTotalThreadsPerThreadgroup``,
    or an ICB offset above 32 bits; everything created so far
    is released first. Whatever the Bridge raises (``BridgeError``, ``UnsupportedKernelError``, ...) passes
    through unchanged."""
    if program.target != bridge.target:
        raise LinkError(f"the Program was lowered for {program.target} but the bridge decodes {bridge.target}")
    return _Linker(program, bridge, initial or {}, max_command_buffers, buffer_options).run()
