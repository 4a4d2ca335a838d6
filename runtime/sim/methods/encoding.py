"""Handlers of the command queue, command buffer and compute encoder selectors: how work is encoded and committed.

The state machine of METAL.md §3 rules 1-5 and 7 lives here: Metal's own asserts (one open encoder, endEncoding
before release, no open encoder at commit or event encoding, nothing after commit, waiting on an uncommitted
command buffer) raise in both modes; strict mode adds the checks of the debug layer at the offending call
(fences: rule 11, event values: rule 12, dispatch sizes: rule 13 and fewer than 2**32 threads per grid axis, ICB
ranges and warm-up: rules 8 and 16 at ``executeCommandsInBuffer:withRange:``, residency and races: rules 10 and 9
at ``commit``).

Lifetimes: a command buffer retains the buffers, pipelines and ICBs encoded into it directly until it completes
(``_hold``: retainedReferences YES, what ``commandBuffer`` makes); ``useResources:count:usage:`` makes resources
resident for the encoder but keeps nothing alive (docs/simulator.md, object lifetimes).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL
from mtlir.errors import BridgeError, WaitTimeoutError
from mtlir.runtime.sim.msgsend import NIL, MethodTable
from mtlir.runtime.sim.rules.checks import check_commit, check_execute, collect_reads, size_problem
from mtlir.runtime.sim.objects import (ICB, BlitCopy, BlitEncoder, BlitFill, Buffer, CommandBuffer, CommandQueue,
                                       Dispatch, Encoder, Execute, Fence, Pipeline, SharedEvent, SignalStep, SimObject,
                                       WaitStep)
from mtlir.runtime.sim.rules.deadlock import find_deadlock, may_deadlock
from mtlir.runtime.sim.rules.rule import Call, Rule, assertion, violation

if TYPE_CHECKING:
    from mtlir.runtime.sim.device import SimDevice

__all__ = ["METHODS"]

METHODS = MethodTable()  # the handlers of this module (SimDevice joins them with the others)

_MAX_SET_BYTES = 4096  # setBytes:length:atIndex: takes at most 4 KB (Apple's documentation of the method)


# ---------------------------------------------------------------------------- MTLCommandQueue
@METHODS.method(CommandQueue, "commandBuffer")
def _command_buffer(dev: SimDevice, q: CommandQueue) -> CommandBuffer:
    """A new command buffer (+0). At maxCommandBufferCount uncompleted command buffers it blocks until one
    completes (rule 7): strict mode raises at once when none can (all uncommitted, the GPU held, or a deadlock:
    each waits for work only this thread could encode, ``rules.deadlock``); faithful mode blocks, the GPU watchdog
    ends the deadlocked command buffers with the same description; a block that outlives the device's
    ``timeout_s`` raises ``TimeoutError``."""
    if len(q.live) >= q.max_count:
        call = Call("commandBuffer", q)
        committed = any(cb.status >= MTL.StatusCommitted for cb in q.live)
        if dev.strict and (not committed or not dev.autorun):
            why = "none of them is committed" if not committed else "the GPU is held (autorun=False)"
            raise violation(Rule.IN_FLIGHT_LIMIT, call,
                            f"{len(q.live)} command buffers of the queue are not completed "
                            f"(maxCommandBufferCount {q.max_count}) and {why}: Metal blocks here forever")
        if dev.strict and (dead := find_deadlock(dev.gpu.queues, blocked=q)) is not None:
            raise violation(dead.rule, call, dead.description)
        dev.gpu.host_blocked = q
        try:
            ok = dev.wait_for(lambda: len(q.live) < q.max_count, dev.timeout_s)
        finally:
            dev.gpu.host_blocked = None
        if not ok:
            dead = find_deadlock(dev.gpu.queues, blocked=q)
            why = f": {dead.description}" if dead is not None else ""
            raise WaitTimeoutError(f"{call}: blocked {dev.timeout_s} s with {len(q.live)} command buffers not "
                                   f"completed (maxCommandBufferCount {q.max_count}; METAL.md §3 rule 7){why}")
    cb = dev.new_autoreleased(CommandBuffer(q))
    q.live.add(cb)
    return cb  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- MTLCommandBuffer
def _not_committed(cb: CommandBuffer, selector: str, *args: object) -> None:
    """Rule 4: nothing is encoded after commit (``selector`` and ``args``: the call, made into a ``Call`` only for
    the error)."""
    if cb.status >= MTL.StatusCommitted:
        raise assertion(Rule.NOTHING_AFTER_COMMIT, Call(selector, cb, *args),
                        f"{selector} after commit (the command buffer is {MTL.STATUS_NAMES[cb.status]})")


def _open_encoder(dev: SimDevice, cb: CommandBuffer, selector: str, enc: Encoder) -> Encoder:
    """``enc``, new and autoreleased (+0), as ``cb``'s open encoder and next step (rules 1 and 4: not after commit,
    one open encoder at a time)."""
    _not_committed(cb, selector)
    if cb.open_encoder is not None:
        raise assertion(Rule.ONE_OPEN_ENCODER, Call(selector, cb),
                        "A command encoder is already encoding to this command buffer")
    dev.new_autoreleased(enc)
    cb.open_encoder = enc
    cb.steps.append(enc)
    return enc


@METHODS.method(CommandBuffer, "computeCommandEncoder")
def _compute_encoder(dev: SimDevice, cb: CommandBuffer) -> Encoder:
    return _open_encoder(dev, cb, "computeCommandEncoder", Encoder(cb))


@METHODS.method(CommandBuffer, "blitCommandEncoder")
def _blit_encoder(dev: SimDevice, cb: CommandBuffer) -> Encoder:
    """A new blit command encoder (+0): copies and fills between buffers, ordered with fences like a compute
    encoder (rules 1 and 4 as for ``computeCommandEncoder``)."""
    return _open_encoder(dev, cb, "blitCommandEncoder", BlitEncoder(cb))


@METHODS.method(CommandBuffer, "encodeSignalEvent:value:", SharedEvent)
def _encode_signal(dev: SimDevice, cb: CommandBuffer, ev: SharedEvent, value: int) -> None:
    _not_committed(cb, "encodeSignalEvent:value:", ev, value)
    if cb.open_encoder is not None:
        raise assertion(Rule.NO_OPEN_ENCODER, Call("encodeSignalEvent:value:", cb, ev, value),
                        "encodeSignalEvent:value: with uncommitted encoder")
    highest = ev.highest_encoded
    if ev.value > highest:
        highest = ev.value
    if dev.strict and value <= highest:
        relation = "below" if value < highest else "not above"
        raise violation(Rule.EVENT_ONLY_INCREASES, Call("encodeSignalEvent:value:", cb, ev, value),
                        f"{value} is {relation} {highest}, a value {ev.describe()} already has or was "
                        "given by an earlier signal: an event's value only increases, Metal ignores a "
                        "value that is not above it")
    ev.encoded(value)
    cb.steps.append(SignalStep(ev, value))


@METHODS.method(CommandBuffer, "encodeWaitForEvent:value:", SharedEvent)
def _encode_wait(dev: SimDevice, cb: CommandBuffer, ev: SharedEvent, value: int) -> None:
    _not_committed(cb, "encodeWaitForEvent:value:", ev, value)
    if cb.open_encoder is not None:
        raise assertion(Rule.NO_OPEN_ENCODER, Call("encodeWaitForEvent:value:", cb, ev, value),
                        "encodeWaitForEvent:value: with uncommitted encoder")
    cb.steps.append(WaitStep(ev, value))
    dev.waits_encoded = True  # from now on every strict commit asks ``may_deadlock``


@METHODS.method(CommandBuffer, "commit")
def _commit(dev: SimDevice, cb: CommandBuffer) -> None:
    call = Call("commit", cb)
    if cb.status >= MTL.StatusCommitted:
        raise assertion(Rule.NOTHING_AFTER_COMMIT, call, "commit an already committed command buffer")
    if cb.open_encoder is not None:
        raise assertion(Rule.NO_OPEN_ENCODER, call, "commit command buffer with uncommitted encoder")
    sets = cb.queue.residency_sets  # one set (a DeviceContext's): its committed frozenset as it is, no copy
    cb.resident = sets[0].committed if len(sets) == 1 else frozenset().union(*(rs.committed for rs in sets))
    if dev.strict:
        check_commit(dev, cb, call)
    cb.status = MTL.StatusCommitted
    for step in cb.steps:
        if isinstance(step, SignalStep):
            step.event.settled(step.value, committed=True)
    dev.retain(cb)  # the GPU holds it until it finishes
    collect_reads(dev, cb)
    dev.gpu.submit(cb)
    # a new deadlock always has a wait for an event value (``may_deadlock``): none was ever encoded on most devices
    if dev.strict and dev.waits_encoded and may_deadlock(cb) and (dead := find_deadlock(dev.gpu.queues)) is not None:
        raise violation(dead.rule, call, dead.description)


@METHODS.method(CommandBuffer, "waitUntilCompleted")
def _wait_completed(dev: SimDevice, cb: CommandBuffer) -> None:
    """Blocks until Completed or Error; an uncommitted command buffer asserts (it would never complete); a wait
    longer than the device's ``timeout_s`` raises ``TimeoutError``."""
    call = Call("waitUntilCompleted", cb)
    if cb.status < MTL.StatusCommitted:
        raise assertion(Rule.STATUS_FORWARD, call, "waitUntilCompleted on uncommitted command buffer")
    if not dev.wait_for(lambda: cb.finished, dev.timeout_s):
        held = "" if dev.autorun else " (the GPU is held: autorun=False, call step() or run_until_idle())"
        raise WaitTimeoutError(f"{call}: still {MTL.STATUS_NAMES[cb.status]} after {dev.timeout_s} s{held}")


