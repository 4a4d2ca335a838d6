"""Each rule of METAL.md §3, broken through the Bridge (msg_send with abi_prototype, as the interpreter sends), in
strict mode (MetalValidationError at the offending call) and in faithful mode (what Metal does without its
validation layer: the same assert, status Error with the error code, a dropped dispatch, a block, a race)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL
from mtlir.errors import MetalValidationError
from simscene import MODES, Scene, scene, scenes  # noqa: F401  (scenes: a fixture)

def fill_icb(s: Scene, value: int = 7, n: int = 1, barrier: bool = True) -> tuple[int, int, int]:
    """An ICB of ``n`` fill commands writing ``value`` into one output buffer; (icb, out, var)."""
    out, var = s.buffer(64), s.buffer(256)
    s.set_int(var, 0, value)
    icb = s.icb(n)
    for i in range(n):
        s.command(icb, i, "fill", [(out, 0), (var, 0)], barrier=barrier)
    return icb, out, var


# ---------------------------------------------------------------------------- rules 1-4: Metal's own asserts
@pytest.mark.parametrize("strict", MODES)
def test_rule1_one_open_encoder(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "computeCommandEncoder")
    with pytest.raises(MetalValidationError, match=r"A command encoder is already encoding to this command buffer"
                                                   r".*rule 1"):
        s.send(cb, "computeCommandEncoder")


@pytest.mark.parametrize("strict", MODES)
def test_rule2_encoder_released_without_end_encoding(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    pool = s.m.push()
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "computeCommandEncoder")
    with pytest.raises(MetalValidationError, match=r"Command encoder released without endEncoding.*rule 2"):
        s.m.pop(pool)
    # the same with endEncoding: the pool drains quietly and both objects are gone
    pool = s.m.push()
    cb = s.send(s.queue, "commandBuffer")
    s.send(s.send(cb, "computeCommandEncoder"), "endEncoding")
    s.m.pop(pool)
    live = s.dev.live_objects()
    assert live.get("MTLComputeCommandEncoder", 0) == 0 and live.get("MTLCommandBuffer", 0) == 0


@pytest.mark.parametrize("strict", MODES)
@pytest.mark.parametrize("selector", ["commit", "encodeSignalEvent:value:", "encodeWaitForEvent:value:"])
def test_rule3_no_open_encoder(scenes: list[Scene], strict: bool, selector: str) -> None:
    s = scene(scenes, strict)
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "computeCommandEncoder")
    args = () if selector == "commit" else (s.event, 1)
    with pytest.raises(MetalValidationError, match=r"with uncommitted encoder.*rule 3"):
        s.send(cb, selector, *args)
    assert s.status(cb) == MTL.StatusNotEnqueued


@pytest.mark.parametrize("strict", MODES)
def test_rule4_nothing_after_commit(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "commit")
    with pytest.raises(MetalValidationError, match=r"commit an already committed command buffer.*rule 4"):
        s.send(cb, "commit")
    with pytest.raises(MetalValidationError, match=r"computeCommandEncoder after commit.*rule 4"):
        s.send(cb, "computeCommandEncoder")
    with pytest.raises(MetalValidationError, match=r"encodeSignalEvent:value: after commit.*rule 4"):
        s.send(cb, "encodeSignalEvent:value:", s.event, 1)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted


# ---------------------------------------------------------------------------- rule 5: status, error, times
@pytest.mark.parametrize("strict", MODES)
def test_rule5_status_moves_forward_times_zero_until_completed(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, out, var = fill_icb(s)
    s.residency(out, var)
    cb = s.submit_icb(icb, 0, 1, commit=False)
    seen = [s.status(cb)]
    with pytest.raises(MetalValidationError, match=r"waitUntilCompleted on uncommitted command buffer.*rule 5"):
        s.send(cb, "waitUntilCompleted")
    s.send(cb, "commit")
    seen.append(s.status(cb))
    while s.dev.step():
        seen.append(s.status(cb))
        if s.status(cb) != MTL.StatusCompleted:
            assert s.send(cb, "GPUStartTime") == 0.0 and s.send(cb, "GPUEndTime") == 0.0
            assert s.send(cb, "error") == 0
    assert seen[:3] == [MTL.StatusNotEnqueued, MTL.StatusCommitted, MTL.StatusScheduled]
    assert seen == sorted(seen) and seen[-1] == MTL.StatusCompleted
    start, end = s.send(cb, "GPUStartTime"), s.send(cb, "GPUEndTime")
    assert isinstance(start, float) and 0.0 < start <= end
    assert s.send(cb, "error") == 0
    s.send(cb, "waitUntilCompleted")  # returns at once


@pytest.mark.parametrize("strict", MODES)
def test_rule5_error_is_final_and_has_no_times(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, out, var = fill_icb(s)
    s.residency(out, var)
    s.dev.inject_fault(MTL.ErrorPageFault)
    cb = s.submit_icb(icb, 0, 1)
    s.dev.run_until_idle()
    for _ in range(2):
        assert s.status(cb) == MTL.StatusError
        assert s.error_code(cb) == MTL.ErrorPageFault
        assert s.send(cb, "GPUStartTime") == 0.0 and s.send(cb, "GPUEndTime") == 0.0
    assert "PageFault" in s.error_text(cb)


# ---------------------------------------------------------------------------- rule 6: failed buffers skip signals
@pytest.mark.parametrize("strict", MODES)
def test_rule6_failed_command_buffer_skips_its_signal(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict, autorun=True)
    icb, out, var = fill_icb(s)
    s.residency(out, var)
    ok = s.submit_icb(icb, 0, 1, signal=1)
    s.send(ok, "waitUntilCompleted")
    s.dev.inject_fault(MTL.ErrorPageFault)
    bad = s.submit_icb(icb, 0, 1, signal=2)
    s.send(bad, "waitUntilCompleted")
    assert s.status(bad) == MTL.StatusError and s.error_code(bad) == MTL.ErrorPageFault
    assert s.send(s.event, "signaledValue") == 1  # the signal of value 2 was skipped
    if strict:
        t0 = time.perf_counter()
        with pytest.raises(MetalValidationError, match=r"can never be reached.*skipped its signal.*rule 6"):
            s.send(s.event, "waitUntilSignaledValue:timeoutMS:", 2, 1000)
        assert time.perf_counter() - t0 < 0.9  # raised without waiting out the timeout
    else:
        assert s.send(s.event, "waitUntilSignaledValue:timeoutMS:", 2, 30) is False  # Metal: NO, then hangs


# ---------------------------------------------------------------------------- rule 7: in-flight limit
@pytest.mark.parametrize("strict", MODES)
def test_rule7_command_buffer_blocks_at_the_limit(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict, max_cbs=2, timeout_s=0.15)
    s.send(s.queue, "commandBuffer")
    s.send(s.queue, "commandBuffer")
    if strict:
        with pytest.raises(MetalValidationError, match=r"maxCommandBufferCount 2.*none of them is committed.*rule 7"):
            s.send(s.queue, "commandBuffer")
    else:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError, match=r"commandBuffer.*blocked.*maxCommandBufferCount 2.*rule 7"):
            s.send(s.queue, "commandBuffer")
        assert time.perf_counter() - t0 >= 0.15


@pytest.mark.parametrize("strict", MODES)
def test_rule7_block_ends_when_a_command_buffer_completes(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict, max_cbs=1, autorun=True)
    icb, out, var = fill_icb(s)
    s.residency(out, var)
    first = s.submit_icb(icb, 0, 1)
    second = s.send(s.queue, "commandBuffer")  # blocks until the first completes, then returns
    assert s.status(first) == MTL.StatusCompleted
    assert s.status(second) == MTL.StatusNotEnqueued


def test_rule7_uncommitted_buffer_released_frees_its_slot(scenes: list[Scene]) -> None:
    s = scene(scenes, max_cbs=1)
    pool = s.m.push()
    s.send(s.queue, "commandBuffer")
    s.m.pop(pool)
    s.send(s.queue, "commandBuffer")  # no block: the first one is gone


# ---------------------------------------------------------------------------- rule 8: ICB limits
@pytest.mark.parametrize("strict", MODES)
def test_rule8_command_index_past_max_count(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb = s.icb(2)
    if strict:
        with pytest.raises(MetalValidationError, match=r"index 2 is not below maxCommandCount 2.*rule 8"):
            s.send(icb, "indirectComputeCommandAtIndex:", 2)
    else:
        out, var = s.buffer(64), s.buffer(256)
        s.set_int(var, 0, 5)
        s.command(icb, 2, "fill", [(out, 0), (var, 0)])  # lands outside the ICB: lost
        s.residency(out, var)
        cb = s.submit_icb(icb, 0, 2)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted and not s.floats(out).any()


@pytest.mark.parametrize("strict", MODES)
def test_rule8_range_outside_the_icb(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, out, var = fill_icb(s, n=2)
    s.residency(out, var)
    if strict:
        with pytest.raises(MetalValidationError, match=r"range \(1, 2\) is outside \[0, 2\).*rule 8"):
            s.submit_icb(icb, 1, 2)
    else:
        cb = s.submit_icb(icb, 1, 2)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorPageFault
        assert "reads past the 2 commands" in s.error_text(cb)


@pytest.mark.parametrize("strict", MODES)
def test_rule8_range_longer_than_16384(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    n = MTL.MAX_ICB_RANGE + 1
    icb = s.icb(n)
    out, var = s.buffer(64), s.buffer(256)
    s.set_int(var, 0, 3)
    s.command(icb, n - 1, "fill", [(out, 0), (var, 0)])  # only the command past 16,384 does anything
    s.residency(out, var)
    if strict:
        with pytest.raises(MetalValidationError, match=r"range length 16385 is above the maximum of 16384.*rule 8"):
            s.submit_icb(icb, 0, n)
    else:
        cb = s.submit_icb(icb, 0, n)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted and not s.floats(out).any()  # command 16384 never ran


@pytest.mark.parametrize("strict", MODES)
def test_rule8_bind_index_past_max_bind_count(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    out, var = s.buffer(64), s.buffer(256)
    icb = s.icb(1, max_bind=1)
    cmd = s.send(icb, "indirectComputeCommandAtIndex:", 0)
    s.send(cmd, "setComputePipelineState:", s.pipelines["fill"])
    s.send(cmd, "setKernelBuffer:offset:atIndex:", out, 0, 0)
    if strict:
        with pytest.raises(MetalValidationError, match=r"index 1 is not below maxKernelBufferBindCount 1.*rule 8"):
            s.send(cmd, "setKernelBuffer:offset:atIndex:", var, 0, 1)
    else:
        s.send(cmd, "setKernelBuffer:offset:atIndex:", var, 0, 1)  # no slot for it: lost
        s.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (4, 1, 1))
        s.residency(out, var)
        cb = s.submit_icb(icb, 0, 1)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorPageFault
        assert "buffer index 1 is not bound" in s.error_text(cb)


@pytest.mark.parametrize("strict", MODES)
def test_rule8_offset_above_32_bits(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    out, var = s.buffer(1024), s.buffer(256)
    s.set_int(var, 0, 9)
    icb = s.icb(1)
    cmd = s.send(icb, "indirectComputeCommandAtIndex:", 0)
    s.send(cmd, "setComputePipelineState:", s.pipelines["fill"])
    if strict:
        with pytest.raises(MetalValidationError, match=r"offset 0x100000100 does not fit the 32 bits.*rule 8"):
            s.send(cmd, "setKernelBuffer:offset:atIndex:", out, (1 << 32) + 256, 0)
    else:
        s.send(cmd, "setKernelBuffer:offset:atIndex:", out, (1 << 32) + 256, 0)  # stored as 256
        s.send(cmd, "setKernelBuffer:offset:atIndex:", var, 0, 1)
        s.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (4, 1, 1))
        s.residency(out, var)
        cb = s.submit_icb(icb, 0, 1)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted  # silently at the wrong place
        assert (s.floats(out)[64:68] == 9).all() and not s.floats(out)[:64].any()


@pytest.mark.parametrize("strict", MODES)
@pytest.mark.parametrize("which", ["device", "constant"])
def test_rule8_misaligned_offset(scenes: list[Scene], strict: bool, which: str) -> None:
    s = scene(scenes, strict)
    out, var = s.buffer(1024), s.buffer(1024)
    s.set_int(var, 0, 4)
    s.set_int(var, 16, 6)
    icb = s.icb(1)
    bindings = [(out, 2), (var, 0)] if which == "device" else [(out, 0), (var, 16)]
    s.command(icb, 0, "fill", bindings)
    s.residency(out, var)
    if strict:
        kind, off, align = ("buffer", 2, 4) if which == "device" else ("constant", 16, 256)
        with pytest.raises(MetalValidationError, match=rf"offset {off} of buffer index \d \({kind}\) is not a "
                                                       rf"multiple of {align} bytes.*rule 8"):
            s.submit_icb(icb, 0, 1)
    else:
        cb = s.submit_icb(icb, 0, 1)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted
        if which == "device":  # the low address bits are dropped: written from offset 0
            assert (s.floats(out)[:4] == 4).all()
        else:  # Apple GPUs read constant data 4-byte aligned: the value at 16 is used
            assert (s.floats(out)[:4] == 6).all()


# ---------------------------------------------------------------------------- rule 9: races without setBarrier
def race_icb(s: Scene, barrier: bool) -> tuple[int, int, int]:
    """cmd0: copy src -> dst; cmd1: add1 on src. In program order dst gets the old src; without a barrier between
    them the two touch src's bytes concurrently."""
    src, dst = s.buffer(64), s.buffer(64)
    s.floats(src)[:4] = [1, 2, 3, 4]
    icb = s.icb(2)
    s.command(icb, 0, "copy", [(dst, 0), (src, 0)])
    s.command(icb, 1, "add1", [(src, 0)], barrier=barrier)
    s.residency(src, dst)
    return icb, src, dst


