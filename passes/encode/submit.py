"""Reading a SUBMIT for ``encode``: its commands checked and resolved to ICB bindings.

``SubmitReader.read(submit)`` visits each queue op once, and each distinct kernel, size, buffer, view and
variable node once (memoized by node): per command it keeps its ICB record as link will take it, an
``IcbCommand`` — a shared ``IcbShape`` (the pipeline, the placeholder name and index of each binding, the sizes,
constant or set by each submit; one per distinct kind of command, with its kernel layout and ``Size`` records in
``kinds``) and the byte offset of each binding, a variable's being its 256-byte slot of the variables buffer —
and its EXEC node (``execs``): ~100 bytes per command, where a record per command of everything read (``Command``)
beside the ICB's own record was ~260; ``command(i)`` rebuilds that record for the paths that want it (the records:
``mtlir.passes.encode.commands``). Once every
queue is read, ``check_events`` refuses waits that can never complete (``mtlir.passes.encode.events``);
``command_buffers`` and ``stamps`` cut the submit into command buffers (``mtlir.passes.encode.spans``). Every
problem raises ``EncodeError`` naming the command.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from mtlir.ir.bounds import bounds, expr_text
from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import MTL, DeviceSpec, Kernel, Obj
from mtlir.ir.ops import Ops
from mtlir.passes.encode.commands import (MAX_ICB_OFFSET, VAR_SLOT, Binding, Blit, Command, EncodeError, KernelLayout,
                                          QueueRange, Size, placeholder, where)
from mtlir.program.payloads import IcbCommand, IcbShape
from mtlir.passes.pipeline import PassContext
from mtlir.passes.symbolic import simplify
from mtlir.frontend.nodes import QueueError, placeholder_name, timeline_name
from mtlir.frontend.checks import MAX_THREADS, check_size, check_threads, check_var_value, param_dtype, var_dtype
from mtlir.ir.uop import UOp

__all__ = ["SubmitReader"]

# module constants: ``Ops.X`` is a ~50 ns metaclass lookup on Python 3.11, paid per queue op
_BUFFER_VIEW, _SIGNAL, _WAIT, _CONST, _COPY, _FILL = Ops.BUFFER_VIEW, Ops.SIGNAL, Ops.WAIT, Ops.CONST, Ops.COPY, Ops.FILL
_U64 = dtypes.uint64
_new = tuple.__new__  # builds a NamedTuple at C speed (its generated __new__ is Python code): per-command records

# an argument's ICB binding as check_bind finds it: (byte offset, part), ``part`` the id of (placeholder name, extent)
# in ``SubmitReader.parts`` (what a command's kind holds of that argument; the index is its parameter's)
Pair = tuple[int, int]


@dataclass
class SubmitReader:
    """Reads one SUBMIT (module docstring): ``read(submit)`` fills the records below, which ``check_events``
    (``events``) and ``command_buffers``/``stamps`` (``spans``) then take."""

    device: DeviceSpec
    max_range: int
    ctx: PassContext
    cmds: list[IcbCommand] = field(default_factory=list)       # per command: its ICB record (module docstring)
    execs: list[UOp] = field(default_factory=list)             # per command: its EXEC node
    shapes: dict[tuple[object, ...], IcbShape] = field(default_factory=dict)  # (KERNEL, grid, tg, *parts) -> kind
    kinds: dict[int, tuple[KernelLayout, Size, Size]] = field(default_factory=dict)  # id(IcbShape) -> its records
    pipes: dict[str, UOp] = field(default_factory=dict)        # IcbShape.pipeline -> the pipeline placeholder
    parts: dict[tuple[str, int], int] = field(default_factory=dict)  # (placeholder name, extent) -> part id
    part_list: list[tuple[str, int]] = field(default_factory=list)   # part id -> (placeholder name, extent)
    kernels: dict[UOp, KernelLayout] = field(default_factory=dict)
    keys: dict[str, Kernel] = field(default_factory=dict)
    grids: dict[UOp, Size] = field(default_factory=dict)       # grid STRUCT -> Size
    tgs: dict[UOp, Size] = field(default_factory=dict)         # threadgroup STRUCT -> Size
    grid_hi: list[int] = field(default_factory=lambda: [1, 1, 1])  # per axis: the largest grid / threadgroup size
    tg_hi: list[int] = field(default_factory=lambda: [1, 1, 1])
    binds: dict[UOp, Binding] = field(default_factory=dict)    # BUFFER / buffer variable -> Binding (views: binding())
    base_names: dict[UOp, str | None] = field(default_factory=dict)   # BUFFER / buffer variable -> placeholder
    pids: dict[tuple[int, int | DType, int], int] = field(default_factory=dict)  # parameter (KernelLayout.pids): id
    memos: list[dict[UOp, Pair]] = field(default_factory=list)  # per pid: node -> ICB binding (``Pair``)
    param_of: dict[int, tuple[int, int | DType, int]] = field(default_factory=dict)
    buffers: dict[str, UOp] = field(default_factory=dict)      # placeholder name -> OBJECT, first-use order
    inputs: dict[UOp, int] = field(default_factory=dict)       # buffer variable -> position
    slots: dict[tuple[UOp, DType], int] = field(default_factory=dict)     # (value node, dtype) -> slot
    slot_values: list[tuple[UOp, DType]] = field(default_factory=list)    # slot -> (simplified value, dtype)
    # signals and timestamps by the number of commands before them (the commands themselves are implicit, in order)
    signals: list[tuple[int, UOp]] = field(default_factory=list)          # (position, value)
    marks: list[tuple[int, str, UOp, UOp]] = field(default_factory=list)  # (position, signal|wait, value, event)
    queues: list[QueueRange] = field(default_factory=list)                # the queues read, in order
    blits: dict[UOp, Blit] = field(default_factory=dict)                  # COPY / FILL node -> its message
    # per TIMESTAMP: position, slot, 1 right after an EXEC (else 0), flat in one array: 24 bytes per timestamp, not a
    # tuple and two ints (~100); ``stamps()`` reads them back as triples
    stamps_at: array[int] = field(default_factory=lambda: array("q"))
    timeline: UOp | None = None
    # waits on a queue's own timeline (encoded as nothing): (queue name, position in its queue, value, event, how
    # many of its queue's marks come before it)
    own_waits: list[tuple[str | None, int, UOp, UOp, int]] = field(default_factory=list)
    too_far: str = ""

    # ---- reading the queue graph

    def read(self, submit: UOp) -> None:
        """Parse and check every queue op of one queue (SUBMIT; its tag names the queue), after the queues read
        before. Raises ``EncodeError`` naming the command."""
        cmds, execs, shapes = self.cmds, self.execs, self.shapes
        qname = submit.tag
        if qname is not None and (not isinstance(qname, str) or not qname.isidentifier()):
            raise EncodeError(f"a SUBMIT's tag is its queue's name (an identifier) or None, got {qname!r}")
        own = timeline_name(qname)
        first, nmarks = len(cmds), len(self.marks)
        label = "" if qname is None else f" of queue {qname!r}"
        after_exec = False
        kernels, grids, tgs, memos, check = self.kernels, self.grids, self.tgs, self.memos, self.check_bind
        exec_op, stamp_op = Ops.EXEC, Ops.TIMESTAMP
        events: set[UOp] = set()  # event placeholders checked (check_event_op)
        for op in submit.src:
            if op.op is exec_op:
                after_exec = True
                # the fast path: kernel and sizes seen before, so only the arguments are looked up (one memo
                # lookup each: the ICB binding of that node for that parameter)
                src = op.src
                k = kernels.get(src[0])
                if k is not None and len(src) == k.nsrc:
                    grid, tg = grids.get(src[1]), tgs.get(src[2])
                    if grid is not None and tg is not None:
                        binds = [memos[p].get(b) or check(b, p, k) for b, p in zip(src[3:], k.pids)]
                        offsets, parts = zip(*binds) if binds else ((), ())  # the columns, at C speed
                        shape = shapes.get((src[0], src[1], src[2], parts))
                        if shape is None:
                            shape = self.new_shape(src, k, grid, tg, binds)
                        cmds.append(_new(IcbCommand, (shape,) + offsets))
                        execs.append(op)
                        continue
                self.read_exec(op, len(cmds))
                continue
            if op.op is stamp_op:  # before the other queue ops: a profiled submit has one per command
                if type(op.arg) is not int or not 0 <= op.arg < 1 << 63:
                    raise EncodeError(f"timestamp after command {len(cmds)}: the slot must be an int >= 0 (below "
                                      f"2**63), got {op.arg!r}")
                self.stamps_at.extend((len(cmds), op.arg, after_exec))
            elif op.op is _SIGNAL or op.op is _WAIT:
                ev = op.src[0] if len(op.src) == 2 else None
                if ev is None or ev not in events or not op.src[1].dtype.is_int:
                    self.check_event_op(op, f"{'wait' if op.op is _WAIT else 'signal'} after command "
                                            f"{len(cmds) - first}{label}")
                    events.add(op.src[0])
                    ev = op.src[0]
                if ev.arg.name == own:
                    self.timeline = ev
                value = op.src[1]
                if value.op is not _CONST or value.dtype is not _U64:  # a uint64 constant is simplified already
                    value = simplify(value.cast(_U64))
                if op.op is _SIGNAL:
                    self.signals.append((len(cmds), value))
                    self.marks.append((len(cmds), "signal", value, ev))
                elif ev.arg.name != own:
                    self.marks.append((len(cmds), "wait", value, ev))
                else:
                    self.own_waits.append((qname, len(cmds) - first, value, ev, len(self.marks) - nmarks))
            elif op.op is _COPY or op.op is _FILL:
                what = "copy" if op.op is Ops.COPY else "fill"
                self.blits[op] = self.read_blit(op, f"{what} after command {len(cmds) - first}{label}")
                self.marks.append((len(cmds), "blit", op, op))
            else:
                raise EncodeError(f"queue op after command {len(cmds)}: {op.op.name} is not a queue op (EXEC, WAIT, "
                                  "SIGNAL, TIMESTAMP, COPY, FILL)")
            after_exec = False
        if len(cmds) == first and len(self.marks) == nmarks:
            raise EncodeError(f"the submit{label} has no command and no signal: nothing to encode")
        self.queues.append(QueueRange(qname, first, len(cmds), tuple(self.marks[nmarks:])))
        if any(g * t > MAX_THREADS for g, t in zip(self.grid_hi, self.tg_hi)):
            self.check_threads()


    @staticmethod
    def check_event_op(op: UOp, where: str) -> None:
        """A WAIT or SIGNAL's layout: ``(event placeholder, integer value)``; raises ``EncodeError`` at ``where``."""
        if len(op.src) != 2 or not op.src[1].dtype.is_int:
            raise EncodeError(f"{where}: sources are (event, integer value)")
        ev = op.src[0]
        if ev.op is not Ops.OBJECT or not isinstance(ev.arg, Obj) or ev.arg.kind != "event" \
                or not (ev.arg.name == "event" or ev.arg.name.startswith("event:")):
            raise EncodeError(f"{where}: the event must be an event placeholder ('event' or 'event:<name>': "
                              "a queue's timeline or a shared_event)")

    def read_blit(self, op: UOp, where: str) -> Blit:
        """A COPY or FILL as its blit message: the buffers' placeholders (or buffer variables), offsets and sizes
        simplified, each byte range inside its buffer for every value of the variables."""
        n = 5 if op.op is Ops.COPY else 3
        if len(op.src) != n or any(not b.dtype.is_int for b in op.src[1::2]):
            layout = "(src, src_offset, dst, dst_offset, size)" if n == 5 else "(buffer, offset, size)"
            raise EncodeError(f"{where}: a {op.op.name}'s sources are {layout}, offsets and size integers")
        size = simplify(op.src[-1].cast(dtypes.uint64))
        targets = [(op.src[0], op.src[1])] + ([(op.src[2], op.src[3])] if n == 5 else [])
        args: list[UOp] = []
        for buf, off in targets:
            name = self.base_names.get(buf, "?")
            if name == "?":
                name = self.read_base(buf, where)
            offset = simplify(off.cast(dtypes.uint64))
            limit = buf.arg[1] if buf.op is Ops.BUFFER else None
            top = bounds(offset)[1] + bounds(size)[1]
            if limit is not None and top > limit:
                raise EncodeError(f"{where}: bytes up to {top} run past the end of buffer {buf.arg[0]!r} ({limit} "
                                  "bytes)")
            args += [self.buffers[name] if name is not None else buf, offset]
        if bounds(size)[0] < 1:
            raise EncodeError(f"{where}: the size {expr_text(size)} can be 0; a blit moves at least one byte")
        if n == 5:
            return Blit("copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", (*args, size))
        if type(op.arg) is not int or not 0 <= op.arg <= 255:
            raise EncodeError(f"{where}: a FILL's arg is the byte value (0..255), got {op.arg!r}")
        return Blit("fillBuffer:range:value:", (args[0], UOp.struct(dtypes.NSRange, args[1], size),
                                                UOp.const(dtypes.uint8, op.arg)))

    def check_threads(self) -> None:
        """Find the command whose grid x threadgroup can exceed 2**32-1 threads on an axis (``read`` calls this only
        when the largest grid and threadgroup seen could) and raise ``EncodeError`` naming it."""
        seen: set[tuple[int, int]] = set()
        kinds = self.kinds
        for i, c in enumerate(self.cmds):
            k, grid, tg = kinds[id(c[0])]
            if (id(grid), id(tg)) in seen:
                continue
            seen.add((id(grid), id(tg)))
            try:
                check_threads(grid.ranges, tg.ranges, grid.node, tg.node, f"command {i} ({k.kernel.key})")
            except QueueError as e:
                raise EncodeError(str(e)) from None

    def new_shape(self, src: tuple[UOp, ...], k: KernelLayout, grid: Size, tg: Size, binds: list[Pair]) -> IcbShape:
        """The kind of a command (``IcbShape``) of kernel ``k``, sizes ``grid`` and ``tg`` and bindings ``binds``,
        made once per distinct ``(KERNEL, grid, threadgroup, parts)`` of the EXEC's sources ``src``."""
        parts = [self.part_list[t[1]] for t in binds]
        indices = tuple([index for index, _ in k.buffers] + [index for index, _ in k.vars])
        shape = IcbShape(k.pipeline.arg.name, tuple([name for name, _ in parts]), indices, grid.link, tg.link, True,
                         grid.symbolic or tg.symbolic, k.var_names, (), tuple([extent for _, extent in parts]))
        self.shapes[(src[0], src[1], src[2], tuple([t[1] for t in binds]))] = shape
        self.kinds[id(shape)] = (k, grid, tg)
        return shape

    def part(self, name: str, extent: int) -> int:
        """The id of ``(placeholder name, extent)`` in ``parts`` (made at its first use)."""
        got = self.parts.get((name, extent))
        if got is None:
            got = self.parts[(name, extent)] = len(self.part_list)
            self.part_list.append((name, extent))
        return got

    def command(self, i: int) -> Command:
        """Everything read of command ``i`` as one record (``Command``), made anew at each call."""
        c = self.cmds[i]
        shape = c[0]
        k, grid, tg = self.kinds[id(shape)]
        return _new(Command, (k, grid, tg, self.execs[i], tuple(zip(shape.names, c[1:], shape.indices)),
                              shape.symbolic))

    def commands(self, first: int, count: int) -> list[Command]:
        """``command(i)`` for the commands ``first .. first+count-1``."""
        return [self.command(i) for i in range(first, first + count)]

    def read_exec(self, op: UOp, i: int) -> None:
        """Command ``i`` from its EXEC (the slow path: a kernel or size not met before, or a bad layout), appended
        to ``cmds`` and ``execs``."""
        src = op.src
        if len(src) < 3 or src[0].op is not Ops.KERNEL:
            raise EncodeError(f"command {i}: an EXEC's sources are (KERNEL, grid, threadgroup, *buffers, *vars)")
        k = self.kernels.get(src[0]) or self.read_kernel(src[0], i)
        if len(src) != k.nsrc:
            raise EncodeError(f"command {i} ({k.kernel.key}): the kernel takes {len(k.buffers)} buffers and "
                              f"{len(k.vars)} variables, the EXEC has {len(src) - 3} buffer and variable sources")
        grid = self.grids.get(src[1]) or self.read_size(src[1], f"command {i} ({k.kernel.key})", "grid")
        tg = self.tgs.get(src[2]) or self.read_size(src[2], f"command {i} ({k.kernel.key})", "threadgroup")
        binds = [self.memos[p].get(b) or self.check_bind(b, p, k) for b, p in zip(src[3:], k.pids)]
        shape = self.shapes.get((src[0], src[1], src[2], tuple([t[1] for t in binds])))
        if shape is None:
            shape = self.new_shape(src, k, grid, tg, binds)
        self.cmds.append(_new(IcbCommand, (shape, *[t[0] for t in binds])))
        self.execs.append(op)

    def check_bind(self, b: UOp, pid: int, k: KernelLayout) -> Pair:
        """The ICB binding of argument ``b`` of the next command (kernel ``k``) for parameter ``pid`` (an id of
        (index, element size, bytes the parameter needs) or (index, variable dtype, 0)) as a ``Pair``, read and
        checked once per (node, parameter); an offset too far for an ICB is checked again at every use."""
        i = len(self.cmds)
        index, kind, need = self.param_of[pid]
        if b.op is _BUFFER_VIEW and type(kind) is int and len(b.src) == 1 and type(arg := b.arg) is tuple \
                and len(arg) == 2:  # a view on a BUFFER read before: often one per command, so not memoized
            offset, nbytes = arg
            pname = self.base_names.get(b.src[0])
            if type(pname) is str and type(offset) is int and type(nbytes) is int and 0 <= offset \
                    and 1 <= nbytes and need <= nbytes and offset + nbytes <= b.src[0].arg[1] and not offset % kind \
                    and offset <= MAX_ICB_OFFSET:
                part = self.parts.get((pname, nbytes))
                if part is None:
                    part = self.part(pname, nbytes)
                return (offset, part)  # every check of the general path below passed
        if isinstance(kind, DType):
            slot = self.slots.get((b, kind))
            if slot is None:
                slot = self.read_var(b, kind, where(i, k, index, "variable"))
            pair = self.memos[pid][b] = (slot * VAR_SLOT, self.part("varbuf", 0))
            return pair
        bind = self.binds.get(b) or self.read_buffer(b, (i, k, index, "buffer"))
        if need:
            have = b.arg[1] if b.op in (Ops.BUFFER, Ops.BUFFER_VIEW) else None
            if have is not None and have < need:
                raise EncodeError(f"{where(i, k, index, 'buffer')} takes {need} bytes (KernelParam.elements), but "
                                  f"the {'view' if b.op is Ops.BUFFER_VIEW else 'buffer'} bound to it holds {have}")
        offset = bind.offset
        if isinstance(offset, UOp):  # bound per submit: the device checks its alignment then (rule 8)
            hi = bounds(offset)[1]
            if hi > MAX_ICB_OFFSET and not self.too_far:
                self.too_far = (f"{where(i, k, index, 'buffer')} binds a buffer variable at byte offset "
                                f"{expr_text(offset)}, up to {hi}, above 0xFFFFFFFF, which an ICB command cannot hold "
                                "(METAL.md §3 rule 8)")
            return (0, self.part("", _extent(b)))
        if offset % kind:
            raise EncodeError(f"{where(i, k, index, 'buffer')} is bound at byte offset {offset}, not a multiple of its "
                              f"element size {kind} (METAL.md §1)")
        pair = (offset, self.part(bind.name or "", _extent(b)))
        if offset > MAX_ICB_OFFSET:
            if not self.too_far:
                self.too_far = (f"{where(i, k, index, 'buffer')} binds {bind.name or 'a buffer variable'} at byte "
                                f"offset {offset}, above 0xFFFFFFFF, which an ICB command cannot hold (METAL.md §3 "
                                "rule 8)")
        else:
            self.memos[pid][b] = pair
        return pair

    def read_kernel(self, node: UOp, i: int) -> KernelLayout:
        """A KERNEL node's pipeline placeholder and parameter layout, checked once."""
        kernel = node.arg
        if not isinstance(kernel, Kernel):
            raise EncodeError(f"command {i}: a KERNEL's arg is an mtlir.metal.Kernel, got {type(kernel).__name__}")
        prev = self.keys.setdefault(kernel.key, kernel)
        if prev != kernel:
            raise EncodeError(f"command {i}: two different kernels share the program key {kernel.key!r}")
        try:
            bufs = tuple((p.index, param_dtype(p.dtype).itemsize or 1) for p in kernel.buffer_params)
            vars_ = tuple((p.index, var_dtype(kernel, p, f"command {i}")) for p in kernel.var_params)
            var_keys = tuple((index, dt, 0) for index, dt in vars_)
            needs = tuple((index, elem, (p.elements or 0) * elem)  # bytes a buffer parameter's `elements` need
                          for (index, elem), p in zip(bufs, kernel.buffer_params))
        except QueueError as e:
            raise EncodeError(str(e)) from None
        if any(p.index >= MTL.MAX_BUFFER_BIND for p in kernel.params):
            raise EncodeError(f"command {i} ({kernel.key}): buffer indices go up to {MTL.MAX_BUFFER_BIND - 1}")
        pipe = placeholder("pipeline", f"pipeline:{kernel.key}", (kernel,))
        self.pipes[pipe.arg.name] = pipe
        names = tuple((p.var or "", p.index) for p in kernel.var_params)
        pids = tuple(self.pids.setdefault(p, len(self.pids)) for p in needs + var_keys)
        self.memos += [{} for _ in range(len(self.pids) - len(self.memos))]
        self.param_of = {pid: p for p, pid in self.pids.items()}
        k = self.kernels[node] = KernelLayout(kernel, pipe, bufs, vars_, pids, names, 3 + len(bufs) + len(vars_))
        return k

    def read_size(self, node: UOp, at: str, role: str) -> Size:
        """A grid or threadgroup (``role``) STRUCT, checked and simplified once per role (a threadgroup has at most
        1024 threads); ``at`` names the command."""
        where = f"{at}: {role}"
        if node.op is not Ops.STRUCT or node.dtype is not dtypes.MTLSize or len(node.src) != 3:
            raise EncodeError(f"{where}: expected a STRUCT<MTLSize> of three sizes, got {node.op.name}")
        try:
            ranges = tuple(check_size(f, f"{where}.{axis}") for axis, f in zip("xyz", node.src))
            if role == "threadgroup":
                check_threads(((1, 1),) * 3, ranges, UOp.struct(dtypes.MTLSize, 1, 1, 1), node, at)
        except QueueError as e:
            raise EncodeError(str(e)) from None
        top = self.grid_hi if role == "grid" else self.tg_hi
        for a, (_, hi) in enumerate(ranges):
            top[a] = max(top[a], hi)
        simple = UOp.struct(dtypes.MTLSize, *(f.cast(dtypes.uint64) for f in node.src))
        if any(f.op is not Ops.CONST for f in simple.src):
            simple = simplify(simple)
        for axis, f in zip("xyz", simple.src):
            if f.op is Ops.CONST and f.arg < 1:
                raise EncodeError(f"{where}.{axis}: size {f.arg} is below 1")
        link = tuple(int(f.arg) if f.op is Ops.CONST else 0 for f in simple.src)
        size = Size(simple, link, any(f.op is not Ops.CONST for f in simple.src), ranges)  # type: ignore[arg-type]
        (self.grids if role == "grid" else self.tgs)[node] = size
        return size

    def read_buffer(self, node: UOp, at: tuple[int, KernelLayout, int, str]) -> Binding:
        """A buffer argument (BUFFER, BUFFER_VIEW or buffer variable) as (base, byte offset, placeholder name)."""
        base, offset = node, 0
        if node.op is Ops.BUFFER_VIEW and len(node.src) == 2:  # an offset bound per submit (frontend view)
            return self.variable_view(node, at)
        if node.op is Ops.BUFFER_VIEW:
            if len(node.src) != 1 or not isinstance(node.arg, tuple) or len(node.arg) != 2:
                raise EncodeError(f"{where(*at)}: a BUFFER_VIEW has one source (its buffer) and arg (offset, nbytes)")
            base, (offset, nbytes) = node.src[0], node.arg
            if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 1:
                raise EncodeError(f"{where(*at)}: view offset {offset!r} / size {nbytes!r}: expected ints, "
                                  "offset >= 0, size >= 1")
            if base.op is Ops.BUFFER and offset + nbytes > base.arg[1]:
                raise EncodeError(f"{where(*at)}: view [{offset}, {offset + nbytes}) runs past the end of buffer "
                                  f"{base.arg[0]!r} ({base.arg[1]} bytes)")
        pname = self.base_names.get(base, "?")
        if pname == "?":
            pname = self.read_base(base, where(*at))
        bind = _new(Binding, (base, offset, pname))
        if node.op is not Ops.BUFFER_VIEW:  # a view's is rebuilt by binding(): views are often one per command
            self.binds[node] = bind
        return bind

    def variable_view(self, node: UOp, at: tuple[int, KernelLayout, int, str]) -> Binding:
        """The Binding of a view on a buffer variable whose offset is an expression of run-time variables (uint64,
        simplified): bound per submit with the buffer variable, never in the ICB at link."""
        base, off = node.src
        if base.op is not Ops.DEFINE_VAR or base.dtype is not dtypes.id or not off.dtype.is_int:
            raise EncodeError(f"{where(*at)}: a view with a variable offset is (buffer variable, integer offset)")
        offset = simplify(off.cast(dtypes.uint64))
        if bounds(offset)[0] < 0:
            raise EncodeError(f"{where(*at)}: view offset {expr_text(offset)} can be below 0")
        if base not in self.base_names:
            self.read_base(base, where(*at))
        bind = _new(Binding, (base, offset, None))
        self.binds[node] = bind
        return bind

    def binding(self, node: UOp) -> Binding:
        """The Binding of a buffer argument read before (``read_buffer``)."""
        bind = self.binds.get(node)
        if bind is None:
            base = node.src[0]
            return _new(Binding, (base, node.arg[0], self.base_names[base]))
        return bind

    def read_base(self, base: UOp, where: str) -> str | None:
        """The placeholder name of a BUFFER (its OBJECT made once), None for a buffer variable."""
        if base.op is Ops.BUFFER:
            name, nbytes = base.arg if isinstance(base.arg, tuple) and len(base.arg) == 2 else (None, None)
            if not isinstance(name, str) or type(nbytes) is not int or nbytes < 1:
                raise EncodeError(f"{where}: a BUFFER's arg is (name, nbytes >= 1), got {base.arg!r}")
            bname = placeholder_name(base)
            obj = self.buffers.get(bname)
            if obj is None:
                self.buffers[bname] = placeholder("buffer", bname, (nbytes,))
            elif obj.arg.payload[0] != nbytes:
                raise EncodeError(f"{where}: two buffers are named {name!r}, of {obj.arg.payload[0]} and {nbytes} "
                                  "bytes")
            pname: str | None = bname
        elif base.op is Ops.DEFINE_VAR and base.dtype is dtypes.id:
            self.inputs.setdefault(base, len(self.inputs))
            pname = None
        else:
            raise EncodeError(f"{where}: {base.op.name}<{base.dtype.name}> is not a buffer (BUFFER, BUFFER_VIEW or a "
                              "buffer variable)")
        self.base_names[base] = pname
        return pname

    def read_var(self, v: UOp, dt: DType, where: str) -> int:
        """The variables-buffer slot of value ``v`` as ``dt`` (one slot per distinct simplified value)."""
        if not v.dtype.is_int:
            raise EncodeError(f"{where}: a variable value is an integer, got a {v.dtype.name}")
        try:
            check_var_value(v, dt, where)
        except QueueError as e:
            raise EncodeError(str(e)) from None
        value = simplify(v.cast(dt))
        slot = self.slots.get((value, dt))
        if slot is None:
            slot = self.slots[(value, dt)] = len(self.slot_values)
            self.slot_values.append((value, dt))
        self.slots[(v, dt)] = slot
        return slot


def _extent(a: UOp) -> int:
    """``IcbCommand.extents`` of an argument: the bytes of a view or buffer from its offset (a view's size, a
    buffer's size), 0 for a buffer variable (its size is known at run time only) and for a variable's value."""
    if a.op is _BUFFER_VIEW or a.op is Ops.BUFFER:
        arg = a.arg
        if type(arg) is tuple and len(arg) == 2 and type(arg[1]) is int:
            return arg[1]
    return 0
