"""Checks of METAL.md §3 that look at more than one call: what a range of ICB commands binds, what a committed
command buffer reads, and the strict-mode checks built on that (rules 8, 9, 10, 13, 14, 15, 16).

``analyze_range`` reads the commands ``[first, first + count)`` of an ICB once per ICB ``version`` (every CPU
write to a command bumps it), so replaying the same ICB costs a dictionary lookup, not a walk over its commands.
Rule 9 needs the kernels' actual accesses, which only running them shows: strict mode runs every group of
concurrent commands that share a buffer twice at commit, in program order and in reverse order, on copies of
the memory as it is at that moment, and calls it a race when the results differ (a race whose outcome does not
depend on the order is invisible to a program and is not reported).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mtlir.errors import MetalValidationError
from mtlir.metal import MTL
from mtlir.runtime.sim.objects import (ICB, Buffer, CommandBuffer, Dispatch, Encoder, Execute, ICBCommand, Pipeline,
                                       SimObject)
from mtlir.runtime.sim.rules.rule import Rule, violation

if TYPE_CHECKING:
    from mtlir.runtime.sim.device import SimDevice

__all__ = ["RangeInfo", "analyze_range", "check_execute", "check_commit", "collect_reads", "check_buffer_write",
           "check_icb_write", "check_release", "icb_users", "slot_problems", "size_problem",
           "MAX_THREADS_PER_GRID_AXIS"]

# Threads per grid axis (grid x threadgroup) must stay below 2**32: `thread_position_in_grid` and
# `threads_per_grid` are 32-bit `uint`s in MSL (Metal Shading Language Specification, "Attributes for kernel
# function input arguments"), so a thread beyond that cannot be addressed. A size that went below 1 in a
# run-time expression and wrapped to 2**64 - k lands here.
MAX_THREADS_PER_GRID_AXIS = 1 << 32


def size_problem(grid: tuple[int, int, int], threadgroup: tuple[int, int, int], p: Pipeline | None) -> \
        tuple[Rule, str] | None:
    """What Metal refuses in a dispatch of ``grid`` threadgroups (per axis) of ``threadgroup`` threads with
    pipeline ``p``, as ``(rule, message)``; None when the sizes are fine or the dispatch is empty (a zero axis:
    Metal accepts it and runs nothing). Rule 13: prod(threadgroup) above the pipeline's
    maxTotalThreadsPerThreadgroup. Rule 0 (API validation): grid x threadgroup at or above 2**32 threads on an
    axis (``MAX_THREADS_PER_GRID_AXIS``)."""
    if 0 in grid or 0 in threadgroup:
        return None
    threads = math.prod(threadgroup)
    if p is not None and threads > p.max_threads:
        return (Rule.THREADGROUP_LIMIT,
                f"threadsPerThreadgroup {list(threadgroup)}: {threads} threads per threadgroup > "
                f"maxTotalThreadsPerThreadgroup {p.max_threads} of {p.describe()}: Metal drops the dispatch "
                "silently")
    per_axis = [g * t for g, t in zip(grid, threadgroup)]
    if any(n >= MAX_THREADS_PER_GRID_AXIS for n in per_axis):
        axis = "xyz"[next(i for i, n in enumerate(per_axis) if n >= MAX_THREADS_PER_GRID_AXIS)]
        return (Rule.API_VALIDATION,
                f"threadgroupsPerGrid {list(grid)} x threadsPerThreadgroup {list(threadgroup)} = {per_axis} "
                f"threads per axis: axis {axis} is not below 2**32 (thread positions are 32-bit uints; "
                "a run-time size that went below 1 and wrapped?)")
    return None


@dataclass
class RangeInfo:
    """What commands ``[first, first + count)`` of an ICB bind: ``buffers`` (buffer -> (lowest byte offset, first
    command binding it)), ``pipelines``, ``problems`` ((rule, message) a strict device refuses at
    executeCommandsInBuffer:withRange:) and ``shared_groups`` (groups of concurrent commands, no setBarrier between
    them, that bind a common buffer: rule 9 candidates); ``reads``: ``buffers`` as (buffer, lowest byte offset)
    pairs, what a command buffer executing the range reads (``collect_reads``, at every commit)."""

    buffers: dict[Buffer, tuple[int, int]] = field(default_factory=dict)
    pipelines: dict[Pipeline, int] = field(default_factory=dict)  # pipeline -> first command using it, in order
    problems: list[tuple[Rule, str]] = field(default_factory=list)
    shared_groups: list[list[int]] = field(default_factory=list)
    reads: list[tuple[Buffer, int]] = field(default_factory=list)
    resident_in: frozenset[SimObject] | None = None  # a resident set found to hold all of ``buffers`` (rule 10)


def slot_problems(dev: SimDevice, icb: ICB, i: int) -> list[tuple[Rule, str]]:
    """What is wrong with ICB command ``i`` as it stands (no pipeline, a pipeline without ICB support, an unbound
    or misaligned buffer index, too many threads per threadgroup)."""
    slot, out = icb.slots[i], list[tuple[Rule, str]]()
    what = f"ICB command {i}"
    if slot.grid is None:
        return out
    p = slot.pipeline
    if p is None:
        return [(Rule.ICB_LIMITS,
                 f"{what} has a dispatch but no pipeline (setComputePipelineState: was never sent to it)")]
    if not p.support_icb:
        out.append((Rule.API_VALIDATION,
                    f"{what} uses {p.describe()}, made without supportIndirectCommandBuffers = YES"))
    for index, kind, size in p.params:
        b = slot.bindings.get(index)
        if b is None:
            out.append((Rule.ICB_LIMITS,
                        f"{what} ({p.label}): buffer index {index} is not bound with setKernelBuffer:offset:"
                        "atIndex:"))
            continue
        align = dev.constant_align if kind == "constant" else size
        if b[1] % align:
            out.append((Rule.ICB_LIMITS,
                        f"{what} ({p.label}): offset {b[1]} of buffer index {index} ({kind}) is not a multiple "
                        f"of {align} bytes"))
    sizes = size_problem(slot.grid, slot.threadgroup, p)
    if sizes is not None:
        out.append((sizes[0], f"{what} ({p.label}): {sizes[1]}"))
    return out


def analyze_range(dev: SimDevice, icb: ICB, first: int, count: int) -> RangeInfo:
    """The ``RangeInfo`` of commands ``[first, first + count)`` (clipped to the ICB), cached per ICB version."""
    key = (first, count)
    hit = icb.analysis.get(key)
    if hit is not None and hit[0] == icb.version:
        return hit[1]  # type: ignore[no-any-return]
    info = RangeInfo()
    group: list[int] = []
    groups: list[list[int]] = []
    for i in range(first, min(first + count, icb.max_count)):
        slot = icb.slots.get(i)
        if slot is None or slot.grid is None:
            continue
        if slot.pipeline is not None:
            info.pipelines.setdefault(slot.pipeline, i)
        info.problems += slot_problems(dev, icb, i)
        for buf, off in slot.bindings.values():
            lo = info.buffers.get(buf)
            if lo is None or off < lo[0]:
                info.buffers[buf] = (off, i if lo is None else lo[1])
        if group and slot.barrier:
            groups.append(group)
            group = []
        group.append(i)
    groups.append(group)
    for g in groups:
        if len(g) > 1:
            seen: set[Buffer] = set()
            shared = False
            for i in g:
                bufs = {b for b, _ in icb.slots[i].bindings.values()}
                shared = shared or bool(seen & bufs)
                seen |= bufs
            if shared:
                info.shared_groups.append(g)
    info.reads = [(buf, lo) for buf, (lo, _) in info.buffers.items()]
    if len(icb.analysis) > 64:
        icb.analysis.clear()
    icb.analysis[key] = (icb.version, info)
    return info


def check_execute(dev: SimDevice, enc: Encoder, icb: ICB, first: int, count: int, call: object) -> None:
    """Strict checks of ``executeCommandsInBuffer:withRange:``: rule 8 (range), the commands' problems, rule 16."""
    if first + count > icb.max_count:
        raise violation(Rule.ICB_LIMITS, call,
                        f"range ({first}, {count}) is outside [0, {icb.max_count}) of {icb.describe()}")
    if count > MTL.MAX_ICB_RANGE:
        raise violation(Rule.ICB_LIMITS, call, f"range length {count} is above the maximum of {MTL.MAX_ICB_RANGE}")
    info = analyze_range(dev, icb, first, count)
    if info.problems:
        rule, message = info.problems[0]
        raise violation(rule, call, message)
    if dev.spec.needs_warmup:
        for p, i in info.pipelines.items():  # the first offending command, whatever the hashes of the pipelines
            if p not in enc.bound_pipelines:
                raise violation(Rule.ICB_PIPELINE_WARMUP, call,
                                f"{p.describe()} is used by ICB command {i} but was not bound on this "
                                f"encoder with setComputePipelineState: first ({dev.spec.family} faults "
                                "with InvalidResource)")


