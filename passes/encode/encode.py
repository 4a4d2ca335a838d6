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
- Loops over tables (a submit without buffer variables): on the ICB path a run of ``MIN_LOOP`` or more like
  command buffers closed by constant signals (``fold_signal_runs``), on the direct path a profiled submit's
  one-command buffers and a run of ``MIN_LOOP`` or more commands in an encoder, all of one layout
  (``direct_shape``), are one RANGE each, what differs per iteration read from ``table`` placeholders; a loop sends
  exactly the messages of what it replaces (docs/lowering.md, "Loops over like command buffers").

Reading and checking the queue is ``submit.py`` (its records ``commands.py``, the event checks ``events.py``),
cutting it into command buffers ``spans.py``, the link-time placeholders and the per-submit patches
``placeholders.py``, the MSG and MSGS nodes ``messages.py``; this module builds the message chain of each command
buffer. Cost: one visit per queue op and per distinct size, buffer and kernel node
(memoized); after encode the graph of an ICB submit has no per-command nodes except for symbolic commands.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import MTL, DeviceSpec
from mtlir.ir.ops import Ops
from mtlir.passes.pipeline import Pass, PassContext, register
from mtlir.passes.encode.messages import MessageBatch, msg, u64
from mtlir.passes.encode.placeholders import SubmitPlaceholders
from mtlir.passes.encode.commands import VAR_SLOT, Blit, EncodeError, KernelLayout, placeholder
from mtlir.passes.encode.events import check_events, replay_notes
from mtlir.passes.encode.spans import (MIN_LOOP, CommandBufferSpan, command_buffers, fold_signal_runs,
                                       queue_command_buffers)
from mtlir.passes.encode.spans import stamps as stamps_of
from mtlir.passes.encode.submit import SubmitReader
from mtlir.program.payloads import TableEntries
from mtlir.ir.rewrite import graph_rewrite
from mtlir.ir.upat import PatternMatcher, UPat
from mtlir.ir.uop import UOp

__all__ = ["Encode", "encode_submit"]

_RW = MTL.ResourceUsageRead | MTL.ResourceUsageWrite


