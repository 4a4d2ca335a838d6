"""What link makes of each kind of placeholder that needs more than one message: buffers (filled from the initial
data), pipelines (an MSL kernel compiled to a library, its function, a compute pipeline state), the ICB (its
descriptor and every command, ``icb_commands``), the residency set and ``table`` arrays; with the check of every
constant threadgroup against its pipeline's ``maxTotalThreadsPerThreadgroup`` (ICB commands and direct dispatches).
The messages and their order are METAL.md §1 and §2; ``mtlir.runtime.link.link`` drives them."""
from __future__ import annotations

import math
import struct
from typing import Any

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL, Kernel, Obj
from mtlir.program.instructions import Struct
from mtlir.program.payloads import IcbCommand, IcbSpec
from mtlir.errors import KernelCompileError, LinkError, UnsupportedKernelError
from mtlir.runtime.link.state import LinkerBase, _name

__all__ = ["icb_commands", "KindBuilders"]


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
            bindings = tuple((_name(b[0]), int(b[1]), int(b[2])) for b in c.bindings)
            cmds.append(c._replace(pipeline=_name(c.pipeline), bindings=bindings,
                                   grid=_size3(c.grid, f"icb[{i}] grid"),
                                   threadgroup=_size3(c.threadgroup, f"icb[{i}] threadgroup")))
        except (AttributeError, IndexError, TypeError, ValueError) as e:
            raise LinkError(f"icb[{i}]: cannot read the command {c!r}: {e}") from None
    binds_needed = max((b[2] + 1 for c in cmds for b in c.bindings), default=1)
    return cmds, int(getattr(spec, "max_bind_count", 0) or binds_needed)


class KindBuilders(LinkerBase):
    """The builders of the placeholder kinds (``make_buffer``, ``make_pipeline``, ``make_icb``,
    ``make_residency_set``, ``make_table``) and the threadgroup checks, for ``mtlir.runtime.link.link``'s driver."""

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
            raise e.locate(f"program {key!r}, kernel function {kernel.function!r}")
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
                self.structs = {ins.dst: ins for ins in p.instrs if type(ins) is Struct}
            ins = self.structs.get(reg)
            if ins is not None and all(type(p.consts.get(r)) is int for r in ins.fields):
                value = tuple(p.consts[r] for r in ins.fields)
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