@METHODS.method(CommandBuffer, "status", lockless=True)
def _status(dev: SimDevice, cb: CommandBuffer) -> int:
    return cb.status


@METHODS.method(CommandBuffer, "error", lockless=True)
def _error(dev: SimDevice, cb: CommandBuffer) -> SimObject | None:
    return cb.error if cb.status == MTL.StatusError else None


@METHODS.method(CommandBuffer, "GPUStartTime", lockless=True)
def _gpu_start(dev: SimDevice, cb: CommandBuffer) -> float:
    return cb.start_time if cb.status == MTL.StatusCompleted else 0.0


@METHODS.method(CommandBuffer, "GPUEndTime", lockless=True)
def _gpu_end(dev: SimDevice, cb: CommandBuffer) -> float:
    return cb.end_time if cb.status == MTL.StatusCompleted else 0.0


# ---------------------------------------------------------------------------- MTLComputeCommandEncoder
def _hold(dev: SimDevice, enc: Encoder, obj: SimObject) -> None:
    """The encoder's command buffer keeps a strong reference to ``obj`` until it completes (retainedReferences YES,
    what ``commandBuffer`` makes: a buffer, pipeline or ICB encoded directly), retained once per command buffer.
    What only ICB commands reference is not retained (docs/simulator.md, object lifetimes)."""
    if obj not in enc.cb.retained:
        enc.cb.retained[obj] = None
        dev.retain(obj)


