"""Shared queues and readers for the lowering tests (``from lowering_cases import ...``).

``small_queue`` builds the three-command queue the golden tests use; ``message_lines`` reads a Program's messages
back as text, one line per CALL in program order (``for``/``end`` around a loop body), with run-time values as
``*`` and MTLSizes as ``[w,h,d]`` whatever the target, so one golden serves arm64 and x86_64.
"""
from __future__ import annotations

from pathlib import Path

from mtlir.ir.dtypes import dtypes
from mtlir.metal import DeviceSpec, Kernel, KernelParam
from mtlir.program.instructions import Call, End, Range
from mtlir.program.program import Program
from mtlir.frontend.nodes import buffer, timeline_value, view
from mtlir.frontend.queue import Queue
from mtlir.ir.uop import UOp

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"

SAXPY = Kernel("saxpy", "saxpy", "kernel void saxpy(device float* x, device float* y, constant int& n) {}",
               (KernelParam(None, 0, "float32"), KernelParam(None, 1, "float32"), KernelParam("n", 2, "int32")))
SCALE = Kernel("scale", "scale", "kernel void scale(device float* x, device float* y) {}",
               (KernelParam(None, 0, "float32"), KernelParam(None, 1, "float32")))
N = UOp.variable("n", 1, 4096)


def small_queue(device: DeviceSpec, *, symbolic: bool = False, timestamps: bool = False,
                far_offset: bool = False) -> UOp:
    """saxpy(x, y[256:]), scale(y, z), saxpy(z, x), then a signal of the timeline. ``symbolic``: the first grid
    is ``(n + 31) // 32`` threadgroups; ``timestamps``: a timestamp before and after each command."""
    big = 1 << 33 if far_offset else 8192
    x, y, z = buffer("x", 8192), buffer("y", big), buffer("z", 4096)
    yv = view(y, (1 << 32) + 256 if far_offset else 256, 4096)
    q = Queue(device)
    grid0: tuple[UOp | int, ...] = ((N + 31) // 32,) if symbolic else (4,)
    cmds = [(SAXPY, [x, yv], [N], grid0, (32,)), (SCALE, [y, z], [], (2, 2), (16, 2)), (SAXPY, [z, x], [N], (8,), (32,))]
    for i, (k, bufs, vars_, grid, tg) in enumerate(cmds):
        if timestamps:
            q.timestamp(2 * i)
        q.exec(k, bufs, vars_, grid, tg)
        if timestamps:
            q.timestamp(2 * i + 1)
    q.signal(q.timeline, timeline_value())
    return q.submit()


def _operand(p: Program, r: int) -> str:
    if r in p.consts:
        v = p.consts[r]
        return "[" + ",".join(map(str, v)) + "]" if isinstance(v, tuple) else str(v)
    obj = p.objects.get(r)
    if obj is not None:
        if obj.kind == "struct":
            return "[" + ",".join(map(str, obj.payload)) + "]"
        if obj.kind == "scratch" and not obj.name.startswith("scratch:inputs"):
            return "*"
        return obj.name
    name = p.names.get(r, "")
    if name in p.variables:
        return name
    if name.startswith(("cmdbuf", "encoder")):
        return name.rstrip("0123456789")
    return "*"


def message_lines(p: Program) -> list[str]:
    """Every objc_msgSend of ``p`` as ``receiver selector arg...`` in program order (module docstring)."""
    out = []
    for ins in p.instrs:
        match ins:
            case Range(bound=bound):
                out.append(f"for {_operand(p, bound)}")
            case End():
                out.append("end")
            case Call(fn="objc_msgSend", args=(recv, sel, *args)):
                out.append(" ".join([_operand(p, recv), p.selectors[sel], *(_operand(p, a) for a in args)]))
    return out


def count_messages(p: Program, unroll: dict[str, int] | None = None) -> int:
    """How many messages one run of ``p`` sends, loops unrolled with their constant bounds."""
    total, stack = 0, [1]
    for ins in p.instrs:
        match ins:
            case Range(bound=bound):
                stack.append(stack[-1] * int(p.consts[bound]))
            case End():
                stack.pop()
            case Call():
                total += stack[-1]
    return total


def u64(v: int) -> UOp:
    return UOp.const(dtypes.uint64, v)
