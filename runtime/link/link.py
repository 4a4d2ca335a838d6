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

``link`` checks its input, then ``_make_all`` makes the kinds in that order: the one-message kinds and the host
tables here, the others by one function per kind in ``mtlir.runtime.link.kinds``, each given the run's
``LinkState`` (``mtlir.runtime.link.state``: the ``Linked`` being filled, nil and NSError checks) and the
threadgroup checks in ``mtlir.runtime.link.threadgroups``. Every message goes through the state's ``Messenger``
(``mtlir.runtime.bridge.messenger``) with ``mtlir.metal.abi_prototype(selector, bridge.target)``: an MTLSize is a
pointer to a 24-byte copy on arm64 and a 3-tuple on x86_64.
"""
from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator, Mapping
from typing import Any

from mtlir.errors import LinkError
from mtlir.metal import MTL, Kernel, Obj
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.executors.executor import prepare_registers
from mtlir.runtime.link.kinds import make_buffer, make_icb, make_pipeline, make_residency_set, make_table
from mtlir.runtime.link.linked import Linked
from mtlir.runtime.link.state import LinkState, obj_name
from mtlir.runtime.link.threadgroups import check_direct_dispatches

__all__ = ["link", "collect_objects"]

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


def _make_all(ls: LinkState, by_kind: dict[str, list[Obj]]) -> None:
    """Make every placeholder, kind by kind, in the order of the module docstring: the device first, then what
    is made on it, then the host tables that hold handles of what was made."""
    m, b, out, h = ls.messenger, ls.bridge, ls.out, ls.out.handles
    dev_name = by_kind["device"][0].name if "device" in by_kind else "device"
    if ls.adopt(dev_name):
        device = out.device = h[dev_name]
    else:
        device = out.device = ls.keep(dev_name, ls.checked(m.device(), "MTLCreateSystemDefaultDevice (no Metal device)"))
    for o in by_kind.get("queue", []):
        if ls.adopt(o.name):
            continue
        queue = m.send(device, "newCommandQueueWithMaxCommandBufferCount:", ls.max_command_buffers)
        ls.keep(o.name, ls.checked(queue, f"command queue {o.name!r}"))
    for kind, sel in (("event", "newSharedEvent"), ("fence", "newFence")):
        for o in by_kind.get(kind, []):
            if not ls.adopt(o.name):
                ls.keep(o.name, ls.checked(m.send(device, sel), f"{kind} {o.name!r}"))
    for o in by_kind.get("buffer", []) + by_kind.get("varbuf", []):
        make_buffer(ls, device, o)
    for o in by_kind.get("pipeline", []):
        make_pipeline(ls, device, o)
    icbs = by_kind.get("icb", [])
    if len(icbs) > 1:
        raise LinkError(f"a Program with {len(icbs)} ICBs ({', '.join(o.name for o in icbs)}): one is supported")
    for o in icbs:
        make_icb(ls, device, o)
    check_direct_dispatches(ls)
    if ls.program.device.residency_set:
        make_residency_set(ls, device, by_kind)
    for o in by_kind.get("contents", []):
        src = obj_name(o.payload[0] if o.payload else o.name.partition(":")[2])
        if src not in out.buffers:
            raise LinkError(f"{o.name}: no buffer named {src!r}")
        h[o.name] = out.buffers[src][1]
        out.names.setdefault(h[o.name], o.name)
        ls.region(h[o.name], out.buffers[src][2], o.name)
    for o in by_kind.get("icbcmd", []):
        idx = int(o.payload[-1]) if o.payload else -1
        key = f"{icbs[0].name}[{idx}]" if icbs else ""
        if key not in h:
            raise LinkError(f"{o.name}: no ICB command {idx} (the ICB has {len(out.icb)} commands)")
        h[o.name] = h[key]
    for o in by_kind.get("resources", []):
        missing = [obj_name(n) for n in o.payload if obj_name(n) not in h]
        if missing:
            raise LinkError(f"{o.name}: names objects link did not make: {', '.join(missing)}")
        table = ls.keep(o.name, b.malloc(8 * max(len(o.payload), 1)), "free")
        ls.region(table, 8 * len(o.payload), o.name)
        b.write(table, struct.pack(f"<{len(o.payload)}Q", *(h[obj_name(n)] for n in o.payload)))
    for o in by_kind.get("table", []):
        make_table(ls, o)
    for o in by_kind.get("cbslots", []):
        ls.region(ls.keep(o.name, b.malloc(8 * max(int(o.payload[0]), 1)), "free"), 8 * int(o.payload[0]), o.name)
    for o in by_kind.get("struct", []):
        addr = ls.keep(o.name, b.malloc(8 * len(o.payload)), "free")
        b.write(addr, struct.pack(f"<{len(o.payload)}Q", *(int(v) for v in o.payload)))
    for o in by_kind.get("scratch", []):
        ls.region(ls.keep(o.name, b.malloc(max(int(o.payload[0]), 1)), "free"), int(o.payload[0]), o.name)


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
         max_command_buffers: int = 1024, buffer_options: int = MTL.ResourceStorageModeShared,
         shared: Mapping[str, int] | None = None) -> Linked:
    """Create every device object ``program`` needs through ``bridge``, once; returns a ``Linked``.

    ``initial``: buffer name -> bytes written from byte 0 (or ``(offset, bytes)``) after the buffer is created.
    ``max_command_buffers``: the queue's maxCommandBufferCount. ``buffer_options``: MTLResourceOptions of every
    buffer (shared storage by default: the CPU writes them through ``contents``). When ``bridge`` has
    ``name_object`` (a ``RecordingBridge``), every object is named there too. ``shared``: placeholder name ->
    handle of objects made and owned elsewhere (``mtlir.runtime.context.DeviceContext``: ``device``, ``queue``,
    ``event``, ``fence``, ``pipeline:<key>``, ``residency_set``), used as they are and never released here; a
    shared residency set gets the Program's own buffers and ICB (``addAllocation:``, ``commit``), which
    ``Linked.release`` removes again.

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
    initial = initial or {}
    objs = collect_objects(program)
    by_kind: dict[str, list[Obj]] = {}
    for o in objs.values():
        by_kind.setdefault(o.kind, []).append(o)
    for name, data in initial.items():
        if name not in objs or objs[name].kind not in ("buffer", "varbuf"):
            raise LinkError(f"initial data for {name!r}, which is not a buffer of the Program "
                            f"(buffers: {', '.join(o.name for o in by_kind.get('buffer', []))})")
        _check_initial(name, data)
    ls = LinkState(program, bridge, initial, max_command_buffers, buffer_options, shared)
    ls.out.objects = objs
    pool = ls.messenger.push()
    try:
        _make_all(ls, by_kind)
    except BaseException:
        ls.messenger.pop(pool)
        try:
            ls.out.release()
        except LinkError:
            pass
        raise
    ls.messenger.pop(pool)
    handles = {r: ls.out.handles[o.name] for r, o in program.objects.items()}
    ls.out.registers = prepare_registers(program, bridge, handles)
    return ls.out