@pytest.mark.parametrize("strict", MODES)
def test_rule9_concurrent_commands_on_overlapping_bytes(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, src, dst = race_icb(s, barrier=False)
    if strict:
        with pytest.raises(MetalValidationError, match=r"ICB commands 0, 1 .* run concurrently .* overlapping bytes.*"
                                                       r"rule 9"):
            s.submit_icb(icb, 0, 2)
        assert (s.floats(src)[:4] == [1, 2, 3, 4]).all()  # the dry run touched copies only
    else:
        cb = s.submit_icb(icb, 0, 2)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted
        assert (s.floats(dst)[:4] == [2, 3, 4, 5]).all()  # the race lost: copy saw the increment


@pytest.mark.parametrize("strict", MODES)
def test_rule9_barrier_orders_commands(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, src, dst = race_icb(s, barrier=True)
    cb = s.submit_icb(icb, 0, 2)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted
    assert (s.floats(dst)[:4] == [1, 2, 3, 4]).all() and (s.floats(src)[:4] == [2, 3, 4, 5]).all()


def test_rule9_two_commands_writing_one_byte_race_even_when_both_orders_agree(scenes: list[Scene]) -> None:
    """add1 twice on the same floats without a barrier: both orders end at +2, so comparing the orders missed it,
    but two concurrent read-modify-writes of one element can lose an update (a user's x += 1, x[4:] += 2)."""
    s = scene(scenes, True)
    buf = s.buffer(64)
    s.floats(buf)[:4] = [1, 2, 3, 4]
    icb = s.icb(2)
    s.command(icb, 0, "add1", [(buf, 0)])
    s.command(icb, 1, "add1", [(buf, 0)], barrier=False)
    s.residency(buf)
    with pytest.raises(MetalValidationError, match=r"ICB commands 0 and 1 .* run concurrently .* both write byte 2 of "
                                                   r".* whatever the order.*rule 9"):
        s.submit_icb(icb, 0, 2)
    assert (s.floats(buf)[:4] == [1, 2, 3, 4]).all()  # the dry run touched copies only


def test_rule9_sharing_a_read_only_buffer_is_no_race(scenes: list[Scene]) -> None:
    s = scene(scenes, True)
    src, a, b = s.buffer(64), s.buffer(64), s.buffer(64)
    s.floats(src)[:4] = 5
    icb = s.icb(2)
    s.command(icb, 0, "copy", [(a, 0), (src, 0)], barrier=False)
    s.command(icb, 1, "copy", [(b, 0), (src, 0)], barrier=False)
    s.residency(src, a, b)
    cb = s.submit_icb(icb, 0, 2)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and (s.floats(a)[:4] == 5).all() and (s.floats(b)[:4] == 5).all()


# ---------------------------------------------------------------------------- rule 10: residency
@pytest.mark.parametrize("strict", MODES)
def test_rule10_non_resident_buffer(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, out, var = fill_icb(s)
    s.residency(out)  # var is missing
    if strict:
        with pytest.raises(MetalValidationError, match=r"binds MTLBuffer .* neither in a residency set .* nor named in "
                                                       r"useResources.*rule 10"):
            s.submit_icb(icb, 0, 1)
    else:
        cb = s.submit_icb(icb, 0, 1)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorInvalidResource
        assert "kIOGPUCommandBufferCallbackErrorInvalidResource" in s.error_text(cb)
        assert not s.floats(out).any()


@pytest.mark.parametrize("strict", MODES)
def test_rule10_residency_set_must_be_committed_before_the_command_buffer(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, out, var = fill_icb(s)
    m = s.m
    rs = m.send(s.device, "newResidencySetWithDescriptor:error:", m.send(m.cls("MTLResidencySetDescriptor"), "new"),
                0)
    m.send(s.queue, "addResidencySet:", rs)
    m.send(rs, "addAllocation:", out)
    m.send(rs, "addAllocation:", var)  # not committed yet: nothing is resident
    cb = s.submit_icb(icb, 0, 1, commit=False)
    if strict:
        with pytest.raises(MetalValidationError, match=r"rule 10"):
            s.send(cb, "commit")
    else:
        s.send(cb, "commit")
        m.send(rs, "commit")  # too late for this command buffer
        s.dev.run_until_idle()
        assert s.error_code(cb) == MTL.ErrorInvalidResource
    m.send(rs, "commit")
    ok = s.submit_icb(icb, 0, 1)
    s.dev.run_until_idle()
    assert s.status(ok) == MTL.StatusCompleted and (s.floats(out)[:4] == 7).all()


@pytest.mark.parametrize("strict", MODES)
def test_rule10_use_resources_makes_resident_and_refuses_pipelines(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict, residency_sets=False)
    icb, out, var = fill_icb(s)
    cb = s.submit_icb(icb, 0, 1, use=(out, var, icb))
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and (s.floats(out)[:4] == 7).all()
    cb = s.send(s.queue, "commandBuffer")
    enc = s.send(cb, "computeCommandEncoder")
    arr = s.resources(out, s.pipelines["fill"])
    if strict:
        with pytest.raises(MetalValidationError, match=r"pipelines are not MTLResources.*rule 10"):
            s.send(enc, "useResources:count:usage:", arr, 2, 3)
    else:
        s.send(enc, "useResources:count:usage:", arr, 2, 3)  # the pipeline entry is ignored


# ---------------------------------------------------------------------------- rule 11: fences
@pytest.mark.parametrize("strict", MODES)
def test_rule11_update_then_wait_in_one_encoder(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    cb = s.send(s.queue, "commandBuffer")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "updateFence:", s.fence)
    if strict:
        with pytest.raises(MetalValidationError, match=r"updated earlier in this encoder.*deadlock.*rule 11"):
            s.send(enc, "waitForFence:", s.fence)
    else:
        s.send(enc, "waitForFence:", s.fence)
        s.send(enc, "endEncoding")
        s.send(cb, "commit")
        s.dev.run_until_idle()  # the watchdog ends the deadlock
        assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorTimeout
        assert "update-then-wait deadlocks" in s.error_text(cb) and "rule 11" in s.error_text(cb)


@pytest.mark.parametrize("strict", MODES)
def test_rule11_fence_orders_work_across_queues(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    other = s.send(s.device, "newCommandQueueWithMaxCommandBufferCount:", 4)
    icb, out, var = fill_icb(s)
    s.residency(out, var)
    producer = s.send(other, "commandBuffer")
    enc = s.send(producer, "computeCommandEncoder")
    s.send(enc, "waitForFence:", s.fence)  # no update encoded yet: does not wait
    s.send(enc, "updateFence:", s.fence)
    s.send(enc, "endEncoding")
    consumer = s.send(s.queue, "commandBuffer")
    s.encode_icb(consumer, icb, 0, 1, fence=True)  # waits for the producer's update
    s.send(consumer, "commit")
    for _ in range(5):
        s.dev.step()
    assert s.status(consumer) == MTL.StatusScheduled  # blocked at its encoder's start
    s.send(producer, "commit")
    s.dev.run_until_idle()
    assert s.status(producer) == s.status(consumer) == MTL.StatusCompleted
    assert s.send(producer, "GPUEndTime") <= s.send(consumer, "GPUEndTime")


@pytest.mark.parametrize("strict", MODES)
def test_rule11_a_command_buffer_released_uncommitted_never_blocks_a_fence(scenes: list[Scene], strict: bool) -> None:
    """Its encoder waited on and updated the fence but never ran (Metal discards an uncommitted command buffer):
    the next encoder waits for the update before it, not for one that will never happen."""
    s = scene(scenes, strict)
    icb, out, var = fill_icb(s)
    s.residency(out, var)
    first = s.send(s.queue, "commandBuffer")
    s.send(first, "retain")
    s.encode_icb(first, icb, 0, 1, fence=True)
    s.send(first, "commit")  # a real update, still pending: the GPU is held
    dropped = s.send(s.queue, "commandBuffer")
    s.send(dropped, "retain")
    s.encode_icb(dropped, icb, 0, 1, fence=True)
    s.send(dropped, "release")
    s.send(dropped, "release")  # deallocated uncommitted
    nxt = s.send(s.queue, "commandBuffer")
    s.send(nxt, "retain")
    s.encode_icb(nxt, icb, 0, 1, fence=True)
    s.send(nxt, "commit")
    s.dev.run_until_idle()
    assert s.status(first) == s.status(nxt) == MTL.StatusCompleted  # no watchdog Timeout
    assert s.send(first, "GPUEndTime") <= s.send(nxt, "GPUEndTime")  # it did wait for the committed update


# ---------------------------------------------------------------------------- rule 12: shared events
@pytest.mark.parametrize("strict", MODES)
def test_rule12_event_value_only_increases(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "encodeSignalEvent:value:", s.event, 5)
    if strict:
        with pytest.raises(MetalValidationError, match=r"3 is below 5.*only increases.*rule 12"):
            s.send(cb, "encodeSignalEvent:value:", s.event, 3)
        s.send(cb, "commit")
    else:
        s.send(cb, "encodeSignalEvent:value:", s.event, 3)
        s.send(cb, "commit")
    s.dev.run_until_idle()
    assert s.send(s.event, "signaledValue") == 5
    assert s.send(s.event, "waitUntilSignaledValue:timeoutMS:", 4, 10) is True  # wakes when value >= target
    assert s.send(s.event, "waitUntilSignaledValue:timeoutMS:", 6, 10) is False


@pytest.mark.parametrize("strict", MODES)
def test_rule12_a_value_not_above_the_last_one(scenes: list[Scene], strict: bool) -> None:
    """docs/simulator.md: strict refuses a value below the event's or equal to one already encoded; a value encoded
    in a command buffer released uncommitted will never be signaled, so it may be encoded again."""
    s = scene(scenes, strict)
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "encodeSignalEvent:value:", s.event, 5)
    if strict:
        with pytest.raises(MetalValidationError, match=r"5 is not above 5.*rule 12"):
            s.send(cb, "encodeSignalEvent:value:", s.event, 5)
    s.send(cb, "commit")
    s.dev.run_until_idle()
    if strict:
        with pytest.raises(MetalValidationError, match=r"5 is not above 5.*rule 12"):
            s.send(s.send(s.queue, "commandBuffer"), "encodeSignalEvent:value:", s.event, 5)
    dropped = s.send(s.queue, "commandBuffer")
    s.send(dropped, "retain")
    s.send(dropped, "encodeSignalEvent:value:", s.event, 6)
    s.send(dropped, "release")
    s.send(dropped, "release")  # deallocated uncommitted: 6 is never signaled
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "encodeSignalEvent:value:", s.event, 6)
    s.send(cb, "commit")
    s.dev.run_until_idle()
    assert s.send(s.event, "signaledValue") == 6


# ---------------------------------------------------------------------------- rule 13: threadgroup size
@pytest.mark.parametrize("strict", MODES)
def test_rule13_too_many_threads_dropped(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    s.dev.set_max_total_threads(s.pipelines["fill"], 256)
    assert s.send(s.pipelines["fill"], "maxTotalThreadsPerThreadgroup") == 256
    out, var = s.buffer(4096), s.buffer(256)
    s.set_int(var, 0, 1)
    icb = s.icb(1)
    if strict:
        with pytest.raises(MetalValidationError, match=r"512 threads per threadgroup > maxTotalThreadsPerThreadgroup "
                                                       r"256.*drops the dispatch silently.*rule 13"):
            s.command(icb, 0, "fill", [(out, 0), (var, 0)], tg=(512, 1, 1))
    else:
        s.command(icb, 0, "fill", [(out, 0), (var, 0)], tg=(512, 1, 1))
        s.residency(out, var)
        cb = s.submit_icb(icb, 0, 1)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted and not s.floats(out).any()  # silently dropped


def test_rule13_a_repeated_icb_patch_is_checked_again_when_the_limit_changed(scenes: list[Scene]) -> None:
    """Strict mode does not check a patch that leaves a command's sizes as they were (a Session patches every
    command at every submit), but checks it again once the pipeline's limit is not the one it was checked with."""
    s = scene(scenes, True)
    out, var = s.buffer(4096), s.buffer(256)
    icb = s.icb(1)
    cmd = s.command(icb, 0, "fill", [(out, 0), (var, 0)], tg=(256, 1, 1))
    s.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (256, 1, 1))  # as it was
    s.dev.set_max_total_threads(s.pipelines["fill"], 128)
    with pytest.raises(MetalValidationError, match=r"256 threads per threadgroup > maxTotalThreadsPerThreadgroup 128"):
        s.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (256, 1, 1))
    with pytest.raises(MetalValidationError, match=r"256 threads per threadgroup"):  # refused: not remembered as fine
        s.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (256, 1, 1))


def _direct_fill(s: Scene, out: int, var: int, grid: tuple[int, int, int], tg: tuple[int, int, int],
                 commit: bool = True) -> int:
    """One command buffer with one direct-path dispatch of ``fill`` (retained); committed unless asked."""
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "retain")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "setComputePipelineState:", s.pipelines["fill"])
    s.send(enc, "setBuffer:offset:atIndex:", out, 0, 0)
    s.send(enc, "setBuffer:offset:atIndex:", var, 0, 1)
    s.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", grid, tg)
    s.send(enc, "endEncoding")
    if commit:
        s.send(cb, "commit")
    return int(cb)