def _open(dev: SimDevice, enc: Encoder, call: Call | str, *args: object) -> bool:
    """True when ``enc`` still encodes. After endEncoding strict mode raises; faithful mode drops the call.
    ``call``: the ``Call``, or its selector and ``args`` (the ``Call`` is then made only for the error: the
    messages of every submit pass here)."""
    if not enc.ended:
        return True
    if dev.strict:
        raise violation(Rule.API_VALIDATION, Call(call, enc, *args) if isinstance(call, str) else call,
                        f"{enc.describe()} has already ended (endEncoding); encode on a new encoder")
    return False


@METHODS.method(Encoder, "waitForFence:", Fence)
def _wait_fence(dev: SimDevice, enc: Encoder, fence: Fence) -> None:
    if not _open(dev, enc, "waitForFence:", fence):
        return
    if dev.strict and fence in enc.fence_updates:
        raise violation(Rule.FENCE_ORDER, Call("waitForFence:", enc, fence),
                        f"{fence.describe()} was updated earlier in this encoder: waits act at the "
                        "encoder's start and updates at its end, so it would wait for itself (deadlock)")
    if fence.last_update is not None:
        enc.fence_waits.append((fence, fence.last_update))


@METHODS.method(Encoder, "updateFence:", Fence)
def _update_fence(dev: SimDevice, enc: Encoder, fence: Fence) -> None:
    if _open(dev, enc, "updateFence:", fence):
        enc.fence_updates.append(fence)
        enc.fence_prev.setdefault(fence, fence.last_update)
        fence.last_update = enc


