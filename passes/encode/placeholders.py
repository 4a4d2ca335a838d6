"""The link-time placeholders of one submit and the per-submit patches that go with them (docs/internals.md,
"Placeholders"), for ``encode``.

- The variables buffer ``varbuf``: one 256-byte slot per distinct variable value; link writes the constant ones once
  (the payload's ``inits``), each submit STOREs the others into its ``contents``.
- The ICB (``IcbSpec``: every command as data, built once by link) and, per submit, the commands whose sizes depend
  on variables (``concurrentDispatchThreadgroups:threadsPerThreadgroup:``) or that bind a buffer variable
  (``setKernelBuffer:offset:atIndex:``).
- Without a residency set, each encoder's ``useResources:count:usage:`` arrays: ``resources`` (the buffers its
  commands bind), ``scratch:inputs`` (the buffer variables, STOREd per submit), and in a profiled loop the
  ``table`` placeholders indexed by the loop counter that give each iteration its own.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from mtlir.ir.dtypes import dtypes
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp
from mtlir.metal import Obj
from mtlir.passes.encode.messages import msg, u64
from mtlir.passes.encode.commands import VAR_SLOT, Command, placeholder
from mtlir.passes.encode.spans import CommandBufferSpan
from mtlir.passes.encode.submit import SubmitReader
from mtlir.program.payloads import CommandList, IcbCommand, IcbShape, IcbSpec, TableEntries

__all__ = ["SubmitPlaceholders"]


@dataclass
class SubmitPlaceholders:
    """The placeholders of the submit ``e`` read (module docstring), on the ICB path or not (``icb_path``):
    ``patches()`` creates the variables buffer and the ICB and returns the per-submit patches; ``input_arrays``
    the buffer-variable arrays of each encoder (their STOREs in ``input_patches``); ``resources`` one encoder's
    ``useResources:count:usage:`` array and count; ``slot_ptr`` the host address of a variable's slot."""

    e: SubmitReader
    icb_path: bool
    icb: UOp | None = None
    varbuf: UOp | None = None
    contents: UOp | None = None
    inputs: dict[int, tuple[UOp, UOp]] = field(default_factory=dict)  # span.first -> its encoder's inputs (array,
    #                                                                   count) for useResources, when it binds any
    input_patches: list[UOp] = field(default_factory=list)             # STOREs of the handles into those arrays
    loop_offsets: dict[int, UOp] = field(default_factory=dict)        # span.first -> table of input offsets
    names_memo: dict[int, tuple[str, ...]] = field(default_factory=dict)  # span_key -> resource_names, no varbuf
    names_seen: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)  # equal tuples: one object

    def slot_ptr(self, slot: int) -> UOp:
        """The host address of variables-buffer slot ``slot`` (uint8*)."""
        assert self.contents is not None
        # slot 0 is the pointer itself: encode builds nothing symbolic's rules fold (INDEX by 0 is one), so the
        # default pipeline needs no symbolic pass after it (passes/symbolic.py)
        return self.contents.index(UOp.const(dtypes.int64, slot * VAR_SLOT)) if slot else self.contents

    def patches(self) -> list[UOp]:
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
            for i, record in enumerate(e.cmds):
                shape = record[0]  # the IcbShape: its names hold "" for a buffer variable
                if not (shape.symbolic or (e.inputs and "" in shape.names)):
                    continue
                c = e.command(i)
                cmd = placeholder("icbcmd", f"icb[{i}]", (i,))
                for (index, _), a in zip(c.kernel.buffers, c.args):
                    b = e.binding(a)
                    if b.name is None:
                        patches.append(msg("setKernelBuffer:offset:atIndex:", cmd, b.base, u64(b.offset), u64(index)))
                if c.symbolic:
                    patches.append(msg("concurrentDispatchThreadgroups:threadsPerThreadgroup:", cmd, c.grid.node,
                                       c.threadgroup.node))
        return patches

    def command_inputs(self, c: Command) -> tuple[UOp, ...]:
        """The buffer variables command ``c`` binds, each once, in parameter order."""
        binding = self.e.binding
        return tuple(dict.fromkeys(b.base for b in (binding(a) for a in c.args[:len(c.kernel.buffers)])
                                   if b.name is None))

    def input_arrays(self, spans: list[CommandBufferSpan]) -> None:
        """Per encoder of the ICB path without a residency set, the buffer variables its commands bind, for a
        second ``useResources:count:usage:``: a ``scratch`` array of their handles STOREd by every submit
        (``scratch:inputs`` for an encoder that runs the whole submit, ``scratch:inputs:F`` for one whose first
        command is F); none when the encoder binds none. In a profiled loop whose iterations bind different ones,
        one array holds each distinct list once and two link-time tables indexed by the counter give the
        iteration's offset into it and its count (0 for an iteration that binds none)."""
        cmds = self.e.cmds
        for p in spans:
            if not p.ncmds:
                continue
            if not p.loop:
                names: dict[UOp, None] = {}
                for i in range(p.first, p.first + p.ncmds):
                    names.update(dict.fromkeys(self.command_inputs(self.e.command(i))))
                if names:
                    whole = p.first == 0 and p.ncmds == len(cmds)
                    arr = self.input_array("scratch:inputs" if whole else f"scratch:inputs:{p.first}", tuple(names))
                    self.inputs[p.first] = (arr, u64(len(names)))
                continue
            lists = [self.command_inputs(self.e.command(i)) for i in range(p.first, p.first + p.ncmds)]
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
        """The ICB payload: every command as data (``IcbCommand``), the pipelines and buffers it names. Without
        buffer variables the records ``SubmitReader.read`` made are the ICB's (one ``IcbShape`` per kind)."""
        e = self.e
        if not e.inputs:
            commands = CommandList(e.cmds)
        else:  # a buffer variable's binding is left to each submit
            kinds: dict[int, IcbShape] = {}  # id(reader's shape) -> the ICB's (its bindings but buffer variables')
            out = []
            for c in e.cmds:
                shape = kinds.get(id(c[0]))
                if shape is None:
                    s0 = c[0]
                    keep = [j for j, name in enumerate(s0.names) if name]
                    shape = kinds[id(s0)] = s0._replace(
                        names=tuple(s0.names[j] for j in keep), indices=tuple(s0.indices[j] for j in keep),
                        rebound=tuple(index for name, index in zip(s0.names, s0.indices) if not name),
                        extents=tuple(s0.extents[j] for j in keep))
                out.append(IcbCommand.of(shape, [off for name, off in zip(c[0].names, c[1:]) if name]))
            commands = CommandList(out)
        pipelines = tuple(dict.fromkeys(k.pipeline.arg for k in e.kernels.values()))
        buffers = tuple(o.arg for o in e.buffers.values())
        if self.varbuf is not None:
            buffers += (self.varbuf.arg,)
        top = max((p.index for k in e.kernels.values() for p in k.kernel.params), default=-1)
        return IcbSpec(commands, pipelines, buffers, top + 1)

    def resource_names(self, first: int, count: int, keep: bool = False) -> tuple[str, ...]:
        """The buffers commands ``first .. first+count-1`` bind, each once in first-use order (a view counts as
        its buffer; buffer variables are listed apart), then the variables buffer when the submit has one.
        ``keep``: remember them for the next call on the same span (a loop's folding asks before its encoder does;
        a profiled loop asks once per command, and keeping each would cost ~150 bytes per command)."""
        e = self.e
        names = self.names_memo.get(first << 32 | count)  # a loop's folding and its encoder ask for the same spans
        if names is None:
            if first == 0 and count == len(e.cmds):
                names = tuple(e.buffers)
            else:
                names = tuple(dict.fromkeys([n for c in e.cmds[first:first + count] for n in c[0].names
                                             if n and n != "varbuf"]))
            if keep:
                names = self.names_memo[first << 32 | count] = self.names_seen.setdefault(names, names)
        return names + (("varbuf",) if self.varbuf is not None else ())

    def resources(self, span: CommandBufferSpan, counter: UOp | None) -> tuple[UOp, UOp]:
        """The ``useResources:count:usage:`` array and count of one encoder: exactly the buffers its commands bind
        (+ the variables buffer). In a loop (``counter``) each iteration's commands have their own list: a
        ``resources`` array per distinct list, and two link-time tables indexed by the counter give the iteration's
        array and its length (the array itself when every iteration lists the same buffers)."""
        ptr = dtypes.id.ptr()
        if counter is None:
            names = self.resource_names(span.first, span.ncmds)
            whole = span.first == 0 and span.ncmds == len(self.e.cmds)
            table = placeholder("resources", "resources" if whole else f"resources:{span.first}", names, ptr)
            return table, u64(len(names))
        arrays: dict[tuple[str, ...], Obj] = {}  # a list of names -> the placeholder of that array
        per_iteration: list[Obj] = []
        if span.width == 1 and span.ncmds < len(self.e.cmds):  # a profiled loop: resource_names of each command
            tail = ("varbuf",) if self.varbuf is not None else ()
            every: Iterator[tuple[str, ...]] = (  # one at a time: a list of them was ~70 bytes per command
                tuple(dict.fromkeys([n for n in c[0].names if n and n != "varbuf"])) + tail
                for c in self.e.cmds[span.first:span.first + span.ncmds])
        else:
            every = (self.resource_names(j, span.width) for j in range(span.first, span.first + span.ncmds, span.width))
        for j, names in zip(range(span.first, span.first + span.ncmds, span.width), every):
            obj = arrays.get(names)
            if obj is None:
                obj = arrays[names] = Obj("resources", f"resources:{j}", names)
            per_iteration.append(obj)
        if len(arrays) == 1:
            return UOp(Ops.OBJECT, ptr, (), per_iteration[0]), u64(len(per_iteration[0].payload))
        # the table holds the arrays themselves (link makes each, then writes its address per iteration)
        table = placeholder("table", f"table:resources:{span.first}", TableEntries(per_iteration), ptr.ptr())
        counts = placeholder("table", f"table:resource-counts:{span.first}",
                             TableEntries(len(o.payload) for o in per_iteration), dtypes.uint64.ptr())
        return table.index(counter).load(), counts.index(counter).load()
