"""Cutting a read SUBMIT into command buffers (``CommandBufferSpan``): a SIGNAL closes one, a WAIT on another event
starts one; with TIMESTAMPs one per command, runs folded into loops; and which command buffer's GPU time each
timestamp slot gets (``stamps``).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Callable, NamedTuple

from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp
from mtlir.passes.encode.commands import Blit, Command, EncodeError, QueueRange
from mtlir.program.payloads import Stamp, StampList

if TYPE_CHECKING:
    from mtlir.passes.encode.submit import SubmitReader

__all__ = ["CommandBufferSpan", "command_buffers", "fold_signal_runs", "queue_command_buffers", "stamps"]

_new = tuple.__new__  # a NamedTuple at C speed (its generated __new__ is Python code): records per command

MIN_LOOP = 4  # the fewest like command buffers fold_signal_runs makes a loop of (fewer stay unrolled)


class CommandBufferSpan(NamedTuple):
    """The span of commands one command buffer of the submit encodes, ``first`` .. ``first + ncmds - 1``, and the
    value its ``signal`` sends; with ``loop``, a loop (RANGE) of ``ncmds // width`` command buffers of ``width``
    commands each over the span (``fold_signal_runs``: each signaling ``event`` with its value of ``values``).
    ``event``: the event it signals (None: the queue's timeline); ``waits``: ``(event, value)`` of each
    ``encodeWaitForEvent:value:`` before its encoder (waits on other queues' timelines or shared events)."""

    first: int                                  # first command
    ncmds: int                                  # commands (0: a command buffer that only signals)
    signal: UOp | None                          # the value encodeSignalEvent:value: sends
    loop: bool                                  # a RANGE over `ncmds` one-command buffers
    event: UOp | None = None                    # the event signaled (None: the queue's timeline)
    waits: tuple[tuple[UOp, UOp], ...] = ()     # (event, value) waited for before the encoder
    blits: tuple[tuple[int, Blit], ...] = ()    # (command position, blit): a blit encoder before that command
    width: int = 1                              # a loop: commands per iteration (per command buffer)
    values: tuple[int, ...] = ()                # a loop of signaling command buffers: each iteration's signal value

    def segments(self) -> list[tuple[int, int] | tuple[Blit, ...]]:
        """The encoders of this command buffer in order: ``(first, end)`` command ranges for compute encoders and
        tuples of blits for blit encoders (the blits between two commands share one)."""
        out: list[tuple[int, int] | tuple[Blit, ...]] = []
        cur, end = self.first, self.first + self.ncmds
        group: list[Blit] = []
        for pos, blit in self.blits:
            if pos > cur:
                if group:
                    out.append(tuple(group))
                    group = []
                out.append((cur, pos))
                cur = pos
            group.append(blit)
        if group:
            out.append(tuple(group))
        if cur < end:
            out.append((cur, end))
        return out


def queue_command_buffers(reader: SubmitReader, q: QueueRange) -> Iterator[CommandBufferSpan]:
    """The command buffers of queue ``q`` (not profiled), in order, one at a time (``fold_signal_runs`` folds them
    as they come: a list of them all was 60 bytes per command with a signal every second command): a SIGNAL
    closes one (signaling its event); a WAIT on another event starts a new one (closing the current one when it
    has commands) whose ``encodeWaitForEvent:value:`` comes before its encoder."""
    start, waits = q.first, list[tuple[UOp, UOp]]()
    blits: list[tuple[int, Blit]] = []
    for pos, kind, value, ev in q.marks:
        if kind == "blit":
            blits.append((pos, reader.blits[value]))
        elif kind == "signal":
            yield _new(CommandBufferSpan, (start, pos - start, value, False, ev, tuple(waits), tuple(blits), 1, ()))
            start, waits, blits = pos, [], []
        else:
            if pos > start or blits:
                yield CommandBufferSpan(start, pos - start, None, False, None, tuple(waits), tuple(blits))
                start, waits, blits = pos, [], []
            waits.append((ev, value))
    if start < q.end or waits or blits:
        yield CommandBufferSpan(start, q.end - start, None, False, None, tuple(waits), tuple(blits))

def command_buffers(reader: SubmitReader, profiled: bool, loops: bool,
                    shape: Callable[[int], object] | None = None) -> list[CommandBufferSpan]:
    """The command buffers of the submit (module docstring), in order; ``profiled``: one per command (the
    submit has TIMESTAMPs); ``loops``: fold runs of one-command buffers without a signal into loops, of commands
    whose ``shape(command)`` is the same when given (the direct path: what its messages must share)."""
    n = len(reader.cmds)
    signals = reader.signals
    spans: list[CommandBufferSpan] = []
    if not profiled:
        return [span for q in reader.queues for span in queue_command_buffers(reader, q)]
    j = 0
    # the spans as plain tuples in CommandBufferSpan's field order (its generated __new__ is Python code: per command)
    for pos in range(n + 1):
        while j < len(signals) and signals[j][0] == pos:
            last = spans[-1] if spans else None
            if last is not None and last.ncmds and last.signal is None and last.first + last.ncmds == pos:
                spans[-1] = last._replace(signal=signals[j][1])
            else:
                spans.append(CommandBufferSpan(pos, 0, signals[j][1], False))
            j += 1
        if pos < n:
            spans.append(_new(CommandBufferSpan, (pos, 1, None, False, None, (), (), 1, ())))
    if not loops:
        return spans
    out: list[CommandBufferSpan] = []
    last_first, last_shape = -1, None  # the shape of out[-1]'s first command, once asked (a loop's are all alike)
    for p in spans:
        prev = out[-1] if out else None
        if p.ncmds == 1 and p.signal is None and prev is not None and prev.signal is None and prev.ncmds >= 1 \
                and prev.first + prev.ncmds == p.first:
            if shape is not None:
                if last_first != prev.first:
                    last_first, last_shape = prev.first, shape(prev.first)
                cur = shape(p.first)
                if cur != last_shape:
                    out.append(p)
                    last_first, last_shape = p.first, cur
                    continue
            out[-1] = _new(CommandBufferSpan, (prev.first, prev.ncmds + 1, None, True, None, (), (), 1, ()))
        else:
            out.append(p)
    return out

def fold_signal_runs(spans: Iterable[CommandBufferSpan], shape: Callable[[int, int], object],
                     max_range: int) -> list[CommandBufferSpan]:
    """Fold runs of at least ``MIN_LOOP`` like command buffers of one queue into loops (``loop``, ``width``,
    ``values``): consecutive spans of ``width`` commands each (at most ``max_range``: one
    ``executeCommandsInBuffer:withRange:`` per iteration), each closed by a signal of one event with a constant
    value, without waits or blits, whose ``shape(first, width)`` (what else must agree between iterations: how many
    distinct pipelines the warm-up sends, whether useResources lists anything) is the same. A loop sends the same
    messages as the command buffers it replaces; its per-iteration values come from link-time tables. ``spans`` is
    read once, in order: of a run only its first ``MIN_LOOP`` spans and its signal values are kept."""
    const = Ops.CONST

    def key(p: CommandBufferSpan) -> object:
        if p.loop or p.waits or p.blits or not 1 <= p.ncmds <= max_range or p.signal is None \
                or p.signal.op is not const:
            return None
        return (p.ncmds, p.event, shape(p.first, p.ncmds))

    out: list[CommandBufferSpan] = []
    run: list[CommandBufferSpan] = []  # the run so far: its first MIN_LOOP spans
    run_key: object = None             # its key (None: a span that folds with none)
    count = total = end = 0            # its spans, their commands, where the next one must start
    values: list[int] = []             # its signal values

    def close() -> None:
        if count < MIN_LOOP:
            out.extend(run)
        else:
            first = run[0]
            out.append(CommandBufferSpan(first.first, total, None, True, first.event, width=first.ncmds,
                                         values=tuple(values)))
    for p in spans:
        k = key(p)
        if k is not None and run_key is not None and p.first == end and k == run_key:
            count, total, end = count + 1, total + p.ncmds, p.first + p.ncmds
            values.append(int(p.signal.arg))  # type: ignore[union-attr]  # (key: a constant signal value)
            if len(run) < MIN_LOOP:
                run.append(p)
            continue
        if run:
            close()
        run, run_key, count, total, end = [p], k, 1, p.ncmds, p.first + p.ncmds
        values = [int(p.signal.arg)] if k is not None and p.signal is not None else []
    if run:
        close()
    return out


def stamps(reader: SubmitReader, spans: list[CommandBufferSpan]) -> StampList:
    """Which command buffer's GPU time each timestamp slot gets (``Queue.timestamp``): right after an EXEC its
    end, else the start of the next command, else the end of the last one."""
    n = len(reader.cmds)
    cb_of = [0] * n
    slot = 0
    for p in spans:
        for c in range(p.first, p.first + p.ncmds):
            cb_of[c] = slot + ((c - p.first) // p.width if p.loop else 0)
        slot += p.ncmds // p.width if p.loop else 1
    out = []
    at = reader.stamps_at  # (position, slot, after an EXEC) flat
    for pos, stamp_slot, after_exec in zip(at[0::3], at[1::3], at[2::3]):
        if after_exec or (pos == n and n > 0):
            out.append(_new(Stamp, (stamp_slot, cb_of[pos - 1], "GPUEndTime")))
        elif pos < n:
            out.append(_new(Stamp, (stamp_slot, cb_of[pos], "GPUStartTime")))
        else:
            raise EncodeError(f"timestamp slot {stamp_slot}: the submit has no command to time")
    return StampList(out)
