"""``barriers``: a barrier on an ICB command only where it depends on an earlier command since the last barrier.

encode gives every ICB command ``setBarrier`` (each command waits for all before it: nothing runs concurrently, as
the reference design does). Metal runs the commands between two barriers of one ``executeCommandsInBuffer:withRange:``
concurrently (METAL.md §3 rule 9), so a command needs a barrier only when it conflicts with a command of the group
it would join: both touch overlapping bytes of one buffer and at least one of them writes them (read-after-write,
write-after-read, write-after-write). This pass rewrites the ICB placeholder (``Obj("icb", …, (IcbSpec,))``) with
``IcbCommand.barrier`` set exactly there; nothing per submit changes (``setBarrier`` is sent once, by link).

What a command touches, per binding ``(placeholder, offset, index)``, on the base buffer, never by view identity:

- the bytes ``[offset, offset + elements × element size)`` when the kernel's ``KernelParam`` declares ``elements``
  (what the kernel reads or writes, checked against the view by encode), else ``[offset, end of the buffer)``;
- written when the kernel's MSL declares the parameter ``device T*`` without ``const`` (``mtlir.msl``'s
  signature); ``const device T*`` and ``constant`` parameters are read-only. A kernel whose signature cannot be read
  (no MSL, a parse error) is taken to write every buffer it binds;
- the variables buffer (``varbuf``: ``constant T&`` slots the CPU writes before the submit) is only read;
- a buffer variable (``IcbCommand.rebound``: a handle given per submit, which may be any buffer) overlaps every
  byte of every buffer, and is written unless its parameter is read-only.

Before / after (``y = f(x); z = g(x); w = h(y)`` with ``y``, ``z`` disjoint views of one buffer)::

    #0 f  bind y=buffer:1+0    barrier yes        #0 f  barrier no
    #1 g  bind z=buffer:1+256  barrier yes   ->   #1 g  barrier no    (reads x, writes other bytes than #0)
    #2 h  reads buffer:1+0     barrier yes        #2 h  barrier yes   (reads what #0 writes: read-after-write)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from mtlir.errors import InputError
from mtlir.ir.ops import Ops
from mtlir.ir.rewrite import graph_rewrite
from mtlir.ir.uop import UOp
from mtlir.ir.upat import PatternMatcher, UPat
from mtlir.metal import Kernel, Obj, element_dtype
from mtlir.msl import kernel_signature
from mtlir.passes.pipeline import Pass, PassContext, register
from mtlir.program.payloads import CommandList, IcbCommand, IcbSpec

__all__ = ["Barriers", "Access", "command_accesses", "place_barriers", "written_indices"]

_ANY = ""  # the buffer of an Access through a buffer variable: any buffer


class Access(NamedTuple):
    """Bytes ``[lo, hi)`` of the buffer placeholder ``buffer`` (``""``: any buffer, a buffer variable) that one
    command reads, or writes when ``write``."""

    buffer: str
    lo: int
    hi: int
    write: bool

    def conflicts(self, other: Access) -> bool:
        """Whether the two accesses touch a common byte of one buffer and at least one writes it."""
        if not (self.write or other.write):
            return False
        if self.buffer and other.buffer and self.buffer != other.buffer:
            return False
        return self.lo < other.hi and other.lo < self.hi


@functools.lru_cache(maxsize=1024)
def written_indices(kernel: Kernel) -> frozenset[int] | None:
    """The Metal buffer indices ``kernel`` may write: its MSL's ``device`` pointer parameters without ``const``
    (``mtlir.msl.kernel_signature``). None when the signature cannot be read (no MSL, or one that does not
    parse): the caller must then assume every buffer is written."""
    if not kernel.msl:
        return None
    try:
        params = kernel_signature(kernel.msl, kernel.function)
    except InputError:
        return None
    return frozenset(p.index for p in params if p.space == "device" and not p.reference and not _const(p.text))


def _const(declaration: str) -> bool:
    """Whether a pointer parameter's declaration makes the pointee const (``const`` before the ``*``)."""
    head = declaration.split("*", 1)[0]
    return "const" in head.replace("(", " ").replace(")", " ").split()


def command_accesses(cmd: IcbCommand, kernel: Kernel | None, sizes: dict[str, int]) -> list[Access]:
    """What ICB command ``cmd`` touches (module docstring). ``kernel``: its pipeline's Kernel (None: unknown, every
    buffer written); ``sizes``: bytes of each buffer placeholder by name (a missing one: to the end of the address
    space)."""
    params = {p.index: p for p in kernel.params} if kernel is not None else {}
    written = written_indices(kernel) if kernel is not None else None
    out: list[Access] = []
    for name, offset, index in cmd.bindings:
        if name == "varbuf":
            continue  # constant T& slots: only read, written by the CPU before the submit
        param = params.get(index)
        end = sizes.get(name, 1 << 64)
        if param is not None and param.elements is not None:
            end = min(end, offset + param.elements * element_dtype(param.dtype).itemsize)
        out.append(Access(name, offset, max(end, offset + 1), written is None or index in written))
    for index in cmd.rebound:
        out.append(Access(_ANY, 0, 1 << 64, written is None or index in written))
    return out


def place_barriers(spec: IcbSpec) -> IcbSpec:
    """``spec`` with a barrier on a command only where one of its accesses conflicts with an access of the
    commands since the last barrier (the first command has none: nothing runs before it in its range)."""
    kernels = {o.name: o.payload[0] for o in spec.pipelines if o.payload and isinstance(o.payload[0], Kernel)}
    sizes = {o.name: int(o.payload[0]) for o in spec.buffers if o.payload and isinstance(o.payload[0], int)}
    group: list[Access] = []
    out: list[IcbCommand] = []
    for i, cmd in enumerate(spec.commands):
        mine = command_accesses(cmd, kernels.get(cmd.pipeline), sizes)
        barrier = i > 0 and any(a.conflicts(b) for a in mine for b in group)
        if barrier:
            group = []
        group += mine
        out.append(cmd if cmd.barrier == barrier else cmd._replace(barrier=barrier))
    if all(a is b for a, b in zip(out, spec.commands)):
        return spec
    return IcbSpec(CommandList(out), spec.pipelines, spec.buffers, spec.max_bind_count)


def _icb(x: UOp) -> UOp | None:
    """An ICB placeholder with its barriers placed (None when they already are)."""
    obj = x.arg
    if not isinstance(obj, Obj) or obj.kind != "icb" or not obj.payload or not isinstance(obj.payload[0], IcbSpec):
        return None
    spec = place_barriers(obj.payload[0])
    if spec is obj.payload[0]:
        return None
    return UOp(Ops.OBJECT, x.dtype, x.src, Obj(obj.kind, obj.name, (spec, *obj.payload[1:])))


# the ICB placeholder -> the same placeholder with barriers only where a command depends on its group
BARRIERS = PatternMatcher([(UPat(Ops.OBJECT, name="x"), _icb)])


@register
@dataclass(frozen=True)
class Barriers(Pass):
    """Barriers only where an ICB command depends on an earlier one since the last barrier (module docstring)."""

    name = "barriers"
    takes = ("messages",)

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        """``graph`` with its ICB placeholder's barriers placed (the graph itself when it has no ICB, or when
        every barrier is needed)."""
        return graph_rewrite(graph, BARRIERS, name="barriers")