@pytest.mark.parametrize("strict", MODES)
def test_rule13_direct_dispatch_above_the_pipeline_limit(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    s.dev.set_max_total_threads(s.pipelines["fill"], 128)
    out, var = s.buffer(4096), s.buffer(256)
    s.set_int(var, 0, 1)
    if strict:
        with pytest.raises(MetalValidationError, match=r"dispatchThreadgroups:\(2, 1, 1\) threadsPerThreadgroup:"
                                                       r"\(16, 16, 1\).*256 threads per threadgroup > "
                                                       r"maxTotalThreadsPerThreadgroup 128.*rule 13"):
            _direct_fill(s, out, var, (2, 1, 1), (16, 16, 1))
        return
    cb = _direct_fill(s, out, var, (2, 1, 1), (16, 16, 1))
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and not s.floats(out).any() and s.dev.gpu.kernels_run == 0


WRAPPED = 2**64 - 4  # a grid expression that went below 1 (start_pos - 5 at start_pos = 1), as an NSUInteger


@pytest.mark.parametrize("strict", MODES)
@pytest.mark.parametrize("grid, tg", [((WRAPPED, 1, 1), (4, 1, 1)), ((1, 2**31, 1), (1, 2, 1)),
                                      ((1, 1, 2**32), (1, 1, 1))], ids=["wrapped", "y-threads", "z-groups"])
def test_grid_of_2_32_threads_per_axis_direct(scenes: list[Scene], strict: bool, grid: tuple[int, int, int],
                                              tg: tuple[int, int, int]) -> None:
    s = scene(scenes, strict)
    out, var = s.buffer(64), s.buffer(256)
    s.set_int(var, 0, 1)
    if strict:
        with pytest.raises(MetalValidationError, match=r"dispatchThreadgroups:.*threadgroupsPerGrid "
                                                       rf"\[{grid[0]}, {grid[1]}, {grid[2]}\] x threadsPerThreadgroup "
                                                       r".*is not below 2\*\*32.*Metal API validation"):
            _direct_fill(s, out, var, grid, tg)
        return
    cb = _direct_fill(s, out, var, grid, tg)
    s.dev.run_until_idle()
    # never handed to the kernel runner: the command buffer fails as the GPU watchdog would end it
    assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorTimeout
    assert "is not below 2**32" in s.error_text(cb) and s.dev.gpu.kernels_run == 0


@pytest.mark.parametrize("strict", MODES)
def test_grid_of_2_32_threads_per_axis_icb(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    out, var = s.buffer(64), s.buffer(256)
    s.set_int(var, 0, 1)
    icb = s.icb(2)
    s.command(icb, 0, "fill", [(out, 0), (var, 0)])
    cmd = s.command(icb, 1, "fill", [(out, 0), (var, 0)])
    call = "concurrentDispatchThreadgroups:threadsPerThreadgroup:"
    if strict:  # the setter refuses the sizes of a command, the constant ones of link and those a submit patches
        with pytest.raises(MetalValidationError, match=rf"{call[:30]}.*\[{WRAPPED}, 1, 1\].*is not below 2\*\*32"):
            s.send(cmd, call, (WRAPPED, 1, 1), (4, 1, 1))
        assert s.dev.object(icb).slots[1].grid == (1, 1, 1)  # type: ignore[attr-defined]  # the call changed nothing
        return
    s.send(cmd, call, (WRAPPED, 1, 1), (4, 1, 1))
    s.residency(out, var)
    cb = s.submit_icb(icb, 0, 2)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorTimeout
    assert "ICB command 1" in s.error_text(cb) and s.dev.gpu.kernels_run == 1  # command 0 ran, command 1 never


def test_grid_limit_at_execute_in_strict_mode(scenes: list[Scene]) -> None:
    """A command whose sizes were set on a faithful path (no pipeline yet) is refused at executeCommandsInBuffer:."""
    s = scene(scenes, True)
    out, var = s.buffer(64), s.buffer(256)
    icb = s.icb(1)
    cmd = s.command(icb, 0, "fill", [(out, 0), (var, 0)])
    slot = s.dev.object(icb).slots[0]  # type: ignore[attr-defined]
    slot.grid = (WRAPPED, 1, 1)  # as if written behind the validation layer's back
    s.dev.object(icb).version += 1  # type: ignore[attr-defined]
    s.residency(out, var)
    with pytest.raises(MetalValidationError, match=r"executeCommandsInBuffer:.*ICB command 0 \(fill\).*is not "
                                                   r"below 2\*\*32"):
        s.submit_icb(icb, 0, 1)
    assert cmd


@pytest.mark.parametrize("strict", MODES)
def test_rule13_zero_size_dispatch_is_accepted(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    out, var = s.buffer(64), s.buffer(256)
    s.set_int(var, 0, 1)
    icb = s.icb(1)
    s.command(icb, 0, "fill", [(out, 0), (var, 0)], grid=(0, 1, 1))
    s.residency(out, var)
    cb = s.submit_icb(icb, 0, 1, warmup=("fill",))
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and not s.floats(out).any()


# ---------------------------------------------------------------------------- rule 14: freed while in flight
@pytest.mark.parametrize("strict", MODES)
def test_rule14_buffer_freed_while_in_flight(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, out, var = fill_icb(s)
    s.residency(out, var)
    cb = s.submit_icb(icb, 0, 1)
    if strict:
        with pytest.raises(MetalValidationError, match=r"deallocated while MTLCommandBuffer .* uses it.*error 9.*"
                                                       r"rule 14"):
            s.send(out, "release")
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted
        s.send(out, "release")  # after completion it is fine
    else:
        s.send(out, "release")
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorInvalidResource
        assert "rule 14" in s.error_text(cb)


# ---------------------------------------------------------------------------- rule 15: CPU writes while in flight
@pytest.mark.parametrize("strict", MODES)
def test_rule15_cpu_patches_argument_bytes_while_in_flight(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, out, var = fill_icb(s, value=1)
    s.residency(out, var)
    cb = s.submit_icb(icb, 0, 1)
    if strict:
        with pytest.raises(MetalValidationError, match=r"the CPU writes 4 bytes at offset 0 of MTLBuffer .* while "
                                                       r"MTLCommandBuffer .*Committed.* reads it.*rule 15"):
            s.set_int(var, 0, 2)
        s.dev.run_until_idle()
        assert (s.floats(out)[:4] == 1).all()
        s.set_int(var, 0, 2)  # completed: patching is fine now
    else:
        s.set_int(var, 0, 2)  # the race: the GPU has not read it yet
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted and (s.floats(out)[:4] == 2).all()


@pytest.mark.parametrize("strict", MODES)
def test_rule15_cpu_rewrites_icb_command_while_in_flight(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    icb, out, var = fill_icb(s, value=3)
    other = s.buffer(64)
    s.residency(out, var, other)
    cmd = s.send(icb, "indirectComputeCommandAtIndex:", 0)
    cb = s.submit_icb(icb, 0, 1)
    if strict:
        with pytest.raises(MetalValidationError, match=r"changes ICB command 0 .* while MTLCommandBuffer .* executes "
                                                       r"it.*rule 15"):
            s.send(cmd, "setKernelBuffer:offset:atIndex:", other, 0, 0)
        with pytest.raises(MetalValidationError, match=r"rule 15"):
            s.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (2, 1, 1), (4, 1, 1))
    else:
        s.send(cmd, "setKernelBuffer:offset:atIndex:", other, 0, 0)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted
        assert (s.floats(other)[:4] == 3).all() and not s.floats(out).any()  # the GPU saw the new binding


def test_rule15_writes_elsewhere_are_fine_while_in_flight(scenes: list[Scene]) -> None:
    s = scene(scenes, True)
    icb, out, var = fill_icb(s)
    unrelated = s.buffer(64)
    s.residency(out, var)
    s.submit_icb(icb, 0, 1)
    s.dev.store(s.contents(unrelated), dtypes.float32, 1.5)
    scratch = s.dev.malloc(16)
    s.dev.write(scratch, b"\x01" * 16)
    s.dev.run_until_idle()


# ---------------------------------------------------------------------------- rule 16: pre-Apple9 warm-up
@pytest.mark.parametrize("strict", MODES)
@pytest.mark.parametrize("family", ["Apple7", "Apple8", "Mac2"])
def test_rule16_icb_pipeline_not_bound_first(scenes: list[Scene], strict: bool, family: str) -> None:
    s = scene(scenes, strict, family=family)
    icb, out, var = fill_icb(s)
    s.residency(out, var)
    if strict:
        with pytest.raises(MetalValidationError, match=rf"used by ICB command 0 but was not bound on this encoder with "
                                                       rf"setComputePipelineState: "
                                                       rf"first \({family} faults.*rule 16"):
            s.submit_icb(icb, 0, 1)
    else:
        cb = s.submit_icb(icb, 0, 1)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorInvalidResource
        assert "rule 16" in s.error_text(cb)
    cb = s.submit_icb(icb, 0, 1, warmup=("fill",))
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and (s.floats(out)[:4] == 7).all()


@pytest.mark.parametrize("strict", MODES)
def test_rule16_apple9_needs_no_warmup(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict, family="Apple9")
    icb, out, var = fill_icb(s)
    s.residency(out, var)
    cb = s.submit_icb(icb, 0, 1)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and np.all(s.floats(out)[:4] == 7)
