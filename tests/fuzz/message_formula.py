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
    kernels: list[str] = field(default_factory=list)
    signals: int = 0


def command_buffers(ops: tuple[Op, ...]) -> list[_CommandBuffer]:
    """The command buffers a submit commits: a signal closes one (the queue's final signal of its timeline closes
    the last); a wait on a shared event goes on the command buffer of what follows it (a command buffer that has
commands is committed first, without a signal); a wait on the queue's own
    timeline is nothing; with a timestamp anywhere the submit is profiled: one command buffer per dispatch."""
    profiled = any(op.kind == "timestamp" for op in ops)
    cbs, cur = [], _CommandBuffer()
    for op in (*ops, Op("signal")):
        if op.kind == "exec":
            if profiled and cur.kernels:
                cbs.append(cur)
                cur = _CommandBuffer()
            cur.kernels.append(op.kernel)
        elif op.kind == "event-wait":
            if cur.kernels:  # the wait goes before the next encoder: the commands before it are committed first
                cbs.append(cur)
                cur = _CommandBuffer()
            cur.waits += 1
        elif op.kind == "signal":
            cur.signals = 1
            cbs.append(cur)
            cur = _CommandBuffer()
    return cbs


def messages_per_submit(spec: QueueSpec) -> int:
    """The messages of one submit of ``spec``:

    patches (ICB path: one ``concurrentDispatchThreadgroups:threadsPerThreadgroup:`` per command whose sizes depend
    on a variable) + per command buffer: 2 (``commandBuffer``, ``retain``) + its shared-event waits + its signals
    + 1 (``commit``) + when it has commands, 4 (``computeCommandEncoder``, ``waitForFence:``, ``updateFence:``,
    ``endEncoding``) and
    - ICB path: 1 ``useResources:count:usage:`` without a residency set + 2 per distinct pipeline on Apple7 (the
      warm-up ``setComputePipelineState:`` + empty dispatch) + ceil(commands / 16384) ``executeCommandsInBuffer``;
    - direct path: per command 2 (``setComputePipelineState:``, ``dispatchThreadgroups:...``) + one
      ``setBuffer:offset:atIndex:`` per buffer + one ``setBytes:length:atIndex:`` per variable."""
    t = spec.target
    execs = [op for op in spec.ops if op.kind == "exec"]
    total = sum(1 for op in execs if isinstance(op.n, str)) if t.icb else 0
    for cb in command_buffers(spec.ops):
        total += 2 + cb.waits + cb.signals + 1
        if not cb.kernels:
            continue
        total += 4
        if t.icb:
            total += (0 if t.residency_set else 1) + (2 * len(set(cb.kernels)) if t.family == "Apple7" else 0)
            total += -(-len(cb.kernels) // MAX_RANGE)
        else:
            total += sum(2 + sum(_TAKES[k]) for k in cb.kernels)
    return total
