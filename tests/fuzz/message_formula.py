"""The number of messages one submit sends, from the queue's shape alone: the formula of docs/lowering.md
("Messages per submit"), written independently of encode so the fuzzing can hold the lowering to it."""
from __future__ import annotations

from dataclasses import dataclass, field

from msl_library import LIBRARY
from queue_spec import Op, QueueSpec

MAX_RANGE = 16384  # commands per executeCommandsInBuffer:withRange: (encode's max-range)
_TAKES = {k.kernel.key: (1 + k.inputs, 2 if k.gathers else 1) for k in LIBRARY}  # (buffers, variables) per kernel


@dataclass
class _CommandBuffer:
    waits: int = 0
    commands: list[Op] = field(default_factory=list)
    signals: int = 0


def command_buffers(ops: tuple[Op, ...]) -> list[_CommandBuffer]:
    """The command buffers a submit commits: a signal closes one (the queue's final signal of its timeline closes
    the last); a wait on a shared event or on another queue's timeline goes on the command buffer of what follows
    it (a command buffer that has commands is committed first, without a signal); a wait on the queue's own
    timeline is nothing; with a timestamp anywhere the submit is profiled: one command buffer per dispatch."""
    profiled = any(op.kind == "timestamp" for op in ops)
    cbs, cur = [], _CommandBuffer()
    for op in (*ops, Op("signal")):
        if op.kind in ("exec", "copy", "fill"):
            if profiled and cur.commands:
                cbs.append(cur)
                cur = _CommandBuffer()
            cur.commands.append(op)
        elif op.kind in ("event-wait", "queue-wait"):
            if cur.commands:  # the wait goes before the next encoder: the commands before it are committed first
                cbs.append(cur)
                cur = _CommandBuffer()
            cur.waits += 1
        elif op.kind == "signal":
            cur.signals = 1
            cbs.append(cur)
            cur = _CommandBuffer()
    return cbs


def _input_bindings(spec: QueueSpec, op: Op) -> int:
    """How many buffer parameters of dispatch ``op`` bind a buffer variable (an input rebound per submit)."""
    assert op.out is not None
    return sum(1 for v in (op.out, *op.ins) if v.buffer in spec.inputs)


def messages_per_submit(spec: QueueSpec) -> int:
    """The messages of one submit of ``spec``:

    patches (ICB path: one ``concurrentDispatchThreadgroups:threadsPerThreadgroup:`` per command whose sizes depend
    on a variable, one ``setKernelBuffer:offset:atIndex:`` per binding of a buffer variable) + per command buffer:
    2 (``commandBuffer``, ``retain``) + its shared-event waits + its signals + 1 (``commit``) + per encoder (a run
    of dispatches, or of blits) 4 (``computeCommandEncoder`` or ``blitCommandEncoder``, ``waitForFence:``,
    ``updateFence:``, ``endEncoding``) and for a blit encoder one message per blit, for a compute encoder
    - ICB path: without a residency set 1 ``useResources:count:usage:`` (+ 1 more when its commands bind a buffer
      variable, or, in the loop of a profiled submit, when any command of the loop binds one) + 2 per distinct
      pipeline on Apple7 (the warm-up ``setComputePipelineState:`` + empty dispatch) + ceil(commands / 16384)
      ``executeCommandsInBuffer:withRange:``;
    - direct path: per command 2 (``setComputePipelineState:``, ``dispatchThreadgroups:...``) + one
      ``setBuffer:offset:atIndex:`` per buffer + one ``setBytes:length:atIndex:`` per variable.

    With several queues the command buffers are counted queue by queue, each queue's operations on their own (a
    blit's run-time offsets and size change its arguments, not its messages)."""
    t = spec.target
    execs = [op for op in spec.ops if op.kind == "exec"]
    total = sum((1 if isinstance(op.n, str) else 0) + _input_bindings(spec, op) for op in execs) if t.icb else 0
    for q in spec.queues():
        total += _queue_messages(spec, tuple(op for op in spec.ops if op.queue == q))
    return total


def _queue_messages(spec: QueueSpec, ops: tuple[Op, ...]) -> int:
    """The messages of the command buffers of one queue whose operations are ``ops`` (``messages_per_submit``)."""
    t = spec.target
    total = 0
    cbs = command_buffers(ops)
    # a profiled submit on the ICB path folds its one-command buffers without a signal (all but the last: it
    # signals) into a loop when there are 2 or more: every iteration sends what any iteration needs (the second
    # useResources, with a count of 0 for a command that binds no buffer variable)
    profiled = any(op.kind == "timestamp" for op in ops)
    loop = cbs[:-1] if profiled and len(cbs) > 2 else []
    looped = any(_input_bindings(spec, op) for cb in loop for op in cb.commands)
    for n, cb in enumerate(cbs):
        total += 2 + cb.waits + cb.signals + 1
        for encoder in _encoders(cb.commands):
            total += 4
            if encoder[0].kind != "exec":  # a blit encoder: one message per blit
                total += len(encoder)
                continue
            kernels = [op.kernel for op in encoder]
            if t.icb:
                if not t.residency_set:
                    inputs = (looped and n < len(loop)) or any(_input_bindings(spec, op) for op in encoder)
                    total += 1 + (1 if inputs else 0)
                total += (2 * len(set(kernels)) if t.family == "Apple7" else 0) + -(-len(kernels) // MAX_RANGE)
            else:
                total += sum(2 + sum(_TAKES[k]) for k in kernels)
    return total


def _encoders(commands: list[Op]) -> list[list[Op]]:
    """The encoders of a command buffer: each run of dispatches one compute encoder, each run of blits one blit
    encoder."""
    out: list[list[Op]] = []
    for op in commands:
        if out and (out[-1][0].kind == "exec") == (op.kind == "exec"):
            out[-1].append(op)
        else:
            out.append([op])
    return out