def collect_reads(dev: SimDevice, cb: CommandBuffer) -> None:
    """At commit: record what ``cb`` reads (buffers from their lowest bound offset, ICB ranges) on the objects,
    for rule 15 (and the ICB ranges for rule 14: ``icb_users``); forgotten when it finishes."""
    reads: dict[Buffer, int] = {}
    for step in cb.steps:
        if not isinstance(step, Encoder):
            continue
        for command in step.commands:
            if isinstance(command, Dispatch):
                pairs = [b for b in command.bindings.values() if not isinstance(b, bytes)]
            else:
                cb.icb_reads.append((command.icb, command.first, command.count))
                pairs = analyze_range(dev, command.icb, command.first, command.count).reads
                if not reads:  # a range's reads hold one entry per buffer, its lowest offset: taken as they are
                    reads = dict(pairs)
                    continue
            for buf, off in pairs:
                if off < reads.get(buf, off + 1):
                    reads[buf] = off
    cb.reads = reads
    for buf, off in reads.items():
        buf.readers[cb] = off
    for icb, first, count in cb.icb_reads:
        icb.readers.setdefault(cb, []).append((first, count))


def check_commit(dev: SimDevice, cb: CommandBuffer, call: object) -> None:
    """Strict checks at ``commit``: rule 10 (every buffer an ICB command binds is resident) and rule 9 (a dry run
    of each group of concurrent commands that share a buffer, in both orders)."""
    for step in cb.steps:
        if not isinstance(step, Encoder):
            continue
        for command in step.commands:
            if not isinstance(command, Execute):
                continue
            info = analyze_range(dev, command.icb, command.first, command.count)
            # rule 10 once per (range, residency set's commit): a set's committed frozenset is shared by the
            # command buffers committed while it stands (encoding._commit), and a range's buffers are fixed per
            # ICB version (a new version is a new RangeInfo)
            if info.resident_in is not cb.resident:
                _check_resident(info, step, cb, command, call)
            for group in info.shared_groups:
                _dry_run(dev, command.icb, group, call)


