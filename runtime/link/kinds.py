"""What link makes of each kind of placeholder that needs more than one message, one function per kind, each taking
the ``LinkState`` of the run: buffers (filled from the initial data), pipelines (an MSL kernel compiled to a
library, its function, a compute pipeline state), the ICB (its descriptor and every command, ``icb_commands``), the
residency set and ``table`` arrays. The messages and their order are METAL.md §1 and §2; ``mtlir.runtime.link.link``
calls these in its order."""
from __future__ import annotations

import struct
from typing import Any

from mtlir.errors import KernelCompileError, LinkError, UnsupportedKernelError
from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL, Kernel, Obj
from mtlir.program.payloads import IcbCommand, IcbSpec
from mtlir.runtime.link.linked import above_max_buffer_length
from mtlir.runtime.link.state import LinkState, obj_name
from mtlir.runtime.link.threadgroups import check_threadgroup

__all__ = ["icb_commands", "make_buffer", "make_pipeline", "make_icb", "make_residency_set", "make_table"]


def _size3(x: Any, what: str) -> tuple[int, int, int]:
    try:
        vals = tuple(int(v) if not hasattr(v, "const_value") else int(v.const_value()) for v in x)
    except (TypeError, ValueError):
        vals = ()
    if len(vals) != 3:
        raise LinkError(f"{what}: expected 3 integer sizes, got {x!r}")
    return vals[0], vals[1], vals[2]


def icb_commands(spec: IcbSpec) -> tuple[list[IcbCommand], int]:
    """The commands of an ICB placeholder's payload (``mtlir.program.payloads.IcbSpec``), checked, and its
    ``maxKernelBufferBindCount`` (``max_bind_count``, else the largest bound index + 1).

    Raises ``LinkError`` naming the command for a payload of another shape or sizes that are not 3 integers."""
    cmds_in = getattr(spec, "commands", None)
    if cmds_in is None:
        raise LinkError(f"ICB payload {spec!r} has no 'commands'")
    cmds: list[IcbCommand] = []
    for i, c in enumerate(cmds_in):
        try:
            bindings = tuple((obj_name(b[0]), int(b[1]), int(b[2])) for b in c.bindings)
            cmds.append(c._replace(pipeline=obj_name(c.pipeline), bindings=bindings,
                                   grid=_size3(c.grid, f"icb[{i}] grid"),
                                   threadgroup=_size3(c.threadgroup, f"icb[{i}] threadgroup")))
        except (AttributeError, IndexError, TypeError, ValueError) as e:
            raise LinkError(f"icb[{i}]: cannot read the command {c!r}: {e}") from None
    binds_needed = max((b[2] + 1 for c in cmds for b in c.bindings), default=1)
    return cmds, int(getattr(spec, "max_bind_count", 0) or binds_needed)


def make_buffer(ls: LinkState, device: int, o: Obj) -> None:
    """A ``buffer`` or ``varbuf``: ``newBufferWithLength:options:``, ``contents``, then the constant variable values
    of a varbuf's payload and ``initial[o.name]`` written in. ``LinkError`` for a size below 1, a buffer the host
    cannot allocate, nil, or initial data that does not fit."""
    m = ls.messenger
    nbytes = int(o.payload[0]) if o.payload else 0
    if nbytes <= 0:
        raise LinkError(f"{o.name}: a buffer of {nbytes} bytes")
    if o.kind == "buffer" and ls.adopt(o.name):  # a buffer of a DeviceContext: its own, already resident
        buf = ls.out.handles[o.name]
        ls.out.buffers[o.name] = (buf, ls.checked(m.send(buf, "contents"), f"contents of {o.name}"), nbytes)
        return
    try:
        made = m.send(device, "newBufferWithLength:options:", nbytes, ls.buffer_options)
    except MemoryError:  # the device's (or a recording's) host memory for it could not be allocated
        raise LinkError(f"{o.name} ({nbytes} bytes): not enough memory to create it") from None
    if not made:
        above_max_buffer_length(m, device, o.name, nbytes)
    buf = ls.keep(o.name, ls.checked(made, f"{o.name} ({nbytes} bytes)"))
    contents = ls.checked(m.send(buf, "contents"), f"contents of {o.name}")
    ls.out.buffers[o.name] = (buf, contents, nbytes)
    if o.kind == "varbuf" and len(o.payload) > 1:  # constant variable values: (byte offset, dtype name, value)
        for offset, dtname, value in o.payload[1]:
            ls.bridge.store(contents + int(offset), dtypes.by_name(dtname), value)
    data = ls.initial.get(o.name)
    if data is not None:
        offset, data = (0, data) if isinstance(data, (bytes, bytearray, memoryview)) else data
        if offset < 0 or offset + len(data) > nbytes:
            raise LinkError(f"initial data for {o.name}: {len(data)} bytes at offset {offset} do not fit its "
                            f"{nbytes} bytes")
        ls.bridge.write(contents + offset, bytes(data))


