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
  executing the range of one command, warming up only that command's pipeline and listing only its buffers
  (link-time ``table`` placeholders indexed by the loop counter). Every encoder's ``useResources:count:usage:``
  lists exactly the buffers its own commands bind, and the variables buffer.
- ICB offsets above 0xFFFFFFFF do not fit an ICB (METAL.md §3 rule 8): the submit is lowered on the direct path,
  and a diagnostic the pipeline keeps says why. An offset that is not a multiple of the element size is invalid on
  any path (METAL.md §1): ``EncodeError`` naming the command.
- A device without ICB support gets the direct path: per command ``setComputePipelineState:``,
  ``setBuffer:offset:atIndex:`` per buffer, ``setBytes:length:atIndex:`` per variable (a pointer into the variables
  buffer's host memory, patched per submit), ``dispatchThreadgroups:threadsPerThreadgroup:``.

Reading and checking the queue and cutting it into command buffers is ``passes/plan.py``; this module builds the
placeholders and the message chain. Cost: one visit per queue op and per distinct size, buffer and kernel node
(memoized); after encode the graph of an ICB submit has no per-command nodes except for symbolic commands.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL, SELECTORS, DeviceSpec, Obj
from mtlir.ir.ops import Ops
from mtlir.passes.pipeline import Pass, PassContext, register
from mtlir.passes.encode.submit import VAR_SLOT, Command, CommandBufferPlan, EncodeError, SubmitReader, placeholder
from mtlir.program.payloads import CommandList, IcbCommand, IcbSpec, MessageList, TableEntries
from mtlir.ir.rewrite import graph_rewrite
from mtlir.ir.upat import PatternMatcher, UPat
from mtlir.ir.uop import UOp

__all__ = ["Encode", "EncodeError", "encode_submit", "msg", "u64"]


def msg(selector: str, recv: UOp, *args: UOp) -> UOp:
    """A typed Objective-C message: ``MSG(recv, *args)`` of ``selector``, typed by ``SELECTORS``."""
    return UOp(Ops.MSG, SELECTORS[selector].ret, (recv, *args), selector)


def u64(v: int) -> UOp:
    """A uint64 constant (NSUInteger arguments)."""
    return UOp.const(dtypes.uint64, v)


_new = tuple.__new__  # builds a NamedTuple at C speed (its generated __new__ is Python code)
_RW = MTL.ResourceUsageRead | MTL.ResourceUsageWrite


class _Batch:
    """Void messages to one receiver, collected as data for one MSGS node: each operand once (its index in the
    node's sources, 0 being the receiver), the messages in order."""

    __slots__ = ("operands", "msgs")

    def __init__(self) -> None:
        self.operands: dict[UOp, int] = {}
        self.msgs: list[tuple[str, tuple[int, ...]]] = []

    def ref(self, u: UOp) -> int:
        """The index of operand ``u`` in the MSGS's sources (added on first use)."""
        i = self.operands.get(u)
        if i is None:
            i = self.operands[u] = len(self.operands) + 1
        return i

    def send(self, selector: str, *args: UOp) -> None:
        """Append the message ``selector`` with ``args`` (typed by ``SELECTORS`` when abi lowers the MSGS)."""
        self.msgs.append((selector, tuple([self.ref(a) for a in args])))

    def node(self, recv: UOp) -> UOp:
        """The MSGS of every message sent, to ``recv``."""
        return UOp(Ops.MSGS, dtypes.void, (recv, *self.operands), MessageList(self.msgs))


@dataclass
class _Builder:
    """Builds the message chain of one submit from an ``SubmitReader``."""

    e: SubmitReader
    icb_path: bool
    queue: UOp = field(default_factory=lambda: placeholder("queue", "queue"))
    fence: UOp = field(default_factory=lambda: placeholder("fence", "fence"))
    icb: UOp | None = None
    contents: UOp | None = None
    inputs: dict[int, tuple[UOp, UOp]] = field(default_factory=dict)  # plan.first -> its encoder's inputs (array,
    #                                                                   count) for useResources, when it binds any
    input_patches: list[UOp] = field(default_factory=list)             # STOREs of the handles into those arrays
    cbslots: UOp | None = None
    varbuf: UOp | None = None
    direct_memo: dict[tuple[tuple[str, int, int], bool], tuple[str, tuple[UOp, ...]]] = field(default_factory=dict)
    loop_offsets: dict[int, UOp] = field(default_factory=dict)        # plan.first -> table of input offsets

    def slot_ptr(self, slot: int) -> UOp:
        """The host address of variables-buffer slot ``slot`` (uint8*)."""
        assert self.contents is not None
        # slot 0 is the pointer itself: an INDEX by 0 would be folded by symbolic, which then rebuilds every node
        # after it in the message chain (the whole submit)
        return self.contents.index(UOp.const(dtypes.int64, slot * VAR_SLOT)) if slot else self.contents

    # ---- link-time placeholders

    def placeholders(self) -> list[UOp]:
        """Create the placeholders and return the per-submit patches (module docstring)."""
        e = self.e
        patches: list[UOp] = []
        values = e.slot_values
        if values:
            inits = tuple((slot * VAR_SLOT, dt.name, int(v.arg)) for slot, (v, dt) in enumerate(values)
                          if v.op is Ops.CONST)
            self.varbuf = placeholder("varbuf", "varbuf", (VAR_SLOT * len(values), inits))
            self.contents = placeholder("contents", "contents:varbuf", (self.varbuf.arg,), dtypes.uint8.ptr())
            for slot, (v, dt) in enumerate(values):
                if v.op is not Ops.CONST:
                    patches.append(self.slot_ptr(slot).bitcast(dt.ptr()).store(v))
        if self.icb_path:
            self.icb = placeholder("icb", "icb", (self.icb_spec(),))
            for i, c in enumerate(e.cmds):
                rebound = e.inputs and [t for t in c.icb_binds if not t[0]]
                if not (c.symbolic or rebound):
                    continue
                cmd = placeholder("icbcmd", f"icb[{i}]", (i,))
                for (index, _), a in zip(c.kernel.buffers, c.args):
                    b = e.binds[a]
                    if b.name is None:
                        patches.append(msg("setKernelBuffer:offset:atIndex:", cmd, b.base, u64(b.offset), u64(index)))
                if c.symbolic:
                    patches.append(msg("concurrentDispatchThreadgroups:threadsPerThreadgroup:", cmd, c.grid.node,
                                       c.threadgroup.node))
        return patches

    def command_inputs(self, c: Command) -> tuple[UOp, ...]:
        """The buffer variables command ``c`` binds, each once, in parameter order."""
        binds = self.e.binds
        return tuple(dict.fromkeys(b.base for b in (binds[a] for a in c.args[:len(c.kernel.buffers)])
                                   if b.name is None))

    def input_arrays(self, plans: list[CommandBufferPlan]) -> None:
        """Per encoder of the ICB path without a residency set, the buffer variables its commands bind, for a
        second ``useResources:count:usage:``: a ``scratch`` array of their handles STOREd by every submit
        (``scratch:inputs`` for an encoder that runs the whole submit, ``scratch:inputs:F`` for one whose first
        command is F); none when the encoder binds none. In a profiled loop whose iterations bind different ones,
        one array holds each distinct list once and two link-time tables indexed by the counter give the
        iteration's offset into it and its count (0 for an iteration that binds none)."""
        cmds = self.e.cmds
        for p in plans:
            if not p.ncmds:
                continue
            if not p.loop:
                names: dict[UOp, None] = {}
                for c in cmds[p.first:p.first + p.ncmds]:
                    names.update(dict.fromkeys(self.command_inputs(c)))
                if names:
                    whole = p.first == 0 and p.ncmds == len(cmds)
                    arr = self.input_array("scratch:inputs" if whole else f"scratch:inputs:{p.first}", tuple(names))
                    self.inputs[p.first] = (arr, u64(len(names)))
                continue
            lists = [self.command_inputs(c) for c in cmds[p.first:p.first + p.ncmds]]
            if not any(lists):
                continue
            if len(set(lists)) == 1:
                self.inputs[p.first] = (self.input_array(f"scratch:inputs:{p.first}", lists[0]), u64(len(lists[0])))
                continue
            at: dict[tuple[UOp, ...], int] = {}   # each distinct list -> its offset (in handles) in the one array
            for lst in lists:
                if lst and lst not in at:
                    at[lst] = sum(len(k) for k in at)
            arr = self.input_array(f"scratch:inputs:{p.first}", tuple(u for lst in at for u in lst))
            offsets = placeholder("table", f"table:input-offsets:{p.first}",
                                  TableEntries(at.get(lst, 0) for lst in lists), dtypes.uint64.ptr())
            counts = placeholder("table", f"table:input-counts:{p.first}", TableEntries(len(lst) for lst in lists),
                                 dtypes.uint64.ptr())
            self.inputs[p.first] = (arr, counts)  # indexed per iteration in command_buffer (see loop_inputs)
            self.loop_offsets[p.first] = offsets

    def input_array(self, name: str, handles: tuple[UOp, ...]) -> UOp:
        """A per-submit host array of ``handles`` (buffer variables), STOREd before the first command buffer."""
        arr = placeholder("scratch", name, (8 * len(handles),), dtypes.id.ptr())
        for i, var in enumerate(handles):
            self.input_patches.append((arr.index(UOp.const(dtypes.int64, i)) if i else arr).store(var))
        return arr

    def icb_spec(self) -> IcbSpec:
        """The ICB payload: every command as data (``IcbCommand``), the pipelines and buffers it names."""
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

    def warmup(self, enc: _Batch, first: int, count: int) -> None:
        """setComputePipelineState: + a zero-size dispatch per distinct pipeline of the commands, first use first."""
        zero = UOp.struct(dtypes.MTLSize, 0, 0, 0)
        cmds = self.e.cmds
        if first == 0 and count == len(cmds):  # the whole submit: the kernels in the order encode met them
            pipes = list(dict.fromkeys(k.pipeline for k in self.e.kernels.values()))
        else:
            pipes = list(dict.fromkeys(cmds[c].kernel.pipeline for c in range(first, first + count)))
        for pipe in pipes:
            enc.send("setComputePipelineState:", pipe)
            enc.send("dispatchThreadgroups:threadsPerThreadgroup:", zero, zero)

    def loop_warmup(self, enc: _Batch, plan: CommandBufferPlan, counter: UOp) -> None:
        """The warm-up of iteration ``counter`` of a profiled loop: the pipeline of that iteration's command only
        (METAL.md §3 rule 16 needs the pipeline the encoder's command uses), read from a link-time table of the
        run's pipelines indexed by the counter; the pipeline itself when the run uses one."""
        zero = UOp.struct(dtypes.MTLSize, 0, 0, 0)
        pipes = [c.kernel.pipeline for c in self.e.cmds[plan.first:plan.first + plan.ncmds]]
        if len(set(pipes)) == 1:
            pipe = pipes[0]
        else:
            table = placeholder("table", f"table:pipelines:{plan.first}", TableEntries(p.arg for p in pipes),
                                dtypes.id.ptr())
            pipe = table.index(counter).load()
        enc.send("setComputePipelineState:", pipe)
        enc.send("dispatchThreadgroups:threadsPerThreadgroup:", zero, zero)

    def resource_names(self, first: int, count: int) -> tuple[str, ...]:
        """The buffers commands ``first .. first+count-1`` bind, each once in first-use order (a view counts as
        its buffer; buffer variables are listed apart), then the variables buffer when the submit has one."""
        e = self.e
        if first == 0 and count == len(e.cmds):
            names: tuple[str, ...] = tuple(e.buffers)
        else:
            names = tuple(dict.fromkeys(t[0] for c in e.cmds[first:first + count] for t in c.icb_binds
                                        if t[0] and t[0] != "varbuf"))
        return names + (("varbuf",) if self.varbuf is not None else ())

    def resources(self, plan: CommandBufferPlan, counter: UOp | None) -> tuple[UOp, UOp]:
        """The ``useResources:count:usage:`` array and count of one encoder: exactly the buffers its commands bind
        (+ the variables buffer). In a profiled loop (``counter``) each iteration's command has its own list: a
        ``resources`` array per distinct list, and two link-time tables indexed by the counter give the iteration's
        array and its length (the array itself when every iteration lists the same buffers)."""
        ptr = dtypes.id.ptr()
        if counter is None:
            names = self.resource_names(plan.first, plan.ncmds)
            whole = plan.first == 0 and plan.ncmds == len(self.e.cmds)
            table = placeholder("resources", "resources" if whole else f"resources:{plan.first}", names, ptr)
            return table, u64(len(names))
        arrays: dict[tuple[str, ...], Obj] = {}  # a list of names -> the placeholder of that array
        per_iteration: list[Obj] = []
        for j in range(plan.first, plan.first + plan.ncmds):
            names = self.resource_names(j, 1)
            obj = arrays.get(names)
            if obj is None:
                obj = arrays[names] = Obj("resources", f"resources:{j}", names)
            per_iteration.append(obj)
        if len(arrays) == 1:
            return UOp(Ops.OBJECT, ptr, (), per_iteration[0]), u64(len(per_iteration[0].payload))
        # the table holds the arrays themselves (link makes each, then writes its address per iteration)
        table = placeholder("table", f"table:resources:{plan.first}", TableEntries(per_iteration), ptr.ptr())
        counts = placeholder("table", f"table:resource-counts:{plan.first}",
                             TableEntries(len(o.payload) for o in per_iteration), dtypes.uint64.ptr())
        return table.index(counter).load(), counts.index(counter).load()

    def direct_commands(self, enc: _Batch, first: int, count: int) -> None:
        """The direct path's messages for ``count`` commands from ``first``, into the encoder's batch (the messages
        as data: a node per message cost ~60 µs per message over the later passes)."""
        memo = self.direct_memo         # per binding triple / size pair: the message, shared across encoders
        send = enc.send
        for c in self.e.cmds[first:first + count]:
            k = c.kernel
            send("setComputePipelineState:", k.pipeline)
            nb = len(k.buffers)
            for j, t in enumerate(c.icb_binds):
                key = (t, j < nb)
                got = memo.get(key)
                if got is None or not t[0]:
                    got = self.direct_binding(c, j, t, nb)
                    if t[0]:
                        memo[key] = got
                send(got[0], *got[1])
            send("dispatchThreadgroups:threadsPerThreadgroup:", c.grid.node, c.threadgroup.node)

    def direct_binding(self, c: Command, j: int, t: tuple[str, int, int], nb: int) -> tuple[str, tuple[UOp, ...]]:
        """The direct path's message binding parameter ``j`` of command ``c`` (binding triple ``t``): a buffer
        with ``setBuffer:offset:atIndex:``, a variable with ``setBytes:length:atIndex:`` from its slot."""
        if j < nb:
            b = self.e.binds[c.args[j]]
            handle = self.e.buffers[b.name] if b.name is not None else b.base
            return "setBuffer:offset:atIndex:", (handle, u64(b.offset), u64(t[2]))
        dt = c.kernel.vars[j - nb][1]
        return "setBytes:length:atIndex:", (self.slot_ptr(t[1] // VAR_SLOT), u64(dt.itemsize), u64(t[2]))

    def command_buffer(self, deps: list[UOp], plan: CommandBufferPlan, slot: UOp, first: UOp | None,
                       counter: UOp | None = None) -> UOp:
        """One command buffer of ``plan``; in a profiled loop ``first`` is the command this iteration executes (a
        node) and ``counter`` the loop counter (0 .. plan.ncmds-1). Returns its last node (the MSGS that commits).

        Three messages return a value and are MSG nodes (``commandBuffer``, ``retain``, ``computeCommandEncoder``);
        the void ones are data: one MSGS on the encoder (``waitForFence:`` through ``endEncoding``) and one on the
        command buffer (``encodeSignalEvent:value:``, ``commit``), so a command buffer costs a few nodes, not one
        per message, in every later pass."""
        assert self.cbslots is not None
        cb = msg("commandBuffer", self.queue.after(*deps))
        at = self.cbslots if slot.op is Ops.CONST and slot.arg == 0 else self.cbslots.index(slot)  # see slot_ptr
        done = at.store(msg("retain", cb))
        if plan.ncmds:
            enc = _Batch()
            enc.send("waitForFence:", self.fence)
            if self.icb_path and not self.e.device.residency_set:
                arr, count = self.resources(plan, counter)
                if count.op is not Ops.CONST or count.arg:  # an encoder whose commands bind only buffer variables
                    enc.send("useResources:count:usage:", arr, count, u64(_RW))
                inputs = self.inputs.get(plan.first)
                if inputs is not None:
                    arr, count = inputs
                    offsets = self.loop_offsets.get(plan.first)
                    if offsets is not None:  # a profiled loop whose iterations bind different inputs
                        assert counter is not None
                        arr, count = arr.index(offsets.index(counter).load()), count.index(counter).load()
                    enc.send("useResources:count:usage:", arr, count, u64(_RW))
            if self.icb_path:
                if self.e.device.needs_warmup and counter is not None:
                    self.loop_warmup(enc, plan, counter)
                elif self.e.device.needs_warmup:
                    self.warmup(enc, plan.first, plan.ncmds)
                assert self.icb is not None
                if first is not None:
                    enc.send("executeCommandsInBuffer:withRange:", self.icb, UOp.struct(dtypes.NSRange, first, u64(1)))
                else:
                    end = plan.first + plan.ncmds
                    for j in range(plan.first, end, self.e.max_range):
                        enc.send("executeCommandsInBuffer:withRange:", self.icb,
                                 UOp.struct(dtypes.NSRange, j, min(self.e.max_range, end - j)))
            else:
                self.direct_commands(enc, plan.first, plan.ncmds)
            enc.send("updateFence:", self.fence)
            enc.send("endEncoding")
            done = enc.node(msg("computeCommandEncoder", cb.after(done)))
        tail = _Batch()
        if plan.signal is not None:
            assert self.e.timeline is not None
            tail.send("encodeSignalEvent:value:", self.e.timeline, plan.signal)
        tail.send("commit")
        return tail.node(cb.after(done))

    def build(self) -> UOp:
        """The lowered graph: the patches, then every command buffer's messages, under a SINK of the device."""
        e = self.e
        profiled = bool(e.stamps_at)
        plans = e.plans(profiled, loops=profiled and self.icb_path)
        stamps = e.stamps(plans) if profiled else ()
        ncbs = sum(p.ncmds if p.loop else 1 for p in plans)
        self.cbslots = placeholder("cbslots", "cbslots", (ncbs, stamps), dtypes.id.ptr())
        deps = self.placeholders()
        if self.icb_path and not e.device.residency_set and e.inputs:
            self.input_arrays(plans)
            deps += self.input_patches
        slot = 0
        for p in plans:
            if p.loop:
                rng = UOp.range(u64(p.ncmds).after(*deps), self.e.ctx.fresh("range"), dtypes.uint64)
                cmd = rng + p.first if p.first else rng
                body = self.command_buffer([rng], p, (rng + slot if slot else rng).cast(dtypes.int64), cmd, rng)
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
    e = SubmitReader(device, ctx.max_range, ctx.pass_ctx)
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
    takes = ("queue",)
    produces = "messages"
    max_range: int = MTL.MAX_ICB_RANGE

    def __post_init__(self) -> None:
        if not 1 <= self.max_range <= MTL.MAX_ICB_RANGE:
            raise ValueError(f"max-range {self.max_range} must be in [1, {MTL.MAX_ICB_RANGE}]")

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        """Every SUBMIT of ``graph`` as its message chain (module docstring); the diagnostics (a submit moved to
        the direct path) go to ``ctx``. Raises ``EncodeError`` naming the command."""
        return graph_rewrite(graph, ENCODE, ctx=_EncodeCtx(self.max_range, ctx), name="encode")
