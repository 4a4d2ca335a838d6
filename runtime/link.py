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
import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mtlir.dtypes import dtypes
from mtlir.metal import MTL, Kernel, Obj, abi_prototype, c_prototype
from mtlir.program import IcbCommand, IcbSpec, Program
from mtlir.runtime.bridge import Bridge
from mtlir.runtime.errors import KernelCompileError, LinkError, UnsupportedKernelError, locate
from mtlir.runtime.interpreter import prepare_registers

__all__ = ["link", "Linked", "icb_commands", "collect_objects"]

_OBJECT_KINDS = ("device", "queue", "event", "fence", "buffer", "varbuf", "pipeline", "icb", "icbcmd", "resources",
                 "cbslots", "struct", "scratch", "contents", "table")


def _name(x: Any) -> str:
    return x.name if isinstance(x, Obj) else str(x)


def _size3(x: Any, what: str) -> tuple[int, int, int]:
    try:
        vals = tuple(int(v) if not hasattr(v, "const_value") else int(v.const_value()) for v in x)
    except (TypeError, ValueError):
        vals = ()
    if len(vals) != 3:
        raise LinkError(f"{what}: expected 3 integer sizes, got {x!r}")
    return vals[0], vals[1], vals[2]


def icb_commands(spec: IcbSpec) -> tuple[list[IcbCommand], int]:
    """The commands of an ICB placeholder's payload (``mtlir.program.IcbSpec``), checked, and its
    ``maxKernelBufferBindCount`` (``max_bind_count``, else the largest bound index + 1).

    Raises ``LinkError`` naming the command for a payload of another shape or sizes that are not 3 integers."""
    cmds_in = getattr(spec, "commands", None)
    if cmds_in is None:
        raise LinkError(f"ICB payload {spec!r} has no 'commands'")
    cmds: list[IcbCommand] = []
    for i, c in enumerate(cmds_in):
        try:
            bindings = tuple((_name(b[0]), int(b[1]), int(b[2])) for b in c.bindings)
            cmds.append(c._replace(pipeline=_name(c.pipeline), bindings=bindings,
                                   grid=_size3(c.grid, f"icb[{i}] grid"),
                                   threadgroup=_size3(c.threadgroup, f"icb[{i}] threadgroup")))
        except (AttributeError, IndexError, TypeError, ValueError) as e:
            raise LinkError(f"icb[{i}]: cannot read the command {c!r}: {e}") from None
    binds_needed = max((b[2] + 1 for c in cmds for b in c.bindings), default=1)
    return cmds, int(getattr(spec, "max_bind_count", 0) or binds_needed)


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


