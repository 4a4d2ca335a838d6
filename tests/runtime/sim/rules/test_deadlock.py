"""Deadlocks of event waits and queue capacity (METAL.md §3 rules 7 and 17, runtime/sim/rules/deadlock.py): strict
mode names the queues, command buffers, events and values at the call that closes the deadlock; faithful mode hangs
as Metal does until the GPU watchdog ends the command buffers with the same description."""
from __future__ import annotations

import re

import pytest

from mtlir.errors import GPUExecutionError, MetalValidationError
from mtlir.metal import MTL
from simscene import MODES, Scene, scene, scenes  # noqa: F401  (scenes: a fixture)

def waiting(s: Scene, queue: int, event: int, value: int, signal: tuple[int, int] | None = None) -> int:
    """A committed command buffer on ``queue`` that waits for ``event`` to reach ``value`` (then signals)."""
    cb = s.send(queue, "commandBuffer")
    s.send(cb, "retain")
    s.send(cb, "encodeWaitForEvent:value:", event, value)
    if signal is not None:
        s.send(cb, "encodeSignalEvent:value:", *signal)
    s.send(cb, "commit")
    return cb


@pytest.mark.parametrize("strict", MODES)
def test_capacity_deadlock_is_named(scenes: list[Scene], strict: bool) -> None:
    """The queue's two command buffers wait for a value only the next one would signal: commandBuffer blocks
    forever. It used to end by the watchdog citing rule 12, with no word of capacity or deadlock."""
    s = scene(scenes, strict, max_cbs=2, autorun=True)
    first = waiting(s, s.queue, s.event, 1)
    waiting(s, s.queue, s.event, 1)
    pattern = (r"deadlock: commandBuffer on MTLCommandQueue 0x[0-9a-f]+ blocks .*maxCommandBufferCount 2.*"
               r"MTLCommandBuffer 0x[0-9a-f]+ of MTLCommandQueue 0x[0-9a-f]+ waits for MTLSharedEvent 0x[0-9a-f]+ "
               r"to reach 1 \(it is 0\), a value no command buffer signals")
    if strict:
        with pytest.raises(MetalValidationError, match=pattern + r".*rule 7"):
            s.send(s.queue, "commandBuffer")
    else:
        s.send(s.queue, "commandBuffer")  # blocks until the watchdog ends the first
        assert s.status(first) == MTL.StatusError and s.error_code(first) == MTL.ErrorTimeout
        assert "GPU watchdog" in s.error_text(first) and "rule 7" in s.error_text(first)
        assert __import__("re").search(pattern, s.error_text(first))


def test_a_full_queue_whose_work_completes_is_no_deadlock(scenes: list[Scene]) -> None:
    s = scene(scenes, max_cbs=1, autorun=True)
    waiting(s, s.queue, s.event, 1)
    other = s.send(s.device, "newCommandQueueWithMaxCommandBufferCount:", 4)
    signaller = s.send(other, "commandBuffer")
    s.send(signaller, "encodeSignalEvent:value:", s.event, 1)
    s.send(signaller, "commit")
    s.send(s.queue, "commandBuffer")  # returns once the first completes