@METHODS.method(Encoder, "useResources:count:usage:")
def _use_resources(dev: SimDevice, enc: Encoder, array: int, count: int, usage: int) -> None:
    """Reads ``count`` handles (8 bytes each) from the C array at ``array``: each must be a live MTLBuffer or ICB.
    A pipeline is not an MTLResource: strict raises (rule 10), faithful ignores it."""
    call = Call("useResources:count:usage:", enc, hex(array), count, usage)
    if not _open(dev, enc, call):
        return
    if count and not array:
        raise BridgeError(f"{call}: NULL resource array with count {count}")
    if usage & ~(MTL.ResourceUsageRead | MTL.ResourceUsageWrite) or not usage:
        if dev.strict:
            raise violation(Rule.API_VALIDATION, call, f"usage {usage} is not a combination of Read (1) and Write (2)")
    for k in range(count):
        handle = dev.memory.load(array + 8 * k, dtypes.id)
        obj = dev._lookup(handle, f"{call}: resource [{k}]")
        if isinstance(obj, (Buffer, ICB)):
            enc.used.add(obj)
        elif isinstance(obj, Pipeline):
            if dev.strict:
                raise violation(Rule.RESIDENCY, call,
                                f"resource [{k}] is {obj.describe()}: pipelines are not MTLResources and "
                                "may not go into useResources")
        else:
            raise BridgeError(f"{call}: resource [{k}] is {obj.describe()}, not an MTLResource")


@METHODS.method(Encoder, "setComputePipelineState:", Pipeline)
def _set_pipeline(dev: SimDevice, enc: Encoder, p: Pipeline) -> None:
    if _open(dev, enc, "setComputePipelineState:", p):
        enc.pipeline = p
        enc.bound_pipelines.add(p)
        _hold(dev, enc, p)


@METHODS.method(Encoder, "setBuffer:offset:atIndex:", (Buffer, NIL))
def _set_buffer(dev: SimDevice, enc: Encoder, buf: Buffer | None, offset: int, index: int) -> None:
    call = Call("setBuffer:offset:atIndex:", enc, buf, offset, index)
    if not _open(dev, enc, call):
        return
    if index >= MTL.MAX_BUFFER_BIND:
        if dev.strict:
            raise violation(Rule.ICB_LIMITS, call, f"buffer index {index} is not below {MTL.MAX_BUFFER_BIND}")
        return
    if dev.strict and buf is not None and offset >= buf.length:
        raise violation(Rule.API_VALIDATION, call, f"offset({offset}) must be < [buffer length]({buf.length})")
    if buf is None:
        enc.bindings.pop(index, None)
    else:
        enc.bindings[index] = (buf, offset)
        enc.used.add(buf)  # a directly bound buffer is made resident by the encoder
        _hold(dev, enc, buf)


@METHODS.method(Encoder, "setBytes:length:atIndex:")
def _set_bytes(dev: SimDevice, enc: Encoder, ptr: int, length: int, index: int) -> None:
    call = Call("setBytes:length:atIndex:", enc, hex(ptr), length, index)
    if not _open(dev, enc, call):
        return
    if dev.strict and (length > _MAX_SET_BYTES or index >= MTL.MAX_BUFFER_BIND):
        raise violation(Rule.API_VALIDATION, call,
                        f"setBytes takes at most {_MAX_SET_BYTES} bytes at an index below "
                        f"{MTL.MAX_BUFFER_BIND}")
    if index < MTL.MAX_BUFFER_BIND:
        enc.bindings[index] = dev.memory.read(ptr, length) if length else b""


@METHODS.method(Encoder, "dispatchThreadgroups:threadsPerThreadgroup:")
def _dispatch(dev: SimDevice, enc: Encoder, grid: tuple[int, int, int], tg: tuple[int, int, int]) -> None:
    call = Call("dispatchThreadgroups:threadsPerThreadgroup:", enc, grid, tg)
    if not _open(dev, enc, call):
        return
    p = enc.pipeline
    if dev.strict and 0 not in grid and 0 not in tg:
        if p is None:
            raise violation(Rule.API_VALIDATION, call, "no compute pipeline state is set on the encoder")
        problem = size_problem(grid, tg, p)
        if problem is not None:
            raise violation(problem[0], call, problem[1])
        for index, kind, size in p.params:
            if index not in enc.bindings:
                raise violation(Rule.API_VALIDATION, call, f"{p.label}: buffer index {index} is not bound")
            b = enc.bindings[index]
            align = dev.constant_align if kind == "constant" else size
            if not isinstance(b, bytes) and b[1] % align:  # as an ICB command's (METAL.md §1)
                raise violation(Rule.API_VALIDATION, call, f"{p.label}: offset {b[1]} of buffer index {index} ({kind}) "
                                                       f"is not a multiple of {align} bytes")
    enc.commands.append(Dispatch(p, dict(enc.bindings), grid, tg))