@dataclass
class Linked:
    """The device objects of one linked Program.

    ``objects``: every placeholder by name (``collect_objects``); ``device``: the MTLDevice; ``registers``: the
    prepared register file (``mtlir.runtime.interpreter.prepare_registers``); ``handles``: name -> handle or host
    address (``"queue"``, ``"buffer:7"``, ``"pipeline:E_5_8_2"``, ``"icb[3]"``,
    ``"cbslots"``, ...); ``names``: the reverse map (for ``RecordingBridge``); ``buffers``: name -> (handle,
    contents address, length in bytes); ``icb``: the ICB's commands as built. ``release()`` gives everything
    back (idempotent)."""

    program: Program
    bridge: Bridge
    objects: dict[str, Obj] = field(default_factory=dict)
    device: int = 0
    registers: list[Any] = field(default_factory=list)
    handles: dict[str, int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    buffers: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    icb: list[IcbCommand] = field(default_factory=list)
    cleanup: list[tuple[str, int, str]] = field(default_factory=list)  # ("release"|"free", value, name)

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
            raise KeyError(f"no buffer named {name!r}: the linked buffers are {', '.join(self.buffers)}")
        _, contents, length = self.buffers[name]
        if offset < 0 or nbytes < 0 or offset + nbytes > length:
            raise ValueError(f"{name}: bytes [{offset}, {offset + nbytes}) are outside its {length} bytes")
        return contents, length

    def read_buffer(self, name: str, offset: int = 0, nbytes: int | None = None) -> bytes:
        """``nbytes`` bytes (default: to the end) of buffer ``name`` from byte ``offset``, through ``contents``.
        Raises ``KeyError`` for an unknown buffer, ``ValueError`` for a range outside it."""
        length = self.buffers[name][2] if name in self.buffers else 0
        contents, _ = self._buffer(name, offset, length - offset if nbytes is None else nbytes)
        return self.bridge.read(contents + offset, length - offset if nbytes is None else nbytes)

    def write_buffer(self, name: str, data: bytes, offset: int = 0) -> None:
        """Copy ``data`` into buffer ``name`` at byte ``offset``; errors as ``read_buffer``."""
        contents, _ = self._buffer(name, offset, len(data))
        self.bridge.write(contents + offset, bytes(data))

    def _send(self, recv: int, selector: str, *args: Any) -> Any:
        b = self.bridge
        return b.msg_send(abi_prototype(selector, b.target), (recv, b.sel_registerName(selector), *args))

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
        buf = int(self._send(self.device, "newBufferWithLength:options:", nbytes, options) or 0)
        if not buf:
            raise LinkError(f"new_buffer {name!r} ({nbytes} bytes): Metal returned nil")
        self.handles[name], self.names[buf] = buf, name
        self.cleanup.append(("release", buf, name))
        namer = getattr(self.bridge, "name_object", None)
        if namer is not None:
            namer(buf, name)
        contents = int(self._send(buf, "contents") or 0)
        self.buffers[name] = (buf, contents, nbytes)
        if data:
            self.bridge.write(contents, bytes(data))
        rset = self.handles.get("residency_set")
        if rset:
            self._send(rset, "addAllocation:", buf)
            self._send(rset, "commit")
        return buf

    def release(self) -> None:
        """Release the objects and free the host memory link made, newest first; errors are collected and
        raised together at the end as one ``LinkError`` (everything is attempted)."""
        errors: list[str] = []
        proto = abi_prototype("release", self.bridge.target)
        sel = self.bridge.sel_registerName("release")
        while self.cleanup:
            how, value, name = self.cleanup.pop()
            try:
                if how == "release":
                    self.bridge.msg_send(proto, (value, sel))
                else:
                    self.bridge.free(value)
            except Exception as e:  # keep going: release everything that can be
                errors.append(f"{name}: {e}")
        if errors:
            raise LinkError("release failed for " + "; ".join(errors))


class _Linker:
    """One run of link: sends the messages and fills a ``Linked``."""

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
        self.structs: dict[int, tuple[Any, ...]] | None = None  # register -> its STRUCT instruction

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

    # ---- the objects

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

    def make_table(self, o: Obj) -> None:
        """A ``table`` placeholder: a host array of one uint64 per payload entry, an int as it is, a name (str or
        Obj) as the handle of that placeholder (e.g. the pipeline of each iteration of a profiled loop)."""
        h = self.out.handles
        missing = [_name(n) for n in o.payload if not isinstance(n, int) and _name(n) not in h]
        if missing:
            raise LinkError(f"{o.name}: names objects link did not make: {', '.join(missing)}")
        values = [n if isinstance(n, int) else h[_name(n)] for n in o.payload]
        table = self.keep(o.name, self.b.malloc(8 * max(len(values), 1)), "free")
        self.region(table, 8 * len(values), o.name)
        self.b.write(table, struct.pack(f"<{len(values)}Q", *values))

    def make_buffer(self, device: int, o: Obj) -> None:
        nbytes = int(o.payload[0]) if o.payload else 0
        if nbytes <= 0:
            raise LinkError(f"{o.name}: a buffer of {nbytes} bytes")
        try:
            made = self.send(device, "newBufferWithLength:options:", nbytes, self.buffer_options)
        except MemoryError:  # the device's (or a recording's) host memory for it could not be allocated
            raise LinkError(f"{o.name} ({nbytes} bytes): not enough memory to create it") from None
        buf = self.keep(o.name, self.checked(made, f"{o.name} ({nbytes} bytes)"))
        contents = self.checked(self.send(buf, "contents"), f"contents of {o.name}")
        self.out.buffers[o.name] = (buf, contents, nbytes)
        if o.kind == "varbuf" and len(o.payload) > 1:  # constant variable values: (byte offset, dtype name, value)
            for offset, dtname, value in o.payload[1]:
                self.b.store(contents + int(offset), dtypes.by_name(dtname), value)
        data = self.initial.get(o.name)
        if data is not None:
            offset, data = (0, data) if isinstance(data, (bytes, bytearray, memoryview)) else data
            if offset < 0 or offset + len(data) > nbytes:
                raise LinkError(f"initial data for {o.name}: {len(data)} bytes at offset {offset} do not fit its "
                                f"{nbytes} bytes")
            self.b.write(contents + offset, bytes(data))

    def make_pipeline(self, device: int, o: Obj) -> None:
        kernel = o.payload[0] if o.payload else None
        if not isinstance(kernel, Kernel):
            raise LinkError(f"{o.name}: the payload is not a Kernel: {o.payload!r}")
        key = kernel.key
        try:
            lib = self.keep(f"library:{key}", self.with_error(f"library of {o.name}", device,
                                                              "newLibraryWithSource:options:error:",
                                                              self.nsstring(kernel.msl), 0))
        except (UnsupportedKernelError, KernelCompileError) as e:  # the simulated device's translator or build
            raise locate(e, f"program {key!r}, kernel function {kernel.function!r}")
        fn = self.keep(f"function:{key}", self.checked(self.send(lib, "newFunctionWithName:",
                                                                 self.nsstring(kernel.function)),
                                                       f"{o.name}: function {kernel.function!r} of its library"))
        desc = self.label(self.checked(self.send(self.b.objc_getClass("MTLComputePipelineDescriptor"), "new"),
                                       f"MTLComputePipelineDescriptor for {o.name}"), f"descriptor:{o.name}")
        try:
            self.send(desc, "setComputeFunction:", fn)
            self.send(desc, "setSupportIndirectCommandBuffers:", True)
            pipe = self.with_error(o.name, device, "newComputePipelineStateWithDescriptor:options:reflection:error:",
                                   desc, 0, 0)
        finally:
            self.send(desc, "release")
        self.keep(o.name, pipe)

    def make_icb(self, device: int, o: Obj) -> None:
        if not o.payload:
            raise LinkError(f"{o.name}: no command list in the payload")
        cmds, bind_count = icb_commands(o.payload[0])
        h = self.out.handles
        desc = self.label(self.checked(self.send(self.b.objc_getClass("MTLIndirectCommandBufferDescriptor"), "new"),
                                       "MTLIndirectCommandBufferDescriptor"), f"descriptor:{o.name}")
        try:
            self.send(desc, "setCommandTypes:", MTL.IndirectCommandTypeConcurrentDispatch)
            self.send(desc, "setInheritBuffers:", False)
            self.send(desc, "setInheritPipelineState:", False)
            self.send(desc, "setMaxKernelBufferBindCount:", bind_count)
            icb = self.keep(o.name, self.checked(
                self.send(device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", desc,
                          max(len(cmds), 1), 0), f"{o.name} ({len(cmds)} commands; a device without ICB support "
                                                 "(paravirtual Metal) needs the direct path: lower with --no-icb)"))
        finally:
            self.send(desc, "release")
        for i, c in enumerate(cmds):
            where = f"{o.name}[{i}] ({c.pipeline})"
            if c.pipeline not in h:
                raise LinkError(f"{where}: no pipeline named {c.pipeline!r}")
            self.check_threadgroup(where, c.pipeline, c.threadgroup)
            cmd = self.keep(f"{o.name}[{i}]", self.checked(self.send(icb, "indirectComputeCommandAtIndex:", i), where))
            self.send(cmd, "retain")  # +0 from the ICB: kept until release
            self.send(cmd, "setComputePipelineState:", h[c.pipeline])
            for buf, offset, index in c.bindings:
                if buf not in self.out.buffers:
                    raise LinkError(f"{where}: binds {buf!r}, which is not a buffer of the Program")
                if not 0 <= offset <= 0xFFFFFFFF:
                    raise LinkError(f"{where}: offset {offset} of {buf} does not fit the ICB's 32 bits")
                handle = self.out.buffers[buf][0]
                self.send(cmd, "setKernelBuffer:offset:atIndex:", handle, offset, index)
            sizes = self.mtlsize(c.grid, c.threadgroup)
            self.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", *sizes)
            if c.barrier:
                self.send(cmd, "setBarrier")
        self.out.icb = cmds

    def check_threadgroup(self, where: str, pipeline: str, threadgroup: tuple[int, ...]) -> None:
        """A constant threadgroup against its pipeline's ``maxTotalThreadsPerThreadgroup`` (asked once per
        pipeline; it can be below 1024): Metal would drop the dispatch silently (METAL.md §3 rule 13)."""
        limit = self.max_threads.get(pipeline)
        if limit is None:
            limit = self.max_threads[pipeline] = int(self.send(self.out.handles[pipeline],
                                                               "maxTotalThreadsPerThreadgroup"))
        if math.prod(threadgroup) > limit:
            raise LinkError(f"{where}: threadgroup {list(threadgroup)} = {math.prod(threadgroup)} threads is more than "
                            f"the pipeline's maxTotalThreadsPerThreadgroup {limit} (Metal would drop the dispatch "
                            "silently: METAL.md §3 rule 13)")

    def check_direct_dispatches(self) -> None:
        """The direct path's ``dispatchThreadgroups:threadsPerThreadgroup:`` messages whose threadgroup is a
        constant, against the pipeline the encoder had bound when they are sent (``setComputePipelineState:`` of a
        pipeline placeholder; a pipeline taken from a register at run time, e.g. a table, leaves the dispatches
        after it to the device's own check). Empty dispatches (the warm-up) are skipped."""
        p = self.p
        current: str | None = None
        for c in p.calls():
            if c.selector == "setComputePipelineState:":
                recv = p.objects.get(c.receiver)
                if recv is not None and recv.kind == "icbcmd":
                    continue  # an ICB command, not the encoder (checked in make_icb)
                arg = p.objects.get(c.args[0]) if c.args else None
                current = arg.name if arg is not None and arg.kind == "pipeline" else None
            elif c.selector == "dispatchThreadgroups:threadsPerThreadgroup:" and current is not None:
                grid, tg = (self.const_size(r) for r in c.args[:2])
                if tg is not None and 0 not in tg and (grid is None or 0 not in grid):
                    self.check_threadgroup(f"dispatch at instruction {c.pc} ({current})", current, tg)

    def const_size(self, reg: int) -> tuple[int, ...] | None:
        """The MTLSize a register holds when it is a constant: a 3-tuple constant (x86_64), a ``struct``
        placeholder (a host copy on arm64) or a STRUCT of constants; None when it is set at run time."""
        p = self.p
        value = p.consts.get(reg)
        if value is None and reg in p.objects and p.objects[reg].kind == "struct":
            value = p.objects[reg].payload
        if value is None:
            if self.structs is None:
                self.structs = {ins[1]: ins for ins in p.instrs if ins[0] == "STRUCT"}
            ins = self.structs.get(reg)
            if ins is not None and all(type(p.consts.get(r)) is int for r in ins[2:]):
                value = tuple(p.consts[r] for r in ins[2:])
        if isinstance(value, tuple) and len(value) == 3 and all(type(v) is int for v in value):
            return value
        return None

    def make_residency_set(self, device: int, by_kind: dict[str, list[Obj]]) -> None:
        desc = self.label(self.checked(self.send(self.b.objc_getClass("MTLResidencySetDescriptor"), "new"),
                                       "MTLResidencySetDescriptor"), "descriptor:residency_set")
        try:
            rset = self.keep("residency_set", self.with_error(
                "residency set (macOS 15 or later; lower with --no-residency-set otherwise)", device,
                "newResidencySetWithDescriptor:error:", desc))
        finally:
            self.send(desc, "release")
        allocations = [self.out.buffers[o.name][0] for o in by_kind.get("buffer", []) + by_kind.get("varbuf", [])]
        allocations += [self.out.handles[o.name] for o in by_kind.get("icb", [])]
        for a in allocations:
            self.send(rset, "addAllocation:", a)
        self.send(rset, "commit")
        for o in by_kind.get("queue", []):
            self.send(self.out.handles[o.name], "addResidencySet:", rset)


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