@pytest.mark.parametrize("strict", MODES)
def test_cross_queue_wait_cycle(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    copy = s.send(s.device, "newCommandQueueWithMaxCommandBufferCount:", 4)
    other = s.send(s.device, "newSharedEvent")
    a = waiting(s, s.queue, other, 1, signal=(s.event, 1))
    q1, q2 = f"MTLCommandQueue {s.queue:#x}", f"MTLCommandQueue {copy:#x}"
    e1, e2 = f"MTLSharedEvent {s.event:#x}", f"MTLSharedEvent {other:#x}"
    if strict:
        with pytest.raises(MetalValidationError) as info:
            waiting(s, copy, s.event, 1, signal=(other, 1))
        text = str(info.value)
        assert text.startswith("commit on MTLCommandBuffer") and text.endswith(
            "(METAL.md §3 rule 17: an event wait that only work it blocks can signal deadlocks)")
    else:
        b = waiting(s, copy, s.event, 1, signal=(other, 1))
        s.dev.run_until_idle()
        assert s.status(a) == s.status(b) == MTL.StatusError and s.error_code(a) == MTL.ErrorTimeout
        text = s.error_text(a)
        assert "GPU watchdog" in text and "rule 17" in text
    assert f"deadlock of {q1}, {q2}" in text
    assert f"of {q1} waits for {e2} to reach 1 (it is 0), a value only MTLCommandBuffer" in text
    assert f"of {q2} waits for {e1} to reach 1 (it is 0)" in text and "after its own wait" in text


@pytest.mark.parametrize("strict", MODES)
def test_a_wait_for_a_signal_behind_it_on_its_queue(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    first = waiting(s, s.queue, s.event, 1)
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "encodeSignalEvent:value:", s.event, 1)
    if strict:
        with pytest.raises(MetalValidationError, match=r"deadlock of .*to reach 1 \(it is 0\), a value only "
                                                       r"MTLCommandBuffer .* \(1, behind it on the same queue\).*rule 17"):
            s.send(cb, "commit")
    else:
        s.send(cb, "commit")
        s.dev.run_until_idle()
        assert s.status(first) == MTL.StatusError and "behind it on the same queue" in s.error_text(first)


def test_waits_the_host_or_later_work_can_end_are_no_deadlock(scenes: list[Scene]) -> None:
    s = scene(scenes, autorun=False)
    copy = s.send(s.device, "newCommandQueueWithMaxCommandBufferCount:", 4)
    other = s.send(s.device, "newSharedEvent")
    a = waiting(s, s.queue, other, 1, signal=(s.event, 1))  # waits on the host
    pending = s.send(copy, "commandBuffer")
    s.send(pending, "encodeSignalEvent:value:", other, 2)  # not committed yet: could still end a cycle
    b = waiting(s, copy, s.event, 1)
    s.send(other, "setSignaledValue:", 1)  # the host signals
    s.send(other, "setSignaledValue:", 0)  # a smaller value is ignored
    assert s.send(other, "signaledValue") == 1
    s.send(pending, "commit")
    s.dev.run_until_idle()
    assert s.status(a) == s.status(b) == MTL.StatusCompleted


def test_faithful_block_that_outlives_the_host_timeout_names_the_deadlock(scenes: list[Scene]) -> None:
    s = scene(scenes, False, max_cbs=1, autorun=True, timeout_s=0.1, gpu_timeout_s=30)
    waiting(s, s.queue, s.event, 1)
    with pytest.raises(TimeoutError, match=r"commandBuffer .*blocked 0.1 s .*rule 7\): deadlock: commandBuffer on "
                                           r"MTLCommandQueue .* waits for MTLSharedEvent .* to reach 1"):
        s.send(s.queue, "commandBuffer")


def test_a_deadlock_of_a_linked_program_names_its_queues_and_events() -> None:
    """link names every object it makes on the simulated device (``SimDevice.name_object``, no message), so the
    diagnosis names the Program's queues and events, not only raw handles (user test 5)."""
    from lowering_cases import SCALE

    from mtlir.frontend.nodes import buffer, timeline_value
    from mtlir.frontend.queue import Queue, queues
    from mtlir.metal import DeviceSpec
    from mtlir.passes import lower
    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice

    x, v = buffer("x", 64), timeline_value()
    a, b = Queue(DeviceSpec("Apple7"), name="a"), Queue(DeviceSpec("Apple7"), name="b")
    a.wait(b.timeline, v).exec(SCALE, [x, x]).signal(a.timeline, v)
    b.wait(a.timeline, v).exec(SCALE, [x, x]).signal(b.timeline, v)
    program = lower(queues(a, b), target="x86_64").program
    # strict: at the commit that closes the cycle, or by the GPU watchdog when the GPU thread gets there first
    with pytest.raises((MetalValidationError, GPUExecutionError)) as e:
        with SimDevice("x86_64", family="Apple7") as dev, Session(program, dev, timeout_s=5) as s:
            s.submit()
            s.wait(timeout_s=5)
    text = str(e.value)
    assert "deadlock of MTLCommandQueue 0x" in text
    assert re.search(r"MTLCommandQueue 0x[0-9a-f]+ \(queue:a\), MTLCommandQueue 0x[0-9a-f]+ \(queue:b\): ", text)
    assert re.search(r"waits for MTLSharedEvent 0x[0-9a-f]+ \(event:b\) to reach 1", text)
    assert re.search(r"waits for MTLSharedEvent 0x[0-9a-f]+ \(event:a\) to reach 1", text)
