"""Hand-written Programs for the runtime tests: a small builder of ``mtlir.program.program.Program`` and a submit shaped
like METAL.md §1 over an ICB, independent of the passes (so the runtime is tested on its own)."""
from __future__ import annotations

from typing import Any

from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj, abi_prototype, c_prototype
from mtlir.ir.ops import Ops
from mtlir.program.instructions import Alu, Call, Cast, End, Index, Instr, Load, Range, Store, Struct
from mtlir.program.payloads import CommandList, IcbCommand, IcbSpec
from mtlir.program.program import Program


class PB:
    """Program builder: each method appends one instruction and returns its destination register."""

    def __init__(self, target: str = "arm64", device: DeviceSpec | None = None) -> None:
        self.target = target
        self.device = device or DeviceSpec()
        self.instrs: list[Instr] = []
        self.n = 0
        self.consts: dict[int, Any] = {}
        self.objects: dict[int, Obj] = {}
        self.obj_regs: dict[str, int] = {}
        self.selectors: dict[int, str] = {}
        self.sel_regs: dict[str, int] = {}
        self.variables: dict[str, tuple[int, int, int]] = {}

    def reg(self) -> int:
        self.n += 1
        return self.n - 1

    def const(self, v: Any) -> int:
        r = self.reg()
        self.consts[r] = v
        return r

    def obj(self, o: Obj) -> int:
        if o.name not in self.obj_regs:
            self.obj_regs[o.name] = r = self.reg()
            self.objects[r] = o
        return self.obj_regs[o.name]

    def var(self, name: str, lo: int, hi: int) -> int:
        r = self.reg()
        self.variables[name] = (r, lo, hi)
        return r

    def sel(self, name: str) -> int:
        if name not in self.sel_regs:
            self.sel_regs[name] = r = self.reg()
            self.selectors[r] = name
        return self.sel_regs[name]

    def msg(self, recv: int, selector: str, *args: int) -> int:
        proto = abi_prototype(selector, self.target)
        sel = self.sel(selector)
        dst = self.reg() if proto.ret is not dtypes.void else -1
        self.instrs.append(Call(dst, "objc_msgSend", proto, (recv, sel, *args)))
        return dst

    def ccall(self, fn: str, *args: int) -> int:
        proto = c_prototype(fn)
        dst = self.reg() if proto.ret is not dtypes.void else -1
        self.instrs.append(Call(dst, fn, proto, args))
        return dst

    def alu(self, op: Ops, dtype: DType, *srcs: int) -> int:
        self.instrs.append(Alu(dst := self.reg(), op, dtype, srcs))
        return dst

    def cast(self, dtype: DType, src: int) -> int:
        self.instrs.append(Cast(dst := self.reg(), dtype, src))
        return dst

    def struct(self, *fields: int) -> int:
        self.instrs.append(Struct(dst := self.reg(), fields))
        return dst

    def store(self, dtype: DType, addr: int, val: int) -> None:
        self.instrs.append(Store(dtype, addr, val))

    def load(self, dtype: DType, addr: int) -> int:
        self.instrs.append(Load(dst := self.reg(), dtype, addr))
        return dst

    def index(self, itemsize: int, base: int, idx: int) -> int:
        self.instrs.append(Index(dst := self.reg(), itemsize, base, idx))
        return dst

    def range(self, end: int) -> tuple[int, int]:
        """A loop of ``end`` iterations: its counter register and the pc of its RANGE (for ``end``)."""
        self.instrs.append(Range(dst := self.reg(), end, -1))
        return dst, len(self.instrs) - 1

    def end(self, loop: tuple[int, int]) -> None:
        counter, pc = loop
        self.instrs.append(End(counter, pc))
        head = self.instrs[pc]
        assert type(head) is Range
        self.instrs[pc] = Range(head.dst, head.bound, len(self.instrs) - 1)

    def mtlsize(self, w: int, h: int, d: int) -> int:
        """A constant MTLSize argument as the target passes it: a host copy (arm64) or a STRUCT value."""
        if self.target == "x86_64":
            return self.struct(self.const(w), self.const(h), self.const(d))
        return self.obj(Obj("struct", f"mtlsize[{w},{h},{d}]", (w, h, d)))

    def build(self) -> Program:
        return Program(list(self.instrs), self.n, dict(self.consts), dict(self.objects), dict(self.selectors),
                       dict(self.variables), self.target, self.device)


