"""``encode``: a SUBMIT becomes the message chain of METAL.md §1, with its commands as data in one ICB placeholder.

What is known at link time is kept apart from what each submit patches:

- link time (data in placeholders): the ICB (``Obj("icb", "icb", (IcbSpec,))``: per command its pipeline,
  ``setKernelBuffer:offset:atIndex:`` per buffer parameter and per variable — a 256-byte slot of the one variables
  buffer ``varbuf``, bound at the variable's parameter index —, the constant sizes, a barrier), the constant
  variable values (the ``varbuf`` payload), the resource table, constant MTLSizes.
- per submit (nodes before the first ``commandBuffer``): STOREs of the run's variable values into the variables
  buffer's ``contents``; ``concurrentDispatchThreadgroups:threadsPerThreadgroup:`` on each ICB command whose sizes
  depend on variables; ``setKernelBuffer:offset:atIndex:`` on each command binding a buffer variable.

Then per command buffer: ``commandBuffer``, ``retain`` + STORE of it into ``cbslots`` (the runtime checks every
command buffer a submit commits), ``computeCommandEncoder``, ``waitForFence:``, ``useResources:count:usage:``
(only without a residency set), the warm-up pair per distinct pipeline (pre-Apple9), one
``executeCommandsInBuffer:withRange:`` per ``max_range`` commands, ``updateFence:``, ``endEncoding``,
``encodeSignalEvent:value:`` (when a SIGNAL closes it), ``commit``. Messages are ordered by AFTER on their
receiver (``enc.after(previous)``). docs/lowering.md walks through the choices below.

- Command buffers: a SIGNAL closes the current command buffer (so a signal in the middle of a queue is honoured:
  the work before it is done when the event reaches the value). With TIMESTAMPs the submit is profiled: one
  command buffer per command; a run of commands without a signal becomes a loop (RANGE ... END), each iteration
  executing the range of one command and warming up every pipeline of the run.
- ICB offsets above 0xFFFFFFFF do not fit an ICB (METAL.md §3 rule 8): the submit is lowered on the direct path,
  and a diagnostic the pipeline keeps says why. An offset that is not a multiple of the element size is invalid on
  any path (METAL.md §1): ``EncodeError`` naming the command.
- A device without ICB support gets the direct path: per command ``setComputePipelineState:``,
  ``setBuffer:offset:atIndex:`` per buffer, ``setBytes:length:atIndex:`` per variable (a pointer into the variables
  buffer's host memory, patched per submit), ``dispatchThreadgroups:threadsPerThreadgroup:``.

Cost: one visit per queue op and per distinct size, buffer and kernel node (memoized); after encode the graph of
an ICB submit has no per-command nodes except for symbolic commands.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from mtlir.dtypes import DType, dtypes
from mtlir.metal import MTL, SELECTORS, DeviceSpec, Kernel, Obj
from mtlir.ops import Ops
from mtlir.passes.pipeline import Pass, PassContext, register
from mtlir.passes.symbolic import simplify
from mtlir.program import CommandList, IcbCommand, IcbSpec, Stamp
from mtlir.queue import SIZE_OPS, QueueError, check_size, param_dtype, placeholder_name, var_dtype
from mtlir.rewrite import graph_rewrite
from mtlir.upat import PatternMatcher, UPat
from mtlir.uop import UOp

__all__ = ["Encode", "EncodeError", "encode_submit", "VAR_SLOT"]

VAR_SLOT = MTL.CONSTANT_OFFSET_ALIGN  # bytes per variable slot in the variables buffer (256: any family)
MAX_ICB_OFFSET = 0xFFFFFFFF


class EncodeError(ValueError):
    """A queue graph encode cannot lower; the message names the command (its index in the queue) or queue op."""


def msg(selector: str, recv: UOp, *args: UOp) -> UOp:
    """A typed Objective-C message: ``MSG(recv, *args)`` of ``selector``, typed by ``SELECTORS``."""
    return UOp(Ops.MSG, SELECTORS[selector].ret, (recv, *args), selector)


def u64(v: int) -> UOp:
    return UOp.const(dtypes.uint64, v)


def _obj(kind: str, name: str, payload: tuple[object, ...] = (), dtype: DType = dtypes.id) -> UOp:
    return UOp(Ops.OBJECT, dtype, (), Obj(kind, name, payload))


class _Kernel(NamedTuple):
    kernel: Kernel
    pipeline: UOp                               # OBJECT pipeline:KEY
    buffers: tuple[tuple[int, int], ...]        # (parameter index, element size in bytes)
    vars: tuple[tuple[int, DType], ...]         # (parameter index, dtype)
    pids: tuple[int, ...]                       # ids of (index, element size or dtype): buffers then vars
    var_names: tuple[tuple[str, int], ...]      # (variable name, parameter index)
    nsrc: int                                   # sources of its EXEC: 3 + buffers + variables


class _Size(NamedTuple):
    node: UOp                                   # the simplified STRUCT<MTLSize>
    link: tuple[int, int, int]                  # constant entries, 0 where set per submit
    symbolic: bool


class _Bind(NamedTuple):
    base: UOp                                   # BUFFER or buffer variable
    offset: int
    name: str | None                            # placeholder name; None for a buffer variable


class _Cmd(NamedTuple):
    kernel: _Kernel
    grid: _Size
    threadgroup: _Size
    args: tuple[UOp, ...]                       # the EXEC's buffer and variable sources
    icb_binds: tuple[tuple[str, int, int], ...]  # per parameter: (placeholder name, offset, index); "" for a buffer
    symbolic: bool                              # variable (bound per submit); sizes set per submit when symbolic


class _Plan(NamedTuple):
    first: int                                  # first command
    ncmds: int                                  # commands (0: a command buffer that only signals)
    signal: UOp | None                          # the value encodeSignalEvent:value: sends
    loop: bool                                  # a RANGE over `ncmds` one-command buffers


_new = tuple.__new__  # builds a NamedTuple at C speed (its generated __new__ is Python code): per-command records


@dataclass
class _Encoder:
    """Reads one SUBMIT and builds its lowered graph (module docstring)."""

    device: DeviceSpec
    max_range: int
    ctx: PassContext
    cmds: list[_Cmd] = field(default_factory=list)
    kernels: dict[UOp, _Kernel] = field(default_factory=dict)
    keys: dict[str, Kernel] = field(default_factory=dict)
    sizes: dict[UOp, _Size] = field(default_factory=dict)
    binds: dict[UOp, _Bind] = field(default_factory=dict)
    base_names: dict[UOp, str | None] = field(default_factory=dict)   # BUFFER / buffer variable -> placeholder
    icb_binds: dict[tuple[UOp, int], tuple[str, int, int]] = field(default_factory=dict)
    pids: dict[tuple[int, int | DType], int] = field(default_factory=dict)   # kernel parameter -> small id
    param_of: dict[int, tuple[int, int | DType]] = field(default_factory=dict)
    buffers: dict[str, UOp] = field(default_factory=dict)      # placeholder name -> OBJECT, first-use order
    inputs: dict[UOp, int] = field(default_factory=dict)       # buffer variable -> position
    slots: dict[tuple[UOp, DType], int] = field(default_factory=dict)     # (value node, dtype) -> slot
    slot_values: list[tuple[UOp, DType]] = field(default_factory=list)    # slot -> (simplified value, dtype)
    # signals and timestamps by the number of commands before them (the commands themselves are implicit, in order)
    signals: list[tuple[int, UOp]] = field(default_factory=list)          # (position, value)
    stamps_at: list[tuple[int, int, bool]] = field(default_factory=list)  # (position, slot, right after an EXEC)
    timeline: UOp | None = None
    too_far: str = ""

    # ---- reading the queue graph

    def read(self, submit: UOp) -> None:
        """Parse and check every queue op. Raises ``EncodeError`` naming the command."""
        cmds = self.cmds
        after_exec = False
        for op in submit.src:
            if op.op is Ops.EXEC:
                cmds.append(self.read_exec(op, len(cmds)))
                after_exec = True
                continue
            if op.op in (Ops.WAIT, Ops.SIGNAL):
                what = "wait" if op.op is Ops.WAIT else "signal"
                where = f"{what} after command {len(cmds)}"
                if len(op.src) != 2 or not op.src[1].dtype.is_int:
                    raise EncodeError(f"{where}: sources are (event, integer value)")
                ev = op.src[0]
                if ev.op is not Ops.OBJECT or not isinstance(ev.arg, Obj) or ev.arg.kind != "event" \
                        or ev.arg.name != "event":
                    raise EncodeError(f"{where}: only the queue's own timeline (the 'event' placeholder) can be "
                                      f"used; cross-queue events come with multiple queues")
                self.timeline = ev
                if op.op is Ops.SIGNAL:
                    self.signals.append((len(cmds), simplify(op.src[1].cast(dtypes.uint64))))
            elif op.op is Ops.TIMESTAMP:
                if type(op.arg) is not int or op.arg < 0:
                    raise EncodeError(f"timestamp after command {len(cmds)}: the slot must be an int >= 0, "
                                      f"got {op.arg!r}")
                self.stamps_at.append((len(cmds), op.arg, after_exec))
            else:
                raise EncodeError(f"queue op after command {len(cmds)}: {op.op.name} is not a queue op (EXEC, WAIT, "
                                  "SIGNAL, TIMESTAMP)")
            after_exec = False
        if not cmds and not self.signals:
            raise EncodeError("the submit has no command and no signal: nothing to encode")

    def read_exec(self, op: UOp, i: int) -> _Cmd:
        src = op.src
        if len(src) < 3 or src[0].op is not Ops.KERNEL:
            raise EncodeError(f"command {i}: an EXEC's sources are (KERNEL, grid, threadgroup, *buffers, *vars)")
        k = self.kernels.get(src[0]) or self.read_kernel(src[0], i)
        if len(src) != k.nsrc:
            raise EncodeError(f"command {i} ({k.kernel.key}): the kernel takes {len(k.buffers)} buffers and "
                              f"{len(k.vars)} variables, the EXEC has {len(src) - 3} buffer and variable sources")
        grid = self.sizes.get(src[1]) or self.read_size(src[1], f"command {i} ({k.kernel.key}): grid")
        tg = self.sizes.get(src[2]) or self.read_size(src[2], f"command {i} ({k.kernel.key}): threadgroup")
        args = src[3:]
        memo = self.icb_binds
        # one memo lookup per argument: the ICB binding triple of (argument node, parameter)
        binds = [memo.get((b, p)) or self.check_bind(b, p, i, k) for b, p in zip(args, k.pids)]
        return _new(_Cmd, (k, grid, tg, args, tuple(binds), grid.symbolic or tg.symbolic))

    def check_bind(self, b: UOp, pid: int, i: int, k: _Kernel) -> tuple[str, int, int]:
        """The ICB binding of argument ``b`` for parameter ``pid`` (an id of (index, element size or variable
        dtype)), read and checked once per (node, parameter); an offset too far for an ICB is checked again at every
        use."""
        index, kind = self.param_of[pid]

        def where() -> str:  # built only for an error message
            return f"command {i} ({k.kernel.key}): {'variable' if isinstance(kind, DType) else 'buffer'} parameter {index}"
        if isinstance(kind, DType):
            slot = self.slots.get((b, kind))
            if slot is None:
                slot = self.read_var(b, kind, where())
            triple = self.icb_binds[(b, pid)] = ("varbuf", slot * VAR_SLOT, index)
            return triple
        bind = self.binds.get(b) or self.read_buffer(b, where)
        if bind.offset % kind:
            raise EncodeError(f"{where()} is bound at byte offset {bind.offset}, not a multiple of its element size "
                              f"{kind} (METAL.md §1)")
        triple = (bind.name or "", bind.offset, index)
        if bind.offset > MAX_ICB_OFFSET:
            if not self.too_far:
                self.too_far = (f"{where()} binds {bind.name or 'a buffer variable'} at byte offset {bind.offset}, "
                                "above 0xFFFFFFFF, which an ICB command cannot hold (METAL.md §3 rule 8)")
        else:
            self.icb_binds[(b, pid)] = triple
        return triple

    def read_kernel(self, node: UOp, i: int) -> _Kernel:
        kernel = node.arg
        if not isinstance(kernel, Kernel):
            raise EncodeError(f"command {i}: a KERNEL's arg is an mtlir.metal.Kernel, got {type(kernel).__name__}")
        prev = self.keys.setdefault(kernel.key, kernel)
        if prev != kernel:
            raise EncodeError(f"command {i}: two different kernels share the program key {kernel.key!r}")
        try:
            bufs = tuple((p.index, param_dtype(p.dtype).itemsize or 1) for p in kernel.buffer_params)
            vars_ = tuple((p.index, var_dtype(kernel, p, f"command {i}")) for p in kernel.var_params)
        except QueueError as e:
            raise EncodeError(str(e)) from None
        if any(p.index >= MTL.MAX_BUFFER_BIND for p in kernel.params):
            raise EncodeError(f"command {i} ({kernel.key}): buffer indices go up to {MTL.MAX_BUFFER_BIND - 1}")
        pipe = _obj("pipeline", f"pipeline:{kernel.key}", (kernel,))
        names = tuple((p.var or "", p.index) for p in kernel.var_params)
        pids = tuple(self.pids.setdefault(p, len(self.pids)) for p in bufs + vars_)
        self.param_of = {pid: p for p, pid in self.pids.items()}
        k = self.kernels[node] = _Kernel(kernel, pipe, bufs, vars_, pids, names, 3 + len(bufs) + len(vars_))
        return k

    def read_size(self, node: UOp, where: str) -> _Size:
        if node.op is not Ops.STRUCT or node.dtype is not dtypes.MTLSize or len(node.src) != 3:
            raise EncodeError(f"{where}: expected a STRUCT<MTLSize> of three sizes, got {node.op.name}")
        try:
            for axis, f in zip("xyz", node.src):
                check_size(f, f"{where}.{axis}")
        except QueueError as e:
            raise EncodeError(str(e)) from None
        simple = UOp.struct(dtypes.MTLSize, *(f.cast(dtypes.uint64) for f in node.src))
        if any(f.op is not Ops.CONST for f in simple.src):
            simple = simplify(simple)
        for axis, f in zip("xyz", simple.src):
            if f.op is Ops.CONST and f.arg < 1:
                raise EncodeError(f"{where}.{axis}: size {f.arg} is below 1")
        link = tuple(int(f.arg) if f.op is Ops.CONST else 0 for f in simple.src)
        size = self.sizes[node] = _Size(simple, link, any(f.op is not Ops.CONST for f in simple.src))  # type: ignore
        return size

    def read_buffer(self, node: UOp, where: Callable[[], str]) -> _Bind:
        """A buffer argument (BUFFER, BUFFER_VIEW or buffer variable) as (base, byte offset, placeholder name)."""
        base, offset = node, 0
        if node.op is Ops.BUFFER_VIEW:
            if len(node.src) != 1 or not isinstance(node.arg, tuple) or len(node.arg) != 2:
                raise EncodeError(f"{where()}: a BUFFER_VIEW has one source (its buffer) and arg (offset, nbytes)")
            base, (offset, nbytes) = node.src[0], node.arg
            if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 1:
                raise EncodeError(f"{where()}: view offset {offset!r} / size {nbytes!r}: expected ints, offset >= 0, "
                                  "size >= 1")
            if base.op is Ops.BUFFER and offset + nbytes > base.arg[1]:
                raise EncodeError(f"{where()}: view [{offset}, {offset + nbytes}) runs past the end of buffer "
                                  f"{base.arg[0]!r} ({base.arg[1]} bytes)")
        pname = self.base_names.get(base, "?")
        if pname == "?":
            pname = self.read_base(base, where())
        bind = self.binds[node] = _new(_Bind, (base, offset, pname))
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
                self.buffers[bname] = _obj("buffer", bname, (nbytes,))
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
        if not v.dtype.is_int:
            raise EncodeError(f"{where}: a variable value is an integer, got a {v.dtype.name}")
        for u in v.toposort():
            if u.op not in SIZE_OPS:
                raise EncodeError(f"{where}: a variable value must be an integer constant or an expression of "
                                  f"run-time variables, found {u.op.name}")
        value = simplify(v.cast(dt))
        slot = self.slots.get((value, dt))
        if slot is None:
            slot = self.slots[(value, dt)] = len(self.slot_values)
            self.slot_values.append((value, dt))
        self.slots[(v, dt)] = slot
        return slot

    # ---- planning the command buffers

    def plans(self, profiled: bool, loops: bool) -> list[_Plan]:
        """The command buffers of the submit (module docstring); ``loops``: fold runs of one-command buffers
        without a signal into loops."""
        n = len(self.cmds)
        signals = self.signals
        plans: list[_Plan] = []
        if not profiled:
            start = 0
            for pos, val in signals:
                plans.append(_Plan(start, pos - start, val, False))
                start = pos
            if start < n:
                plans.append(_Plan(start, n - start, None, False))
            return plans
        j = 0
        for pos in range(n + 1):
            while j < len(signals) and signals[j][0] == pos:
                last = plans[-1] if plans else None
                if last is not None and last.ncmds and last.signal is None and last.first + last.ncmds == pos:
                    plans[-1] = last._replace(signal=signals[j][1])
                else:
                    plans.append(_Plan(pos, 0, signals[j][1], False))
                j += 1
            if pos < n:
                plans.append(_Plan(pos, 1, None, False))
        if not loops:
            return plans
        out: list[_Plan] = []
        for p in plans:
            prev = out[-1] if out else None
            if p.ncmds == 1 and p.signal is None and prev is not None and prev.signal is None and prev.ncmds >= 1 \
                    and prev.first + prev.ncmds == p.first:
                out[-1] = _Plan(prev.first, prev.ncmds + 1, None, True)
            else:
                out.append(p)
        return out

    def stamps(self, plans: list[_Plan]) -> tuple[Stamp, ...]:
        """Which command buffer's GPU time each timestamp slot gets (``Queue.timestamp``): right after an EXEC its
        end, else the start of the next command, else the end of the last one."""
        n = len(self.cmds)
        cb_of = [0] * n
        slot = 0
        for p in plans:
            for c in range(p.first, p.first + p.ncmds):
                cb_of[c] = slot + (c - p.first if p.loop else 0)
            slot += p.ncmds if p.loop else 1
        out = []
        for pos, stamp_slot, after_exec in self.stamps_at:
            if after_exec or (pos == n and n > 0):
                out.append(Stamp(stamp_slot, cb_of[pos - 1], "GPUEndTime"))
            elif pos < n:
                out.append(Stamp(stamp_slot, cb_of[pos], "GPUStartTime"))
            else:
                raise EncodeError(f"timestamp slot {stamp_slot}: the submit has no command to time")
        return tuple(out)


@dataclass
class _Builder:
    """Builds the message chain of one submit from an ``_Encoder``."""

    e: _Encoder
    icb_path: bool
    queue: UOp = field(default_factory=lambda: _obj("queue", "queue"))
    fence: UOp = field(default_factory=lambda: _obj("fence", "fence"))
    icb: UOp | None = None
    contents: UOp | None = None
    resources: UOp | None = None
    inputs_table: UOp | None = None
    cbslots: UOp | None = None
    varbuf: UOp | None = None

    def slot_ptr(self, slot: int) -> UOp:
        assert self.contents is not None
        return self.contents.index(UOp.const(dtypes.int64, slot * VAR_SLOT))

    # ---- link-time placeholders

    def placeholders(self) -> list[UOp]:
        """Create the placeholders and return the per-submit patches (module docstring)."""
        e = self.e
        patches: list[UOp] = []
        values = e.slot_values
        if values:
            inits = tuple((slot * VAR_SLOT, dt.name, int(v.arg)) for slot, (v, dt) in enumerate(values)
                          if v.op is Ops.CONST)
            self.varbuf = _obj("varbuf", "varbuf", (VAR_SLOT * len(values), inits))
            self.contents = _obj("contents", "contents:varbuf", (self.varbuf.arg,), dtypes.uint8.ptr())
            for slot, (v, dt) in enumerate(values):
                if v.op is not Ops.CONST:
                    patches.append(self.slot_ptr(slot).bitcast(dt.ptr()).store(v))
        if self.icb_path:
            self.icb = _obj("icb", "icb", (self.icb_spec(),))
            for i, c in enumerate(e.cmds):
                rebound = e.inputs and [t for t in c.icb_binds if not t[0]]
                if not (c.symbolic or rebound):
                    continue
                cmd = _obj("icbcmd", f"icb[{i}]", (i,))
                for (index, _), a in zip(c.kernel.buffers, c.args):
                    b = e.binds[a]
                    if b.name is None:
                        patches.append(msg("setKernelBuffer:offset:atIndex:", cmd, b.base, u64(b.offset), u64(index)))
                if c.symbolic:
                    patches.append(msg("concurrentDispatchThreadgroups:threadsPerThreadgroup:", cmd, c.grid.node,
                                       c.threadgroup.node))
            if not e.device.residency_set:
                names = (*e.buffers, *(("varbuf",) if values else ()))
                self.resources = _obj("resources", "resources", names, dtypes.id.ptr())
                if e.inputs:
                    self.inputs_table = _obj("scratch", "scratch:inputs", (8 * len(e.inputs),), dtypes.id.ptr())
                    for var, pos in e.inputs.items():
                        patches.append(self.inputs_table.index(UOp.const(dtypes.int64, pos)).store(var))
        return patches

    def icb_spec(self) -> IcbSpec:
        e = self.e
        if not e.inputs:
            out = [_new(IcbCommand, (c.kernel.pipeline.arg.name, c.icb_binds, c.grid.link, c.threadgroup.link, True,
                                     c.symbolic, c.kernel.var_names, ())) for c in e.cmds]
        else:  # a buffer variable's binding is left to each submit
            out = [IcbCommand(c.kernel.pipeline.arg.name, tuple(t for t in c.icb_binds if t[0]), c.grid.link,
                              c.threadgroup.link, True, c.symbolic, c.kernel.var_names,
                              tuple(t[2] for t in c.icb_binds if not t[0])) for c in e.cmds]
        pipelines = tuple(dict.fromkeys(k.pipeline.arg for k in e.kernels.values()))
        buffers = tuple(o.arg for o in e.buffers.values())
        if self.varbuf is not None:
            buffers += (self.varbuf.arg,)
        top = max((p.index for k in e.kernels.values() for p in k.kernel.params), default=-1)
        return IcbSpec(CommandList(out), pipelines, buffers, top + 1)

    # ---- the message chain

    def warmup(self, enc: list[UOp], first: int, count: int) -> None:
        """setComputePipelineState: + a zero-size dispatch per distinct pipeline of the commands, first use first."""
        zero = UOp.struct(dtypes.MTLSize, 0, 0, 0)
        cmds = self.e.cmds
        if first == 0 and count == len(cmds):  # the whole submit: the kernels in the order encode met them
            pipes = list(dict.fromkeys(k.pipeline for k in self.e.kernels.values()))
        else:
            pipes = list(dict.fromkeys(cmds[c].kernel.pipeline for c in range(first, first + count)))
        for pipe in pipes:
            self.send(enc, "setComputePipelineState:", pipe)
            self.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", zero, zero)

    def send(self, chain: list[UOp], selector: str, *args: UOp) -> UOp:
        """Send ``selector`` to ``chain[0]`` after the message ``chain[1]`` (if any); the chain moves on."""
        recv = chain[0] if len(chain) == 1 else chain[0].after(chain[1])
        m = msg(selector, recv, *args)
        chain[1:] = [m]
        return m

    def direct_commands(self, enc: list[UOp], first: int, count: int) -> None:
        for c in self.e.cmds[first:first + count]:
            self.send(enc, "setComputePipelineState:", c.kernel.pipeline)
            nb = len(c.kernel.buffers)
            for (index, _), a in zip(c.kernel.buffers, c.args[:nb]):
                b = self.e.binds[a]
                handle = self.e.buffers[b.name] if b.name is not None else b.base
                self.send(enc, "setBuffer:offset:atIndex:", handle, u64(b.offset), u64(index))
            for (index, dt), t in zip(c.kernel.vars, c.icb_binds[nb:]):
                self.send(enc, "setBytes:length:atIndex:", self.slot_ptr(t[1] // VAR_SLOT), u64(dt.itemsize),
                          u64(index))
            self.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", c.grid.node, c.threadgroup.node)

    def command_buffer(self, deps: list[UOp], plan: _Plan, slot: UOp, first: UOp | None) -> UOp:
        """One command buffer of ``plan``; ``first``: the first command as a node (the loop counter in a loop).
        Returns its ``commit``."""
        assert self.cbslots is not None
        cb = msg("commandBuffer", self.queue.after(*deps))
        keep = self.cbslots.index(slot).store(msg("retain", cb))
        chain = [cb, keep]
        if plan.ncmds:
            enc = [msg("computeCommandEncoder", cb.after(keep))]
            self.send(enc, "waitForFence:", self.fence)
            if self.resources is not None:
                self.send(enc, "useResources:count:usage:", self.resources, u64(len(self.resources.arg.payload)),
                          u64(MTL.ResourceUsageRead | MTL.ResourceUsageWrite))
            if self.inputs_table is not None:
                self.send(enc, "useResources:count:usage:", self.inputs_table, u64(len(self.e.inputs)),
                          u64(MTL.ResourceUsageRead | MTL.ResourceUsageWrite))
            if self.icb_path:
                if self.e.device.needs_warmup:
                    self.warmup(enc, plan.first, plan.ncmds)
                assert self.icb is not None
                if first is not None:
                    self.send(enc, "executeCommandsInBuffer:withRange:", self.icb,
                              UOp.struct(dtypes.NSRange, first, u64(1)))
                else:
                    end = plan.first + plan.ncmds
                    for j in range(plan.first, end, self.e.max_range):
                        self.send(enc, "executeCommandsInBuffer:withRange:", self.icb,
                                  UOp.struct(dtypes.NSRange, j, min(self.e.max_range, end - j)))
            else:
                self.direct_commands(enc, plan.first, plan.ncmds)
            self.send(enc, "updateFence:", self.fence)
            chain[1] = self.send(enc, "endEncoding")
        if plan.signal is not None:
            assert self.e.timeline is not None
            self.send(chain, "encodeSignalEvent:value:", self.e.timeline, plan.signal)
        return self.send(chain, "commit")

    def build(self) -> UOp:
        e = self.e
        profiled = bool(e.stamps_at)
        plans = e.plans(profiled, loops=profiled and self.icb_path)
        stamps = e.stamps(plans) if profiled else ()
        ncbs = sum(p.ncmds if p.loop else 1 for p in plans)
        self.cbslots = _obj("cbslots", "cbslots", (ncbs, stamps), dtypes.id.ptr())
        deps = self.placeholders()
        slot = 0
        for p in plans:
            if p.loop:
                rng = UOp.range(u64(p.ncmds).after(*deps), self.e.ctx.fresh("range"), dtypes.uint64)
                cmd = rng + p.first if p.first else rng
                body = self.command_buffer([rng], p, (rng + slot if slot else rng).cast(dtypes.int64), cmd)
                deps = [rng.end(body)]
                slot += p.ncmds
            else:
                deps = [self.command_buffer(deps, p, UOp.const(dtypes.int64, slot), None)]
                slot += 1
        return UOp.sink(*deps, arg=e.device)


def encode_submit(ctx: _EncodeCtx, submit: UOp) -> UOp:
    """Lower one SUBMIT (module docstring). Raises ``EncodeError`` naming the command at fault."""
    device = submit.arg
    if not isinstance(device, DeviceSpec):
        raise EncodeError(f"a SUBMIT's arg is the DeviceSpec, got {type(device).__name__}")
    e = _Encoder(device, ctx.max_range, ctx.pass_ctx)
    e.read(submit)
    icb_path = device.icb and bool(e.cmds)
    if icb_path and e.too_far:
        ctx.pass_ctx.diagnostics.append(f"encode: {e.too_far}: the submit is lowered on the direct path")
        icb_path = False
    return _Builder(e, icb_path).build()


@dataclass(frozen=True)
class _EncodeCtx:
    max_range: int
    pass_ctx: PassContext


# a SUBMIT becomes the argument layout, the ICB placeholder and the message chain of METAL.md §1
ENCODE = PatternMatcher([(UPat(Ops.SUBMIT, name="submit"), encode_submit)])


@register
@dataclass(frozen=True)
class Encode(Pass):
    """SUBMIT -> the message chain (module docstring). ``max_range``: commands per
    ``executeCommandsInBuffer:withRange:`` (Apple's maximum, 16,384; smaller values exercise the chunking)."""

    name = "encode"
    max_range: int = MTL.MAX_ICB_RANGE

    def __post_init__(self) -> None:
        if not 1 <= self.max_range <= MTL.MAX_ICB_RANGE:
            raise ValueError(f"max-range {self.max_range} must be in [1, {MTL.MAX_ICB_RANGE}]")

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        return graph_rewrite(graph, ENCODE, ctx=_EncodeCtx(self.max_range, ctx), name="encode")