@METHODS.method(Encoder, "executeCommandsInBuffer:withRange:", ICB)
def _execute(dev: SimDevice, enc: Encoder, icb: ICB, first: int, count: int) -> None:
    call = Call("executeCommandsInBuffer:withRange:", enc, icb, (first, count))
    if not _open(dev, enc, call):
        return
    if dev.strict:
        check_execute(dev, enc, icb, first, count, call)
    enc.commands.append(Execute(icb, first, count, frozenset(enc.bound_pipelines)))
    _hold(dev, enc, icb)  # the ICB itself, not what its commands reference


# ---------------------------------------------------------------------------- MTLBlitCommandEncoder
def _blit_range(dev: SimDevice, call: Call, buf: Buffer, offset: int, size: int, what: str) -> bool:
    """Strict: ``size`` > 0, ``offset`` and ``size`` multiples of 4 (macOS, Apple's documentation of the blit
    methods) and the bytes inside ``buf``. Faithful: False (the command is dropped) for bytes outside ``buf``."""
    inside = size > 0 and offset + size <= buf.length
    if dev.strict:
        if size <= 0 or offset % 4 or size % 4:
            raise violation(Rule.API_VALIDATION, call, f"{what}: offset {offset} and size {size} must be multiples "
                                                       "of 4 on macOS, the size above 0")
        if not inside:
            raise violation(Rule.API_VALIDATION, call, f"{what}: bytes [{offset}, {offset + size}) run past the end "
                                                       f"of {buf.describe()} ({buf.length} bytes)")
    return inside


@METHODS.method(BlitEncoder, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", Buffer, Buffer)
def _blit_copy(dev: SimDevice, enc: BlitEncoder, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int,
               size: int) -> None:
    call = Call("copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", enc, src, src_offset, dst,
                dst_offset, size)
    if not _open(dev, enc, call):
        return
    inside = _blit_range(dev, call, src, src_offset, size, "source") & _blit_range(dev, call, dst, dst_offset, size,
                                                                                   "destination")
    # one buffer, overlapping ranges: Metal leaves the result undefined (Metal Programming Guide, "Copying Data
    # Between Two Buffers"); strict refuses it, faithful copies as if through a temporary (a memmove)
    if dev.strict and src is dst and src_offset < dst_offset + size and dst_offset < src_offset + size:
        raise violation(Rule.API_VALIDATION, call, f"source bytes [{src_offset}, {src_offset + size}) and "
                                                   f"destination bytes [{dst_offset}, {dst_offset + size}) of "
                                                   f"{src.describe()} overlap: the copy's result is undefined")
    if inside:
        enc.blits.append(BlitCopy(src, src_offset, dst, dst_offset, size))
        _hold(dev, enc, src)
        _hold(dev, enc, dst)


@METHODS.method(BlitEncoder, "fillBuffer:range:value:", Buffer)
def _blit_fill(dev: SimDevice, enc: BlitEncoder, buf: Buffer, offset: int, length: int, value: int) -> None:
    call = Call("fillBuffer:range:value:", enc, buf, (offset, length), value)
    if _open(dev, enc, call) and _blit_range(dev, call, buf, offset, length, "range"):
        enc.blits.append(BlitFill(buf, offset, length, value & 0xFF))
        _hold(dev, enc, buf)


def _not_a_blit_selector(selector: str) -> None:
    def refuse(dev: SimDevice, enc: BlitEncoder, *args: object) -> None:
        raise BridgeError(f"-[MTLBlitCommandEncoder {selector}]: unrecognized selector sent to instance "
                          f"{enc.handle:#x}")
    METHODS.add(BlitEncoder, selector, refuse)


for _selector in ("useResources:count:usage:", "setComputePipelineState:", "setBuffer:offset:atIndex:",
                  "setBytes:length:atIndex:", "dispatchThreadgroups:threadsPerThreadgroup:",
                  "executeCommandsInBuffer:withRange:"):
    _not_a_blit_selector(_selector)


@METHODS.method(Encoder, "endEncoding")
def _end_encoding(dev: SimDevice, enc: Encoder) -> None:
    if _open(dev, enc, "endEncoding"):
        enc.ended = True
        if enc.cb.open_encoder is enc:
            enc.cb.open_encoder = None