COPY_MSL = """#include <metal_stdlib>
using namespace metal;
kernel void add1(device float* out, device float* inp, constant int& n, uint3 gid [[threadgroup_position_in_grid]],
                 uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 4 + lid.x;
  if (i < n) out[i] = inp[i] + 1.0f;
}
"""
# add1 with a bug: it writes out[i + n], past the end of a 64-float buffer for n > 32 (Metal: a GPU address fault)
OVERRUN_MSL = COPY_MSL.replace("out[i] = inp[i]", "out[i + n] = inp[i]")


def submit_program(target: str = "arm64", *, kernels: int = 2, residency_set: bool = True, family: str = "Apple7",
                   symbolic: bool = True, nbytes: int = 256, grid_minus: int | None = None,
                   msl: str = COPY_MSL) -> Program:
    """A submit of ``kernels`` ICB commands over two buffers, shaped like METAL.md §1: commandBuffer,
    computeCommandEncoder, waitForFence:, useResources (without a residency set), the warm-up (before Apple9),
    the symbolic sizes on icb[0] (grid = ceil(n / 4)), executeCommandsInBuffer:withRange:, updateFence:,
    endEncoding, encodeSignalEvent:value:, commit; the command buffer is retained and stored into ``cbslots``.
    Variables:
    ``n`` (elements, 1..64, written to the variables buffer) and ``timeline``. ``grid_minus``: icb[0]'s grid is
    ``n - grid_minus`` in uint64 instead, which wraps to 2**64 - k below ``grid_minus`` (a size expression gone
    below 1, as a lowering bug would make it). ``msl``: the library of kernel ``add1`` (another body with the same
    signature, e.g. one that writes past its buffer)."""
    dev = DeviceSpec(family, residency_set=residency_set)
    p = PB(target, dev)
    kern = Kernel("add1", "add1", msl, (KernelParam(None, 0), KernelParam(None, 1), KernelParam("n", 2, "int32")))
    pipe = Obj("pipeline", "pipeline:add1", (kern,))
    bufs = (Obj("buffer", "buffer:0", (nbytes,)), Obj("buffer", "buffer:1", (nbytes,)), Obj("varbuf", "varbuf", (256,)))
    cmds = tuple(IcbCommand(pipe.name, ((bufs[i % 2].name, 0, 0), (bufs[(i + 1) % 2].name, 0, 1), ("varbuf", 0, 2)),
                            (nbytes // 16, 1, 1), (4, 1, 1)) for i in range(kernels))
    icb = Obj("icb", "icb", (IcbSpec(CommandList(cmds), (pipe,), bufs, 3),))
    n = p.var("n", 1, 64)
    tl = p.var("timeline", 0, 2**62)
    queue, fence, event = (p.obj(Obj(k, k)) for k in ("queue", "fence", "event"))
    vb = p.obj(Obj("contents", "contents:varbuf", ("varbuf",)))
    p.store(dtypes.int32, vb, n)
    cb = p.msg(queue, "commandBuffer")
    slots = p.obj(Obj("cbslots", "cbslots", (1, ())))
    p.store(dtypes.uint64, slots, p.msg(cb, "retain"))  # the runtime releases what cbslots holds
    enc = p.msg(cb, "computeCommandEncoder")
    p.msg(enc, "waitForFence:", fence)
    if not residency_set:
        res = p.obj(Obj("resources", "resources", tuple(b.name for b in bufs) + ("icb",)))
        p.msg(enc, "useResources:count:usage:", res, p.const(len(bufs) + 1), p.const(3))
    if dev.needs_warmup:
        zero = p.mtlsize(0, 0, 0)
        p.msg(enc, "setComputePipelineState:", p.obj(pipe))
        p.msg(enc, "dispatchThreadgroups:threadsPerThreadgroup:", zero, zero)
    if symbolic:
        c3, c1, c4 = p.const(3), p.const(1), p.const(4)
        groups = p.alu(Ops.IDIV, dtypes.uint64, p.alu(Ops.ADD, dtypes.uint64, n, c3), c4) if grid_minus is None \
            else p.alu(Ops.SUB, dtypes.uint64, n, p.const(grid_minus))
        if target == "x86_64":
            g, t = p.struct(groups, c1, c1), p.struct(c4, c1, c1)
        else:
            scratch = p.obj(Obj("scratch", "scratch:48", (48,)))
            p.store(dtypes.uint64, scratch, groups)
            p.store(dtypes.uint64, p.index(8, scratch, p.const(1)), c1)
            p.store(dtypes.uint64, p.index(8, scratch, p.const(2)), c1)
            t = p.index(8, scratch, p.const(3))
            for k, v in enumerate((c4, c1, c1)):
                p.store(dtypes.uint64, p.index(8, t, p.const(k)), v)
            g = scratch
        p.msg(p.obj(Obj("icbcmd", "icb[0]", (0,))), "concurrentDispatchThreadgroups:threadsPerThreadgroup:", g, t)
    p.msg(enc, "executeCommandsInBuffer:withRange:", p.obj(icb), p.const(0), p.const(kernels))
    p.msg(enc, "updateFence:", fence)
    p.msg(enc, "endEncoding")
    p.msg(cb, "encodeSignalEvent:value:", event, tl)
    p.msg(cb, "commit")
    return p.build()


def direct_program(target: str = "arm64", *, grid: tuple[int, int, int] = (4, 1, 1),
                   threadgroup: tuple[int, int, int] | None = (4, 1, 1), family: str = "Apple7") -> Program:
    """A direct-path submit (no ICB: setComputePipelineState:, setBuffer:offset:atIndex: per buffer,
    dispatchThreadgroups:threadsPerThreadgroup:) of ``add1`` over two buffers, a constant ``grid`` and a constant
    ``threadgroup`` (None: the threadgroup is ``(tg, 1, 1)`` with ``tg`` a variable in 1..1024, set per submit).
    Variables: ``n`` (elements, 1..64), ``timeline`` (and ``tg``)."""
    dev = DeviceSpec(family, residency_set=False, icb=False)
    p = PB(target, dev)
    kern = Kernel("add1", "add1", COPY_MSL, (KernelParam(None, 0), KernelParam(None, 1), KernelParam("n", 2, "int32")))
    pipe = p.obj(Obj("pipeline", "pipeline:add1", (kern,)))
    bufs = [p.obj(Obj("buffer", f"buffer:{i}", (256,))) for i in range(2)] + [p.obj(Obj("varbuf", "varbuf", (256,)))]
    n = p.var("n", 1, 64)
    tl = p.var("timeline", 0, 2**62)
    queue, fence, event = (p.obj(Obj(k, k)) for k in ("queue", "fence", "event"))
    p.store(dtypes.int32, p.obj(Obj("contents", "contents:varbuf", ("varbuf",))), n)
    cb = p.msg(queue, "commandBuffer")
    p.store(dtypes.uint64, p.obj(Obj("cbslots", "cbslots", (1, ()))), p.msg(cb, "retain"))
    enc = p.msg(cb, "computeCommandEncoder")
    p.msg(enc, "waitForFence:", fence)
    p.msg(enc, "setComputePipelineState:", pipe)
    zero = p.const(0)
    for i, buf in enumerate(bufs):
        p.msg(enc, "setBuffer:offset:atIndex:", buf, zero, p.const(i))
    if threadgroup is not None:
        tg = p.mtlsize(*threadgroup)
    else:
        width = p.cast(dtypes.uint64, p.var("tg", 1, 1024))
        one = p.const(1)
        if target == "x86_64":
            tg = p.struct(width, one, one)
        else:
            tg = p.obj(Obj("scratch", "scratch:24", (24,)))
            p.store(dtypes.uint64, tg, width)
            p.store(dtypes.uint64, p.index(8, tg, one), one)
            p.store(dtypes.uint64, p.index(8, tg, p.const(2)), one)
    p.msg(enc, "dispatchThreadgroups:threadsPerThreadgroup:", p.mtlsize(*grid), tg)
    p.msg(enc, "updateFence:", fence)
    p.msg(enc, "endEncoding")
    p.msg(cb, "encodeSignalEvent:value:", event, tl)
    p.msg(cb, "commit")
    return p.build()