def make_pipeline(ls: LinkState, device: int, o: Obj) -> None:
    """A ``pipeline``: its MSL as an NSString, ``newLibraryWithSource:options:error:``, ``newFunctionWithName:``,
    an MTLComputePipelineDescriptor (``setComputeFunction:``, ``setSupportIndirectCommandBuffers: YES``),
    ``newComputePipelineStateWithDescriptor:options:reflection:error:``. A kernel the simulated device cannot
    translate or build gets the program key and kernel function in front of its message."""
    if ls.adopt(o.name):  # compiled once by its owner (a DeviceContext)
        return
    m = ls.messenger
    kernel = o.payload[0] if o.payload else None
    if not isinstance(kernel, Kernel):
        raise LinkError(f"{o.name}: the payload is not a Kernel: {o.payload!r}")
    key = kernel.key
    try:
        source = ls.nsstring(kernel.msl)
        lib = ls.keep(f"library:{key}", ls.with_error(f"library of {o.name}", device,
                                                      "newLibraryWithSource:options:error:", source, 0))
    except (UnsupportedKernelError, KernelCompileError) as e:  # the simulated device's translator or build
        raise e.locate(f"program {key!r}, kernel function {kernel.function!r}")
    fn = ls.keep(f"function:{key}", ls.checked(m.send(lib, "newFunctionWithName:", ls.nsstring(kernel.function)),
                                               f"{o.name}: function {kernel.function!r} of its library"))
    desc = ls.label(ls.checked(m.send(m.cls("MTLComputePipelineDescriptor"), "new"),
                               f"MTLComputePipelineDescriptor for {o.name}"), f"descriptor:{o.name}")
    try:
        m.send(desc, "setComputeFunction:", fn)
        m.send(desc, "setSupportIndirectCommandBuffers:", True)
        pipe = ls.with_error(o.name, device, "newComputePipelineStateWithDescriptor:options:reflection:error:",
                             desc, 0, 0)
    finally:
        m.send(desc, "release")
    ls.keep(o.name, pipe)


