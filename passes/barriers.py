"""``barriers``: a barrier on an ICB command only where it depends on an earlier command since the last barrier.

encode gives every ICB command ``setBarrier`` (each command waits for all before it: nothing runs concurrently, as
the reference design does). Metal runs the commands between two barriers of one ``executeCommandsInBuffer:withRange:``
concurrently (METAL.md §3 rule 9), so a command needs a barrier only when it conflicts with a command of the group
it would join: both touch overlapping bytes of one buffer and at least one of them writes them (read-after-write,
write-after-read, write-after-write). This pass rewrites the ICB placeholder (``Obj("icb", …, (IcbSpec,))``) with
``IcbCommand.barrier`` set exactly there; nothing per submit changes (``setBarrier`` is sent once, by link).

What a command touches, per binding ``(placeholder, offset, index)``, on the base buffer, never by view identity:

- the bytes ``[offset, offset + size)`` of the view bound there (``IcbCommand.extents``: a view's size, a buffer's
  size), narrowed to ``elements × element size`` when the kernel's ``KernelParam`` declares ``elements`` (what the
  kernel reads or writes, checked against the view by encode); ``[offset, end of the buffer)`` when neither is
  known;
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

import bisect
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
from mtlir.program.payloads import CommandList, IcbCommand, IcbShape, IcbSpec

__all__ = ["Barriers", "Access", "command_accesses", "place_barriers", "written_indices"]

_ANY = ""  # the buffer of an Access through a buffer variable: any buffer
_BIG = 1 << 64  # past the end of any buffer
_SMALL = 12  # a group of at most this many accesses is scanned; a larger one keeps interval sets per buffer


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


class _Kernel(NamedTuple):
    """What the pass needs of one pipeline's kernel: the bytes each buffer index may touch from its offset (an index
    missing: to the end of the buffer) and the indices it writes (None: unknown, every one)."""

    extent: dict[int, int]
    written: frozenset[int] | None


def _kernel_facts(kernel: Kernel | None) -> _Kernel:
    if kernel is None:
        return _Kernel({}, None)
    extent = {p.index: p.elements * element_dtype(p.dtype).itemsize for p in kernel.params
              if p.var is None and p.elements is not None}
    return _Kernel(extent, written_indices(kernel))


def command_accesses(cmd: IcbCommand, kernel: Kernel | None, sizes: dict[str, int]) -> list[Access]:
    """What ICB command ``cmd`` touches (module docstring). ``kernel``: its pipeline's Kernel (None: unknown, every
    buffer written); ``sizes``: bytes of each buffer placeholder by name (a missing one: to the end of the address
    space)."""
    return [Access(*t) for t in _accesses(cmd, _kernel_facts(kernel), sizes)]


def _accesses(cmd: IcbCommand, k: _Kernel, sizes: dict[str, int]) -> list[tuple[str, int, int, bool]]:
    """``command_accesses`` as plain ``(buffer, lo, hi, write)`` tuples (the pass's loop makes one list per command)."""
    out: list[tuple[str, int, int, bool]] = []
    shape = cmd[0]  # IcbCommand.shape: the fields but the offsets, which follow it
    written, extent, views, names = k.written, k.extent, shape.extents, shape.names
    get, every = sizes.get, written is None
    if len(views) < len(names):  # extents left out (an IcbCommand built by hand): the bytes to the end
        views = (*views, *(0,) * (len(names) - len(views)))
    for name, offset, index, view in zip(names, cmd[1:], shape.indices, views):
        if name == "varbuf":
            continue  # constant T& slots: only read, written by the CPU before the submit
        end = get(name, _BIG)
        if extent:
            n = extent.get(index)
            if n is not None and offset + n < end:
                end = offset + n
        if view and offset + view < end:
            end = offset + view
        out.append((name, offset, end if end > offset else offset + 1, every or index in written))  # type: ignore[operator]
    for index in shape.rebound:
        out.append((_ANY, 0, _BIG, every or index in written))  # type: ignore[operator]
    return out


_Template = tuple[tuple[str, int, int, "int | None", int, bool], ...]


def _template(shape: IcbShape, k: _Kernel, sizes: dict[str, int]) -> _Template:
    """What ``_accesses`` finds of every command of kind ``shape`` but its offsets: per binding that is not the
    variables buffer ``(buffer, position of its offset in the command, buffer size, the kernel's extent there (None:
    none), the view's extent (0: none), written)``, then per rebound index ``("", 0, 0, None, 0, written)``."""
    written, extent, views, names = k.written, k.extent, shape.extents, shape.names
    every = written is None
    out = []
    for j, (name, index) in enumerate(zip(names, shape.indices)):
        if name == "varbuf":
            continue  # constant T& slots: only read, written by the CPU before the submit
        view = views[j] if j < len(views) else 0  # extents left out (an IcbCommand built by hand): to the end
        out.append((name, 1 + j, sizes.get(name, _BIG), extent.get(index) if extent else None, view,
                    every or index in written))  # type: ignore[operator]
    out += [("", 0, 0, None, 0, every or index in written) for index in shape.rebound]  # type: ignore[operator]
    return tuple(out)


def _accesses_of(cmd: IcbCommand, template: _Template) -> list[tuple[str, int, int, bool]]:
    """``_accesses`` from the command's kind's ``_template``: only the offsets are read per command."""
    out = []
    for name, at, end, n, view, w in template:
        if not at:  # a buffer variable: any buffer, all of it
            out.append((_ANY, 0, _BIG, w))
            continue
        lo = cmd[at]
        if n is not None and lo + n < end:
            end = lo + n
        if view and lo + view < end:
            end = lo + view
        out.append((name, lo, end if end > lo else lo + 1, w))
    return out


class _Intervals:
    """A union of byte ranges kept as sorted, disjoint ``[starts[i], ends[i])``: an overlap test and an insertion
    cost a bisection (so a group of 100,000 commands on slices of one buffer stays linear-logarithmic)."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def overlaps(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_right(self.starts, lo) - 1
        if i >= 0 and self.ends[i] > lo:
            return True
        return i + 1 < len(self.starts) and self.starts[i + 1] < hi

    def add(self, lo: int, hi: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_left(ends, lo)          # the first range that ends at or after lo: merges from there
        j = bisect.bisect_right(starts, hi)       # ranges starting after hi stay
        if i < j:
            lo, hi = min(lo, starts[i]), max(hi, ends[j - 1])
        starts[i:j], ends[i:j] = [lo], [hi]


class _Group:
    """The accesses of the commands since the last barrier, as ``(buffer, lo, hi, write)`` tuples: a plain list
    while the group is small (scanned), then per buffer the union of the bytes read and of the bytes written
    (``_Intervals``), and whether any command reads or writes through a buffer variable (any buffer)."""

    __slots__ = ("small", "reads", "writes", "any_read", "any_write")

    def __init__(self) -> None:
        self.small: list[tuple[str, int, int, bool]] | None = []
        self.reads: dict[str, _Intervals] = {}
        self.writes: dict[str, _Intervals] = {}
        self.any_read = self.any_write = False

    def conflicts(self, mine: list[tuple[str, int, int, bool]]) -> bool:
        """Whether an access of ``mine`` conflicts with one of the group (``Access.conflicts``)."""
        small = self.small
        if small is not None:
            for name, lo, hi, w in mine:
                for other, olo, ohi, ow in small:
                    if (w or ow) and lo < ohi and olo < hi and (name == other or not name or not other):
                        return True
            return False
        for name, lo, hi, w in mine:
            if not name:  # a buffer variable: any buffer
                if self.any_write or self.writes or (w and (self.any_read or self.reads)):
                    return True
                continue
            if self.any_write or (w and self.any_read):
                return True
            iv = self.writes.get(name)
            if iv is not None and iv.overlaps(lo, hi):
                return True
            iv = self.reads.get(name) if w else None
            if iv is not None and iv.overlaps(lo, hi):
                return True
        return False

    def add(self, mine: list[tuple[str, int, int, bool]]) -> None:
        """Add the accesses of one command."""
        small = self.small
        if small is not None:
            small += mine
            if len(small) <= _SMALL:
                return
            self.small, mine = None, small
        for name, lo, hi, w in mine:
            if not name:
                if w:
                    self.any_write = True
                else:
                    self.any_read = True
                continue
            table = self.writes if w else self.reads
            iv = table.get(name)
            if iv is None:
                iv = table[name] = _Intervals()
            iv.add(lo, hi)


def place_barriers(spec: IcbSpec) -> IcbSpec:
    """``spec`` with a barrier on a command only where one of its accesses conflicts with an access of the
    commands since the last barrier (the first command has none: nothing runs before it in its range). A group
    beyond a few accesses costs a bisection per access: linear-logarithmic in the commands, however many share one
    group."""
    facts = {o.name: _kernel_facts(o.payload[0]) for o in spec.pipelines
             if o.payload and isinstance(o.payload[0], Kernel)}
    unknown = _Kernel({}, None)
    sizes = {o.name: int(o.payload[0]) for o in spec.buffers if o.payload and isinstance(o.payload[0], int)}
    small: list[tuple[str, int, int, bool]] = []  # the group's accesses while it is small (scanned inline) ...
    group: _Group | None = None                    # ... then its _Group (interval sets)
    out: list[IcbCommand] = []
    changed = False
    new = tuple.__new__
    twins: dict[int, IcbShape] = {}  # id(IcbShape) -> the same kind with the other barrier
    templates: dict[int, _Template] = {}  # id(IcbShape) -> _template
    for cmd in spec.commands:
        shape = cmd[0]
        template = templates.get(id(shape))  # the shapes live as long as spec: an id is its own
        if template is None:
            template = templates[id(shape)] = _template(shape, facts.get(shape.pipeline, unknown), sizes)
        mine = _accesses_of(cmd, template)
        if group is None:  # _Group.conflicts of a small group, inline (a group is often one command)
            barrier = False
            for name, lo, hi, w in mine:
                for other, olo, ohi, ow in small:
                    if (w or ow) and lo < ohi and olo < hi and (name == other or not name or not other):
                        barrier = True
                        break
                if barrier:
                    break
        else:
            barrier = group.conflicts(mine)
        if barrier:
            small, group = mine, None
        elif group is not None:
            group.add(mine)
        else:
            small += mine
            if len(small) > _SMALL:
                group = _Group()
                group.add(small)
        if shape.barrier != barrier:  # the command of the twin kind, its offsets shared (IcbCommand.of, inline)
            twin = twins.get(id(shape))
            if twin is None:
                twin = twins[id(shape)] = shape._replace(barrier=barrier)
            cmd, changed = new(IcbCommand, (twin, *cmd[1:])), True
        out.append(cmd)
    if not changed:
        return spec
    return IcbSpec(CommandList(out), spec.pipelines, spec.buffers, spec.max_bind_count)


def _icb(ctx: set[int], x: UOp) -> UOp | None:
    """An ICB placeholder with its barriers placed (None when this rewrite placed them already: ``ctx`` holds the
    placeholders it made, so the fixed point does not read the command list a second time)."""
    obj = x.arg
    if id(obj) in ctx or not isinstance(obj, Obj) or obj.kind != "icb" or not obj.payload \
            or not isinstance(obj.payload[0], IcbSpec):
        return None
    spec = place_barriers(obj.payload[0])
    if spec is obj.payload[0]:
        ctx.add(id(obj))
        return None
    placed = UOp(Ops.OBJECT, x.dtype, x.src, Obj(obj.kind, obj.name, (spec, *obj.payload[1:])))
    ctx.add(id(placed.arg))  # hash-consing may give back an equal node made earlier: its own arg
    return placed


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
        return graph_rewrite(graph, BARRIERS, ctx=set(), name="barriers")