@dataclass
class _Builder:
    """Builds the message chain of one submit from a ``SubmitReader`` and its placeholders (``ph``)."""

    e: SubmitReader
    ph: SubmitPlaceholders
    queue: UOp = field(default_factory=lambda: placeholder("queue", "queue"))
    fence: UOp = field(default_factory=lambda: placeholder("fence", "fence"))
    cbslots: UOp | None = None
    direct_memo: dict[tuple[tuple[str, int, int], bool], tuple[str, tuple[UOp, ...]]] = field(default_factory=dict)
    layouts: dict[int, object] = field(default_factory=dict)  # id(IcbShape) -> its direct_shape
    pipes_memo: dict[int, tuple[UOp, ...]] = field(default_factory=dict)  # span_key(first, count) -> pipelines()
    pipes_seen: dict[tuple[UOp, ...], tuple[UOp, ...]] = field(default_factory=dict)  # equal lists: one tuple

    def pipelines(self, first: int, count: int, keep: bool = False) -> tuple[UOp, ...]:
        """The distinct pipelines of commands ``first .. first+count-1`` in first-use order; ``keep``: remembered
        for the next call on the same span (a loop's folding asks before its warm-up does; a profiled loop asks
        once per command, and keeping each would cost memory per command)."""
        got = self.pipes_memo.get(span_key(first, count))
        if got is None:
            got = tuple(_pipelines(self.e, first, count))
            if keep:  # equal tuples kept as one (a span of two commands: ~70 bytes per command otherwise)
                got = self.pipes_memo[span_key(first, count)] = self.pipes_seen.setdefault(got, got)
        return got

    def warmup(self, enc: MessageBatch, first: int, count: int) -> None:
        """setComputePipelineState: + a zero-size dispatch per distinct pipeline of the commands, first use first."""
        zero = UOp.struct(dtypes.MTLSize, 0, 0, 0)
        if first == 0 and count == len(self.e.cmds):  # the whole submit: the kernels in the order encode met them
            pipes = list(dict.fromkeys(k.pipeline for k in self.e.kernels.values()))
        else:
            pipes = _pipelines(self.e, first, count)
        for pipe in pipes:
            enc.send("setComputePipelineState:", pipe)
            enc.send("dispatchThreadgroups:threadsPerThreadgroup:", zero, zero)

    def loop_warmup(self, enc: MessageBatch, span: CommandBufferSpan, counter: UOp) -> None:
        """The warm-up of iteration ``counter`` of a loop: the distinct pipelines of that iteration's commands in
        first-use order (METAL.md §3 rule 16 needs the pipelines the encoder's commands use; every iteration has
        as many, ``fold_signal_runs``), the k-th read from a link-time table of the run's k-th pipelines indexed by
        the counter (``table:pipelines:F``, ``table:pipelines:F:k`` for k > 0), or the pipeline itself when every
        iteration has the same."""
        zero = UOp.struct(dtypes.MTLSize, 0, 0, 0)
        cmds, w = self.e.cmds, span.width
        if w == 1:  # a profiled loop: each command's own pipeline (one list, not a list per command: 72 bytes each)
            by_name = self.e.pipes  # IcbShape.pipeline (a name) -> the placeholder
            columns = [[by_name[c[0].pipeline] for c in cmds[span.first:span.first + span.ncmds]]]
        else:
            per = [self.pipelines(j, w) for j in range(span.first, span.first + span.ncmds, w)]
            columns = [[p[k] for p in per] for k in range(len(per[0]))]
        for k, pipes in enumerate(columns):
            if len(set(pipes)) == 1:
                pipe = pipes[0]
            else:
                name = f"table:pipelines:{span.first}" + (f":{k}" if k else "")
                table = placeholder("table", name, TableEntries(p.arg for p in pipes), dtypes.id.ptr())
                pipe = table.index(counter).load()
            enc.send("setComputePipelineState:", pipe)
            enc.send("dispatchThreadgroups:threadsPerThreadgroup:", zero, zero)

    def direct_commands(self, enc: MessageBatch, first: int, count: int) -> None:
        """The direct path's messages for ``count`` commands from ``first``, into the encoder's batch (the messages
        as data: a node per message cost ~60 µs per message over the later passes). A message met before in this
        batch (a pipeline, a binding, a grid) is the same entry: one lookup, its operands not looked up again."""
        memo = self.direct_memo         # per binding triple / size pair: the message, shared across encoders
        local: dict[object, tuple[str, tuple[int, ...]]] = {}  # the same, as this batch's entries
        append, ref = enc.msgs.append, enc.ref
        cmds, kinds = self.e.cmds, self.e.kinds
        for i in range(first, first + count):
            c = cmds[i]
            shape = c[0]
            k, grid, tg = kinds[id(shape)]
            m = local.get(id(k))  # a KernelLayout lives as long as the reader: its id is its own
            if m is None:
                m = local[id(k)] = ("setComputePipelineState:", (ref(k.pipeline),))
            append(m)
            nb = len(k.buffers)
            for j, t in enumerate(zip(shape.names, c[1:], shape.indices)):
                key = (t, j < nb)
                m = local.get(key) if t[0] else None
                if m is None:
                    got = memo.get(key)
                    if got is None or not t[0]:
                        got = self.direct_binding(i, k, j, t, nb)
                        if t[0]:
                            memo[key] = got
                    m = (got[0], tuple([ref(a) for a in got[1]]))
                    if t[0]:
                        local[key] = m
                append(m)
            sizes = (grid.node, tg.node)
            m = local.get(sizes)
            if m is None:
                m = local[sizes] = ("dispatchThreadgroups:threadsPerThreadgroup:", (ref(sizes[0]), ref(sizes[1])))
            append(m)

    def direct_runs(self, enc: MessageBatch, encoder: UOp, first: int, count: int) -> MessageBatch:
        """The direct path's messages of commands ``first .. first+count-1`` of one encoder (``encoder``), into
        ``enc``: each run of at least ``MIN_LOOP`` consecutive commands of one ``direct_shape`` as a loop
        (``direct_loop``) between the batch before it and a new batch after it (whose ``receiver`` is the
        encoder after the loop's END), the others as ``direct_commands``. Returns the batch to continue."""
        e = self.e
        if e.inputs or count < MIN_LOOP:
            self.direct_commands(enc, first, count)
            return enc
        shape = self.direct_shape
        end, i = first + count, first
        while i < end:
            key, j = shape(i), i + 1
            while j < end and shape(j) == key:
                j += 1
            if j - i < MIN_LOOP:
                self.direct_commands(enc, i, j - i)
            else:
                recv = encoder if enc.receiver is None else enc.receiver
                before = enc.node(recv) if enc.msgs else recv  # (an empty batch: two loops in a row)
                rng = UOp.range(u64(j - i).after(before), e.ctx.fresh("range"), dtypes.uint64)
                body = MessageBatch()
                self.direct_loop(body, i, j - i, rng)
                enc = MessageBatch()
                enc.receiver = encoder.after(rng.end(body.node(encoder.after(rng))))
            i = j
        return enc

    def direct_shape(self, i: int) -> object:
        """What the direct-path messages of command ``i`` share with the other iterations of a loop: the
        parameter indices, each variable's size, and a grid or threadgroup that depends on variables itself (a
        constant one is read from a table)."""
        shape = self.e.cmds[i][0]
        got = self.layouts.get(id(shape))  # an IcbShape lives as long as the reader: its id is its own
        if got is None:
            k, g, t = self.e.kinds[id(shape)]
            layout = (tuple(index for index, _ in k.buffers), tuple((index, dt.itemsize) for index, dt in k.vars))
            got = self.layouts[id(shape)] = (layout, g.node if g.symbolic else None, t.node if t.symbolic else None)
        return got

    def direct_loop(self, enc: MessageBatch, first: int, count: int, counter: UOp) -> None:
        """The direct path's messages of iteration ``counter`` of a loop over commands ``first .. first+count-1``
        (one command per iteration, all of one ``direct_shape``): the same messages as ``direct_commands`` for that
        command, each operand that differs between iterations read from a link-time table indexed by the counter
        (``table:direct-OPERAND:F``: the pipeline, each buffer and offset, each variable's slot offset, each
        constant grid or threadgroup size). Each operand's values are a list only while its table is made (a
        list kept per operand was 8 bytes per command each, at the peak of the direct path's memory)."""
        e = self.e
        cmds, kinds = e.cmds if first == 0 and count == len(e.cmds) else e.cmds[first:first + count], e.kinds

        def per(name: str, values: list[Any], same: UOp, dtype: DType) -> UOp:
            if values.count(values[0]) == len(values):  # all alike (count: identity, then ==, in C)
                return same
            table = placeholder("table", f"table:direct-{name}:{first}", TableEntries(values), dtype.ptr())
            return table.index(counter).load()
        k0, grid0, tg0 = kinds[id(cmds[0][0])]
        pipes = e.pipes  # IcbShape.pipeline (a name) -> the placeholder
        enc.send("setComputePipelineState:", per("pipeline", [pipes[c[0].pipeline].arg for c in cmds],
                                                 k0.pipeline, dtypes.id))
        nb = len(k0.buffers)
        for j, index in enumerate(cmds[0][0].indices):
            if j < nb:
                if all([c[0].names[j] for c in cmds]):  # buffers at constant offsets: their names and offsets
                    buffers = e.buffers
                    handle = per(f"buffer{j}", [buffers[c[0].names[j]].arg for c in cmds],
                                 buffers[cmds[0][0].names[j]], dtypes.id)
                    offset = per(f"offset{j}", [c[1 + j] for c in cmds], u64(cmds[0][1 + j]), dtypes.uint64)
                    enc.send("setBuffer:offset:atIndex:", handle, offset, u64(index))
                    continue
                binds = [e.binding(x.src[3 + j]) for x in e.execs[first:first + count]]
                handles: list[Any] = [e.buffers[b.name].arg for b in binds if b.name is not None]
                handle = per(f"buffer{j}", handles, e.buffers[binds[0].name or ""], dtypes.id)
                offsets: list[Any] = [b.offset for b in binds]
                if any(isinstance(o, UOp) for o in offsets) and any(o is not offsets[0] for o in offsets):
                    raise EncodeError(f"commands {first}..{first + count - 1}: a loop of direct dispatches binds "
                                      f"parameter {j} at variable offsets that differ between iterations")
                offset = per(f"offset{j}", offsets, u64(binds[0].offset), dtypes.uint64)
                enc.send("setBuffer:offset:atIndex:", handle, offset, u64(index))
            else:
                assert self.ph.contents is not None
                ptr = per(f"slot{j}", [c[1 + j] for c in cmds], self.ph.slot_ptr(cmds[0][1 + j] // VAR_SLOT),
                          dtypes.uint64)
                if ptr.op is Ops.LOAD:
                    ptr = self.ph.contents.index(ptr)
                dt = k0.vars[j - nb][1]
                enc.send("setBytes:length:atIndex:", ptr, u64(dt.itemsize), u64(index))
        sizes = []
        for role, size in (("grid", grid0), ("threadgroup", tg0)):
            if size.symbolic:
                sizes.append(size.node)
                continue
            field = 3 if role == "grid" else 4  # IcbShape.grid / .threadgroup: the Size's link
            sizes.append(UOp.struct(dtypes.MTLSize, *(per(f"{role}{a}", [c[0][field][a] for c in cmds],
                                                          u64(size.link[a]), dtypes.uint64) for a in range(3))))
        enc.send("dispatchThreadgroups:threadsPerThreadgroup:", *sizes)

    def direct_binding(self, i: int, k: KernelLayout, j: int, t: tuple[str, int, int],
                       nb: int) -> tuple[str, tuple[UOp, ...]]:
        """The direct path's message binding parameter ``j`` of command ``i`` (kernel ``k``, binding triple ``t``):
        a buffer with ``setBuffer:offset:atIndex:``, a variable with ``setBytes:length:atIndex:`` from its slot."""
        if j < nb:
            b = self.e.binding(self.e.execs[i].src[3 + j])
            handle = self.e.buffers[b.name] if b.name is not None else b.base
            return "setBuffer:offset:atIndex:", (handle, u64(b.offset), u64(t[2]))
        dt = k.vars[j - nb][1]
        return "setBytes:length:atIndex:", (self.ph.slot_ptr(t[1] // VAR_SLOT), u64(dt.itemsize), u64(t[2]))

    def blit_encoder(self, cb: UOp, done: UOp, blits: tuple[Blit, ...]) -> UOp:
        """A blit encoder on ``cb`` after ``done``: ``waitForFence:``, the copies and fills, ``updateFence:``,
        ``endEncoding`` (the fence orders it with the encoders before and after, as for compute). Returns its MSGS."""
        enc = MessageBatch()
        enc.send("waitForFence:", self.fence)
        for blit in blits:
            enc.send(blit.selector, *blit.args)
        enc.send("updateFence:", self.fence)
        enc.send("endEncoding")
        return enc.node(msg("blitCommandEncoder", cb.after(done)))

    def compute_encoder(self, cb: UOp, done: UOp, span: CommandBufferSpan, first: UOp | None,
                        counter: UOp | None) -> UOp:
        """The compute encoder of ``span``'s commands on ``cb`` after ``done`` (METAL.md §1 steps 2-9). Returns
        its MSGS."""
        enc = MessageBatch()
        enc.send("waitForFence:", self.fence)
        if self.ph.icb_path and not self.e.device.residency_set:
            arr, count = self.ph.resources(span, counter)
            if count.op is not Ops.CONST or count.arg:  # an encoder whose commands bind only buffer variables
                enc.send("useResources:count:usage:", arr, count, u64(_RW))
            inputs = self.ph.inputs.get(span.first)
            if inputs is not None:
                arr, count = inputs
                offsets = self.ph.loop_offsets.get(span.first)
                if offsets is not None:  # a profiled loop whose iterations bind different inputs
                    assert counter is not None
                    arr, count = arr.index(offsets.index(counter).load()), count.index(counter).load()
                enc.send("useResources:count:usage:", arr, count, u64(_RW))
        if self.ph.icb_path:
            if self.e.device.needs_warmup and counter is not None:
                self.loop_warmup(enc, span, counter)
            elif self.e.device.needs_warmup:
                self.warmup(enc, span.first, span.ncmds)
            icb = self.ph.icb
            assert icb is not None
            if first is not None:
                enc.send("executeCommandsInBuffer:withRange:", icb, UOp.struct(dtypes.NSRange, first, u64(span.width)))
            else:
                end = span.first + span.ncmds
                for j in range(span.first, end, self.e.max_range):
                    enc.send("executeCommandsInBuffer:withRange:", icb,
                             UOp.struct(dtypes.NSRange, j, min(self.e.max_range, end - j)))
        elif counter is not None:
            self.direct_loop(enc, span.first, span.ncmds, counter)
        else:
            encoder = msg("computeCommandEncoder", cb.after(done))
            enc = self.direct_runs(enc, encoder, span.first, span.ncmds)
            enc.send("updateFence:", self.fence)
            enc.send("endEncoding")
            return enc.node(encoder) if enc.receiver is None else enc.node(enc.receiver)
        enc.send("updateFence:", self.fence)
        enc.send("endEncoding")
        return enc.node(msg("computeCommandEncoder", cb.after(done)))

    def command_buffer(self, deps: list[UOp], span: CommandBufferSpan, slot: UOp, first: UOp | None,
                       counter: UOp | None = None) -> UOp:
        """One command buffer of ``span``; in a loop ``first`` is the first command this iteration executes (a
        node) and ``counter`` the loop counter (0 .. span.ncmds // span.width - 1), and a loop of signaling
        command buffers signals the iteration's value of a link-time table (``table:signals:F``). Returns its last
        node (the MSGS that commits).

        Three messages return a value and are MSG nodes (``commandBuffer``, ``retain``, ``computeCommandEncoder``);
        the void ones are data: one MSGS on the encoder (``waitForFence:`` through ``endEncoding``) and one on the
        command buffer (``encodeSignalEvent:value:``, ``commit``), so a command buffer costs a few nodes, not one
        per message, in every later pass."""
        assert self.cbslots is not None
        cb = msg("commandBuffer", self.queue.after(*deps))
        at = self.cbslots if slot.op is Ops.CONST and slot.arg == 0 else self.cbslots.index(slot)  # see ph.slot_ptr
        done = at.store(msg("retain", cb))
        if span.waits:  # other queues' timelines or shared events: before the encoder (METAL.md §3 rule 3)
            waits = MessageBatch()
            for ev, value in span.waits:
                waits.send("encodeWaitForEvent:value:", ev, value)
            done = waits.node(cb.after(done))
        for seg in _encoders(span):
            if isinstance(seg, CommandBufferSpan):
                done = self.compute_encoder(cb, done, seg, first, counter)
            else:
                done = self.blit_encoder(cb, done, seg)
        tail = MessageBatch()
        signal = span.signal
        if span.values:
            assert counter is not None
            table = placeholder("table", f"table:signals:{span.first}", TableEntries(span.values),
                                dtypes.uint64.ptr())
            signal = table.index(counter).load()
        if signal is not None:
            event = span.event if span.event is not None else self.e.timeline
            assert event is not None
            tail.send("encodeSignalEvent:value:", event, signal)
        tail.send("commit")
        return tail.node(cb.after(done))

    def build(self) -> UOp:
        """The lowered graph: the patches, then every command buffer's messages, under a SINK of the device."""
        e = self.e
        profiled = bool(e.stamps_at)
        if profiled:  # one queue (encode_queues refuses TIMESTAMPs with several)
            direct_loops = not self.ph.icb_path and not e.inputs
            spans = command_buffers(e, True, loops=self.ph.icb_path or direct_loops,
                                    shape=self.direct_shape if direct_loops else None)
            owner = [e.queues[0].name] * len(spans)
        else:
            queued = [(span, q.name) for q in e.queues for span in self.fold(queue_command_buffers(e, q))]
            spans, owner = [span for span, _ in queued], [name for _, name in queued]
        stamps = stamps_of(e, spans) if profiled else ()
        ncbs = sum(p.ncmds // p.width if p.loop else 1 for p in spans)
        self.cbslots = placeholder("cbslots", "cbslots", (ncbs, stamps), dtypes.id.ptr())
        deps = self.ph.patches()
        if self.ph.icb_path and not e.device.residency_set and e.inputs:
            self.ph.input_arrays([c for p in spans for c in _compute_spans(p)])
            deps += self.ph.input_patches
        slot = 0
        for p, name in zip(spans, owner):
            self.queue = placeholder("queue", "queue" if name is None else f"queue:{name}")
            self.fence = placeholder("fence", "fence" if name is None else f"fence:{name}")
            if p.loop:
                n = p.ncmds // p.width
                rng = UOp.range(u64(n).after(*deps), self.e.ctx.fresh("range"), dtypes.uint64)
                cmd = rng * p.width if p.width > 1 else rng
                cmd = cmd + p.first if p.first else cmd
                body = self.command_buffer([rng], p, (rng + slot if slot else rng).cast(dtypes.int64), cmd, rng)
                deps = [rng.end(body)]
                slot += n
            else:
                deps = [self.command_buffer(deps, p, UOp.const(dtypes.int64, slot), None)]
                slot += 1
        return UOp.sink(*deps, arg=e.device)

    def fold(self, spans: Iterable[CommandBufferSpan]) -> list[CommandBufferSpan]:
        """One queue's command buffers with runs of like signaling ones as loops (``fold_signal_runs``, reading
        ``spans`` once), on the ICB path of a submit without buffer variables (their per-encoder arrays are not
        tabled); else as they are."""
        e = self.e
        if not self.ph.icb_path or e.inputs:
            return list(spans)
        warm, listed = e.device.needs_warmup, not e.device.residency_set

        def shape(first: int, count: int) -> object:
            return (len(self.pipelines(first, count, keep=True)) if warm else 0,
                    bool(e.slot_values or self.ph.resource_names(first, count, keep=True)) if listed else True)
        return fold_signal_runs(spans, shape, e.max_range)


def span_key(first: int, count: int) -> int:
    """One int for the span ``first .. first+count-1``: a memo's key (a tuple would be 56 bytes per span)."""
    return first << 32 | count


def _pipelines(e: SubmitReader, first: int, count: int) -> list[UOp]:
    """The distinct pipelines of commands ``first .. first+count-1`` in first-use order."""
    pipes = e.pipes  # IcbShape.pipeline (a name) -> the placeholder
    return [pipes[name] for name in dict.fromkeys([c[0].pipeline for c in e.cmds[first:first + count]])]


def _encoders(span: CommandBufferSpan) -> list[CommandBufferSpan | tuple[Blit, ...]]:
    """The encoders of ``span``'s command buffer in order: a span of commands per compute encoder, a tuple of
    blits per blit encoder (``CommandBufferSpan.segments``)."""
    if not span.blits:
        return [span] if span.ncmds else []
    return [span._replace(first=seg[0], ncmds=seg[1] - seg[0], blits=()) if isinstance(seg[0], int) else seg
            for seg in span.segments()]


def _compute_spans(span: CommandBufferSpan) -> list[CommandBufferSpan]:
    """The spans of ``span``'s compute encoders."""
    return [seg for seg in _encoders(span) if isinstance(seg, CommandBufferSpan)]


def encode_submit(ctx: _EncodeCtx, submit: UOp) -> UOp:
    """Lower one SUBMIT (module docstring). Raises ``EncodeError`` naming the command at fault."""
    return encode_queues(ctx, (submit,))


def encode_queues(ctx: _EncodeCtx, submits: tuple[UOp, ...]) -> UOp:
    """Lower the SUBMITs of several queues of one device (``mtlir.frontend.queue.queues``) into one message chain:
    one ICB, variables buffer and command-buffer table for all, each queue's command buffers on its own queue and
    fence, the queues one after another in the order given. Raises ``EncodeError`` naming the queue and command:
    also for TIMESTAMPs in a program of several queues or with cross-queue events (profiling is single-queue)."""
    device = submits[0].arg
    if not isinstance(device, DeviceSpec):
        raise EncodeError(f"a SUBMIT's arg is the DeviceSpec, got {type(device).__name__}")
    e = SubmitReader(device, ctx.max_range, ctx.pass_ctx)
    for submit in submits:
        if submit.arg != device:
            raise EncodeError(f"the queues of one program are on one device: {submit.arg} is not {device}")
        e.read(submit)
    names = [q.name for q in e.queues]
    if len(set(names)) != len(names):
        raise EncodeError(f"two queues of the program are named {next(n for n in names if names.count(n) > 1)!r}")
    check_events(e)
    ctx.pass_ctx.diagnostics.extend(replay_notes(e))
    foreign = any(kind == "wait" or ev is not e.timeline for q in e.queues for _, kind, _, ev in q.marks)
    if e.stamps_at and (len(e.queues) > 1 or foreign):
        raise EncodeError("TIMESTAMPs (a profiled submit) are supported in a program of one queue that signals "
                          "only its own timeline, without blits")
    icb_path = device.icb and bool(e.cmds)
    if icb_path and e.too_far:
        ctx.pass_ctx.diagnostics.append(f"encode: {e.too_far}: the submit is lowered on the direct path")
        icb_path = False
    return _Builder(e, SubmitPlaceholders(e, icb_path)).build()


@dataclass(frozen=True)
class _EncodeCtx:
    max_range: int
    pass_ctx: PassContext


# a SUBMIT becomes the argument layout, the ICB placeholder and the message chain of METAL.md §1
ENCODE = PatternMatcher([(UPat(Ops.SUBMIT, name="submit"), encode_submit)])


def _several_queues(graph: UOp) -> bool:
    """A queue graph of several queues: ``SINK(SUBMIT, ...)`` (``mtlir.frontend.queue.queues``)."""
    return graph.op is Ops.SINK and bool(graph.src) and all(u.op is Ops.SUBMIT for u in graph.src)


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
        if _several_queues(graph):
            return encode_queues(_EncodeCtx(self.max_range, ctx), graph.src)
        if graph.op is Ops.SUBMIT:  # the usual root: no walk over the queue graph's nodes to find it
            return encode_submit(_EncodeCtx(self.max_range, ctx), graph)
        return graph_rewrite(graph, ENCODE, ctx=_EncodeCtx(self.max_range, ctx), name="encode",
                             results_final=True)