def make_icb(ls: LinkState, device: int, o: Obj) -> None:
    """The ``icb``: an MTLIndirectCommandBufferDescriptor (ConcurrentDispatch, inherit nothing, the bind count),
    ``newIndirectCommandBufferWithDescriptor:maxCommandCount:options:``, then per command
    ``indirectComputeCommandAtIndex:`` (retained), ``setComputePipelineState:``, ``setKernelBuffer:offset:atIndex:``
    per binding, ``concurrentDispatchThreadgroups:threadsPerThreadgroup:``, ``setBarrier``. ``LinkError`` for nil
    (naming ``--no-icb``), a pipeline or buffer that is not the Program's, an offset above 32 bits, a threadgroup
    above its pipeline's limit."""
    m = ls.messenger
    if not o.payload:
        raise LinkError(f"{o.name}: no command list in the payload")
    cmds, bind_count = icb_commands(o.payload[0])
    h = ls.out.handles
    desc = ls.label(ls.checked(m.send(m.cls("MTLIndirectCommandBufferDescriptor"), "new"),
                               "MTLIndirectCommandBufferDescriptor"), f"descriptor:{o.name}")
    try:
        m.send(desc, "setCommandTypes:", MTL.IndirectCommandTypeConcurrentDispatch)
        m.send(desc, "setInheritBuffers:", False)
        m.send(desc, "setInheritPipelineState:", False)
        m.send(desc, "setMaxKernelBufferBindCount:", bind_count)
        icb = ls.keep(o.name, ls.checked(
            m.send(device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", desc,
                   max(len(cmds), 1), 0), f"{o.name} ({len(cmds)} commands; the device is out of memory, or has "
                                          "no ICB support (paravirtual Metal): lower with --no-icb)"))
    finally:
        m.send(desc, "release")
    for i, c in enumerate(cmds):
        where = f"{o.name}[{i}] ({c.pipeline})"
        if c.pipeline not in h:
            raise LinkError(f"{where}: no pipeline named {c.pipeline!r}")
        check_threadgroup(ls, where, c.pipeline, c.threadgroup)
        cmd = ls.keep(f"{o.name}[{i}]", ls.checked(m.send(icb, "indirectComputeCommandAtIndex:", i), where))
        m.send(cmd, "retain")  # +0 from the ICB: kept until release
        m.send(cmd, "setComputePipelineState:", h[c.pipeline])
        for buf, offset, index in c.bindings:
            if buf not in ls.out.buffers:
                raise LinkError(f"{where}: binds {buf!r}, which is not a buffer of the Program")
            if not 0 <= offset <= 0xFFFFFFFF:
                raise LinkError(f"{where}: offset {offset} of {buf} does not fit the ICB's 32 bits")
            m.send(cmd, "setKernelBuffer:offset:atIndex:", ls.out.buffers[buf][0], offset, index)
        m.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", c.grid, c.threadgroup)
        if c.barrier:
            m.send(cmd, "setBarrier")
    ls.out.icb = cmds


def make_residency_set(ls: LinkState, device: int, by_kind: dict[str, list[Obj]]) -> None:
    """The residency set: an MTLResidencySetDescriptor, ``newResidencySetWithDescriptor:error:`` (nil names
    ``--no-residency-set``), ``addAllocation:`` of every buffer and the ICB, ``commit``, ``addResidencySet:`` on
    each queue."""
    m = ls.messenger
    allocations = [ls.out.buffers[o.name][0] for o in by_kind.get("buffer", []) + by_kind.get("varbuf", [])
                   if o.name not in ls.shared]  # a shared buffer is its owner's to keep resident
    allocations += [ls.out.handles[o.name] for o in by_kind.get("icb", [])]
    if ls.adopt("residency_set"):  # a shared set, already on the queue: this Program's allocations join it
        rset = ls.out.handles["residency_set"]
        ls.out.cleanup.append(("commit", rset, "residency_set"))  # popped after the removals below
        for a in allocations:
            m.send(rset, "addAllocation:", a)
            ls.out.cleanup.append(("remove", a, ls.out.names.get(a, "allocation")))
        m.send(rset, "commit")
        return
    desc = ls.label(ls.checked(m.send(m.cls("MTLResidencySetDescriptor"), "new"), "MTLResidencySetDescriptor"),
                    "descriptor:residency_set")
    try:
        rset = ls.keep("residency_set", ls.with_error(
            "residency set (macOS 15 or later; lower with --no-residency-set otherwise)", device,
            "newResidencySetWithDescriptor:error:", desc))
    finally:
        m.send(desc, "release")
    for a in allocations:
        m.send(rset, "addAllocation:", a)
    m.send(rset, "commit")
    for o in by_kind.get("queue", []):
        m.send(ls.out.handles[o.name], "addResidencySet:", rset)


def make_table(ls: LinkState, o: Obj) -> None:
    """A ``table`` placeholder: a host array of one uint64 per payload entry, an int as it is, a name (str or
    Obj) as the handle of that placeholder (e.g. the pipeline of each iteration of a profiled loop)."""
    h = ls.out.handles
    missing = [obj_name(n) for n in o.payload if not isinstance(n, int) and obj_name(n) not in h]
    if missing:
        raise LinkError(f"{o.name}: names objects link did not make: {', '.join(missing)}")
    values = [n if isinstance(n, int) else h[obj_name(n)] for n in o.payload]
    table = ls.keep(o.name, ls.bridge.malloc(8 * max(len(values), 1)), "free")
    ls.region(table, 8 * len(values), o.name)
    ls.bridge.write(table, struct.pack(f"<{len(values)}Q", *values))