def _check_resident(info: RangeInfo, step: Encoder, cb: CommandBuffer, command: Execute, call: object) -> None:
    """Rule 10 at commit: every buffer the range binds is in a residency set of the queue (committed and added)
    or named in useResources:count:usage: on its encoder. Notes on ``info`` when the resident set alone holds
    them all (the next commit under the same set needs no look)."""
    in_set = True
    for buf, (_, i) in info.buffers.items():
        if buf in cb.resident:
            continue
        in_set = False
        if buf not in step.used:
            raise violation(Rule.RESIDENCY, call,
                            f"ICB command {i} of {command.icb.describe()} binds {buf.describe()}, "
                            "which is neither in a residency set committed and added to the "
                            "queue nor named in useResources:count:usage: on its encoder: the "
                            "GPU faults (kIOGPUCommandBufferCallbackErrorInvalidResource)")
    if in_set:
        info.resident_in = cb.resident


def _dry_run(dev: SimDevice, icb: ICB, group: list[int], call: object) -> None:
    slots = [(i, icb.slots[i]) for i in group]
    runnable = [(i, s) for i, s in slots if s.pipeline is not None and s.grid is not None and 0 not in s.grid
                and 0 not in s.threadgroup and size_problem(s.grid, s.threadgroup, s.pipeline) is None
                and all(idx in s.bindings for idx, _, _ in s.pipeline.params)]
    buffers = {b for _, s in runnable for b, _ in s.bindings.values() if b.alive}
    # one snapshot for both orders: an earlier command buffer may still be running and writing these buffers, and
    # two snapshots taken apart would differ in bytes neither order touches (a race reported where there is none)
    snapshot = {b: b.storage.copy() for b in buffers}
    results: list[dict[Buffer, np.ndarray]] = []
    # the first order also notes which command changed each byte: two that both change one byte are a data race
    # even when both orders end alike (x += 1 and x += 2 concurrently can lose an update on a GPU)
    writer: dict[Buffer, np.ndarray] = {}
    for order in (runnable, runnable[::-1]):
        copies = {b: data.copy() for b, data in snapshot.items()}
        first = not results
        try:
            for i, s in order:
                assert s.pipeline is not None and s.grid is not None
                writes = _writable(s.pipeline)
                bound = {bb for idx, (bb, _) in s.bindings.items()
                         if bb in copies and (writes is None or idx in writes)}
                before = {bb: copies[bb].copy() for bb in bound} if first else {}  # what it may write, as it was
                bindings = {idx: (copies[b], off) for idx, (b, off) in s.bindings.items() if b in copies}
                dev.gpu.run_kernel_now(s.pipeline, bindings, s.grid, s.threadgroup)
                for bb, old in before.items():
                    _note_writes(writer, bb, old != copies[bb], i, icb, call)
        except MetalValidationError:
            raise
        except Exception:  # a kernel that fails is reported by the GPU when it really runs
            return
        results.append(copies)
    for buf in buffers:
        a, b = results[0][buf], results[1][buf]
        if not np.array_equal(a, b):
            byte = int(np.flatnonzero(a != b)[0])
            names = ", ".join(str(i) for i, _ in runnable)
            raise violation(Rule.ICB_RACE, call,
                            f"ICB commands {names} of {icb.describe()} run concurrently (no setBarrier "
                            f"between them) and touch overlapping bytes of {buf.describe()}: byte {byte} "
                            "ends different when they run in the other order (a data race)")


def _writable(p: Pipeline) -> frozenset[int] | None:
    """The buffer indices ``p``'s kernel may write through (the translation's ``ParamBinding.writable``: not a
    ``const`` or ``constant`` pointer); None when the kernel does not say (every bound buffer then counts)."""
    info = getattr(getattr(p, "kernel", None), "info", None)
    bindings = getattr(info, "bindings", None)
    if bindings is None:
        return None
    return frozenset(b.arg.index for b in bindings if b.writable)


def _note_writes(writer: dict[Buffer, np.ndarray], buf: Buffer, changed: np.ndarray, i: int, icb: ICB,
                 call: object) -> None:
    """Record that ICB command ``i`` changed the bytes ``changed`` (a bool mask) of ``buf``; a byte an earlier
    command of the same concurrent group changed too is rule 9's race (``violation``)."""
    if not changed.any():
        return
    owner = writer.get(buf)
    if owner is None:
        owner = writer[buf] = np.full(changed.shape, -1, dtype=np.int64)
    clash = changed & (owner >= 0)
    if clash.any():
        byte = int(np.flatnonzero(clash)[0])
        raise violation(Rule.ICB_RACE, call,
                        f"ICB commands {int(owner[byte])} and {i} of {icb.describe()} run concurrently (no "
                        f"setBarrier between them) and both write byte {byte} of {buf.describe()} (a data race "
                        "whatever the order: concurrent writes of one byte can lose one)")
    owner[changed] = i


def check_buffer_write(dev: SimDevice, buf: Buffer, offset: int, nbytes: int, call: object) -> None:
    """Rule 15 (strict): a CPU write of ``[offset, offset + nbytes)`` of ``buf`` while an in-flight command
    buffer binds it from a lower offset."""
    for cb, lo in buf.readers.items():
        if offset + nbytes > lo and cb.in_flight:
            raise violation(Rule.CPU_WRITE_IN_FLIGHT, call,
                            f"the CPU writes {nbytes} bytes at offset {offset} of {buf.describe()} while "
                            f"{cb.describe()} ({MTL.STATUS_NAMES[cb.status]}) reads it from offset {lo}: "
                            "wait for it to complete before patching")


def check_icb_write(dev: SimDevice, cmd: ICBCommand, call: object) -> None:
    """Rule 15 (strict): the CPU changes an ICB command an in-flight command buffer executes."""
    if cmd.index is None:
        return
    for cb, ranges in cmd.icb.readers.items():
        if cb.in_flight and any(first <= cmd.index < first + count for first, count in ranges):
            raise violation(Rule.CPU_WRITE_IN_FLIGHT, call,
                            f"the CPU changes ICB command {cmd.index} of {cmd.icb.describe()} while "
                            f"{cb.describe()} ({MTL.STATUS_NAMES[cb.status]}) executes it")


def icb_users(dev: SimDevice, obj: SimObject) -> list[tuple[CommandBuffer, ICB, int]]:
    """The in-flight command buffers that reach ``obj`` (a buffer or pipeline) only through ICB commands they
    execute, as ``(command buffer, ICB, first command index using it)``. Directly encoded objects are retained by
    their command buffer and so cannot be deallocated while it is in flight; these are not (rule 14)."""
    out: list[tuple[CommandBuffer, ICB, int]] = []
    for q in dev.gpu.queues:
        for cb in q.pending:
            if not cb.in_flight:
                continue
            for icb, first, count in cb.icb_reads:
                info = analyze_range(dev, icb, first, count)
                if isinstance(obj, Buffer):
                    entry = info.buffers.get(obj)
                    hit = None if entry is None else entry[1]
                else:
                    hit = info.pipelines.get(obj) if isinstance(obj, Pipeline) else None
                if hit is not None:
                    out.append((cb, icb, hit))
                    break
    return out


def check_release(dev: SimDevice, obj: SimObject, call: object, at_host: bool = True) -> None:
    """Rule 14 when ``obj`` is about to be deallocated: a buffer or pipeline that an in-flight command buffer still
    reaches through ICB commands (an ICB does not retain them; what a command buffer encodes directly it retains,
    so that release is deferred and never gets here). A use-after-free: strict mode raises at the host's ``call``
    (``at_host``), naming the object, the command buffer, the ICB command and why; when the last reference was a
    command buffer's (``at_host`` False: nothing to refuse) and in faithful mode, those command buffers end in
    InvalidResource (9) when they complete (a command that reaches the object later faults at once), and strict
    mode raises the error at the host's next call (``SimDevice.defer_error``)."""
    if not isinstance(obj, (Buffer, Pipeline)):
        return
    users = icb_users(dev, obj)
    if not users:
        return
    cb, icb, i = users[0]
    kind = "pipelines" if isinstance(obj, Pipeline) else "buffers"
    why = (f"{obj.describe()} is deallocated while {cb.describe()} ({MTL.STATUS_NAMES[cb.status]}) executes ICB "
           f"command {i} of {icb.describe()}, which uses it: an indirect command buffer does not retain the {kind} "
           "its commands reference (useResources and residency sets make them resident, they keep nothing alive), "
           "so the GPU would reach a freed object and end the command buffer with error 9 (InvalidResource); keep "
           "a reference until the command buffer completes")
    if dev.strict:
        error = violation(Rule.FREED_IN_FLIGHT, call, why)
        if at_host:
            raise error
        dev.defer_error(error)
    for user, user_icb, j in users:
        if user.late_fault is None:
            user.late_fault = (MTL.ErrorInvalidResource,
                               f"{obj.describe()} was released while ICB command {j} of {user_icb.describe()} "
                               "referenced it (an indirect command buffer does not retain it)")
