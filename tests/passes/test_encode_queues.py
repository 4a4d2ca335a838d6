"""Several queues on one device (issue 17): each queue's command buffers on its own queue and fence, cross-queue
waits as encodeWaitForEvent:value: before the encoder, signals of any event, one submit for all queues in order,
and the lowering's refusals of what can never complete."""
from __future__ import annotations

import re

import pytest
from lowering_cases import SCALE, message_lines

from mtlir.frontend.nodes import QueueError, buffer, shared_event, timeline_value
from mtlir.frontend.queue import Queue, queues
from mtlir.metal import DeviceSpec
from mtlir.passes import lower
from mtlir.passes.encode.commands import EncodeError
from mtlir.passes.verify import verify_queue

DEV = DeviceSpec("Apple9")


def two_queues() -> tuple[Queue, Queue]:
    x, y, z = buffer("x", 64), buffer("y", 64), buffer("z", 64)
    v = timeline_value()
    copy = Queue(DEV, name="copy")
    compute = Queue(DEV)
    copy.exec(SCALE, [x, y]).signal(copy.timeline, v)
    compute.exec(SCALE, [z, z]).wait(copy.timeline, v).exec(SCALE, [y, z]).signal(compute.timeline, v)
    return copy, compute


def test_a_cross_queue_wait_is_encoded_before_the_encoder_on_the_waiting_queue() -> None:
    copy, compute = two_queues()
    graph = queues(copy, compute)
    verify_queue(graph)
    lines = [line for line in message_lines(lower(graph).program) if " retain" not in line]
    waits = [i for i, line in enumerate(lines) if "encodeWaitForEvent:value:" in line]
    assert len(waits) == 1
    # the copy queue's command buffer first (the order given), then compute's two: the wait splits them
    queue_msgs = [line.split()[0] for line in lines if line.endswith("commandBuffer")]
    assert queue_msgs == ["queue:copy", "queue", "queue"]
    w = waits[0]
    assert lines[w].split()[2] == "event:copy"
    assert lines[w - 1].endswith("commandBuffer") and lines[w + 1].endswith("computeCommandEncoder")
    fences = [line.split()[2] for line in lines if "waitForFence:" in line]
    assert fences == ["fence:copy", "fence", "fence"]
    signals = [line.split()[2] for line in lines if "encodeSignalEvent:value:" in line]
    assert signals == ["event:copy", "event"]


def test_one_queue_lowers_as_before_when_named_default() -> None:
    """``queues(q)`` of one default queue lowers to exactly the messages of ``q.submit()``."""
    x = buffer("x", 64)
    q = Queue(DEV)
    q.exec(SCALE, [x, x]).signal(q.timeline, timeline_value())
    assert message_lines(lower(queues(q)).program) == message_lines(lower(q.submit()).program)


def test_a_constant_signal_only_the_first_submit_can_make_is_noted() -> None:
    """A Program replays every signal: a constant one is ignored by Metal from the second submit on, and a wait for
    it passes at once (a user's faithful run gave a wrong answer from submit 2, silently). The lowering notes it,
    once per queue and event; a signal of the timeline value is not noted."""
    copy, compute = two_queues()
    assert not [d for d in lower(queues(copy, compute)).diagnostics if "constant" in d]
    x, y = buffer("x", 64), buffer("y", 64)
    v = timeline_value()
    go = shared_event("go")
    a, b = Queue(DEV, name="a"), Queue(DEV)
    a.exec(SCALE, [x, y]).signal(go, 1).signal(go, 2).signal(a.timeline, v)
    b.wait(go, 1).exec(SCALE, [y, x]).signal(b.timeline, v)
    notes = [d for d in lower(queues(a, b)).diagnostics if "constant" in d]
    assert notes == ["encode: signal after command 1 of queue 'a': event:go gets the constant 1 at every submit; from "
                     "the second submit on Metal ignores it (the event has that value already, METAL.md §3 rule 12) "
                     "and a wait for it passes at once: signal a value that grows per submit (timeline_value(), or "
                     "an expression of it)"]


def test_signal_of_a_shared_event_and_a_wait_the_host_may_end() -> None:
    x = buffer("x", 64)
    ready = shared_event("ready")
    q = Queue(DEV)
    q.wait(ready, 1).exec(SCALE, [x, x]).signal(ready, 2).signal(q.timeline, timeline_value())
    lines = message_lines(lower(q.submit()).program)
    assert any("encodeWaitForEvent:value:" in line and "event:ready" in line for line in lines)
    assert any("encodeSignalEvent:value:" in line and "event:ready" in line for line in lines)


def test_a_wait_no_queue_signals_is_refused() -> None:
    x = buffer("x", 64)
    copy, compute = Queue(DEV, name="copy"), Queue(DEV)
    copy.exec(SCALE, [x, x])
    compute.wait(copy.timeline, 1).exec(SCALE, [x, x])
    with pytest.raises(EncodeError, match=r"wait after command 0: event:copy >= 1: no queue of the program signals "
                                          r"event:copy, so the wait can never complete"):
        lower(queues(copy, compute))


def test_a_wait_above_every_signal_is_refused() -> None:
    x = buffer("x", 64)
    copy, compute = Queue(DEV, name="copy"), Queue(DEV, name="compute")
    copy.exec(SCALE, [x, x]).signal(copy.timeline, 2)
    compute.wait(copy.timeline, 3).exec(SCALE, [x, x])
    with pytest.raises(EncodeError, match=r"of queue 'compute': event:copy >= 3: the queues signal event:copy up to "
                                          r"2 at most"):
        lower(queues(copy, compute))


@pytest.mark.parametrize("first, second", [(5, 4), (timeline_value(), timeline_value() - 1)])
def test_signal_values_that_go_down_are_refused(first: object, second: object) -> None:
    x = buffer("x", 64)
    q = Queue(DEV)
    q.exec(SCALE, [x, x]).signal(q.timeline, first).exec(SCALE, [x, x]).signal(q.timeline, second)  # type: ignore
    with pytest.raises(EncodeError, match=r"signal after command 2: event goes down from .* to .*only increases"):
        lower(q.submit())


def test_queues_checks_its_queues() -> None:
    with pytest.raises(QueueError, match="two queues are named 'copy'"):
        queues(Queue(DEV, name="copy"), Queue(DEV, name="copy"))
    with pytest.raises(QueueError, match="different devices"):
        queues(Queue(DEV, name="a"), Queue(DeviceSpec("Apple7")))
    with pytest.raises(QueueError, match="identifier"):
        Queue(DEV, name="a b")


def test_blits_get_their_own_encoder_between_compute_encoders() -> None:
    x, y = buffer("x", 64), buffer("y", 64)
    q = Queue(DEV)
    q.exec(SCALE, [x, y]).copy(x, y, 32, dst_offset=32).fill(x, 0, 16).exec(SCALE, [y, x]).signal(q.timeline, 1)
    lines = [line for line in message_lines(lower(q.submit()).program) if " retain" not in line]
    encoders = [line.split()[1] for line in lines if line.endswith("Encoder")]
    assert encoders == ["computeCommandEncoder", "blitCommandEncoder", "computeCommandEncoder"]
    blit = lines.index(next(line for line in lines if line.endswith("blitCommandEncoder")))
    assert [line.split()[1] for line in lines[blit + 1:blit + 6]] == [
        "waitForFence:", "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", "fillBuffer:range:value:",
        "updateFence:", "endEncoding"]
    assert lines[blit + 3].split()[2:] == ["buffer:x", "0", "16", "0"]  # buffer, NSRange(0, 16), value 0


def test_blit_ranges_are_checked() -> None:
    from mtlir.ir.uop import UOp
    x, y = buffer("x", 64), buffer("y", 64)
    k = UOp.variable("k", 0, 4)
    with pytest.raises(QueueError, match=r"copy after command 0: destination: bytes up to 80 run past the end of "
                                         r"the 64-byte buffer 'y'"):
        Queue(DEV).copy(x, y, 16, dst_offset=k * 16)
    with pytest.raises(QueueError, match="fill after command 0: offset: 2 is not a multiple of 4"):
        Queue(DEV).fill(x, 1, 8, offset=2)
    with pytest.raises(QueueError, match=r"the value is a byte"):
        Queue(DEV).fill(x, 256)
    with pytest.raises(EncodeError, match="TIMESTAMPs .* without blits"):
        lower(Queue(DEV).fill(x, 1).timestamp(0).submit())


def test_a_copy_between_overlapping_ranges_of_one_buffer_is_refused() -> None:
    """Metal leaves it undefined (Metal Programming Guide, "Copying Data Between Two Buffers"); the simulator did a
    memmove. Refused with both ranges; with variables, when their bounds allow an overlap."""
    from mtlir.frontend.nodes import view
    from mtlir.ir.uop import UOp
    b = buffer("b", 1024)
    with pytest.raises(QueueError, match=r"copy after command 0 \('b' to itself\): source bytes \[0, 512\) and "
                                         r"destination bytes \[256, 768\) overlap: Metal leaves"):
        Queue(DEV).copy(b, b, 512, src_offset=0, dst_offset=256)
    with pytest.raises(QueueError, match=r"source bytes \[0, 512\) and destination bytes \[256, 768\) overlap"):
        Queue(DEV).copy(view(b, 0, 512), view(b, 256, 512))  # views: their offsets in the buffer
    k = UOp.variable("k", 0, 512)
    with pytest.raises(QueueError, match=r"destination bytes \[k, k \+ 256\) can overlap \(for k in \[0, 512\]\)"):
        Queue(DEV).copy(b, b, 256, dst_offset=k)
    Queue(DEV).copy(b, b, 512, src_offset=512, dst_offset=0)  # adjacent ranges, either way
    Queue(DEV).copy(b, b, 256, src_offset=0, dst_offset=256)
    Queue(DEV).copy(b, b, 256, dst_offset=k + 256)  # k + 256 >= 256: never below the source's end
    Queue(DEV).copy(b, buffer("c", 1024), 512, src_offset=0, dst_offset=256)  # two buffers


def test_verify_queue_checks_blits_and_queue_names() -> None:
    from mtlir.ir.dtypes import dtypes
    from mtlir.ir.ops import Ops
    from mtlir.ir.uop import UOp
    from mtlir.passes.verify import VerifyError
    x, y = buffer("x", 64), buffer("y", 64)
    q = Queue(DEV, name="copy")
    q.copy(x, y).fill(y, 3, 16)
    good = q.submit()
    verify_queue(good)
    copy_op, fill_op = good.src
    cases = [
        (good.replace(tag="a b"), "a SUBMIT's tag is its queue's name"),
        (good.replace(src=(copy_op.replace(src=copy_op.src[:4]),)), "a COPY's sources are (src, src_offset, dst"),
        (good.replace(src=(fill_op.replace(arg=300),)), "a FILL's arg is the byte value"),
        (good.replace(src=(fill_op.replace(src=(UOp.const(dtypes.uint64, 1), *fill_op.src[1:])),)),
         "a FILL's sources are (buffer, offset, size)"),
    ]
    for bad, message in cases:
        with pytest.raises(VerifyError, match=re.escape(message)):
            verify_queue(bad)
    verify_queue(UOp(Ops.SINK, dtypes.void, (good,), DEV))  # a SINK of SUBMITs: several queues


def test_a_named_queue_with_timestamps_uses_its_own_queue_and_fence() -> None:
    x = buffer("x", 64)
    q = Queue(DEV, name="solo")
    q.timestamp(0).exec(SCALE, [x, x]).exec(SCALE, [x, x]).timestamp(1).signal(q.timeline, 1)
    lines = message_lines(lower(q.submit()).program)
    assert {line.split()[0] for line in lines if line.endswith(" commandBuffer")} == {"queue:solo"}
    assert {line.split()[2] for line in lines if "waitForFence:" in line} == {"fence:solo"}


@pytest.mark.parametrize("wait, signal, most", [(timeline_value(), timeline_value(), "timeline - 1"),
                                                (timeline_value() + 5, timeline_value(), "timeline - 1"),
                                                (7, 3, "3")])
def test_a_wait_on_the_own_timeline_before_its_signal_is_refused(wait: object, signal: object, most: str) -> None:
    """The wait lowers to nothing (the fence orders the queue), so a value neither signaled earlier in the submit
    nor by the previous submit (the timeline one lower) would be dropped silently: refused."""
    x = buffer("x", 64)
    q = Queue(DEV, name="a")
    q.wait(q.timeline, wait).exec(SCALE, [x, x]).signal(q.timeline, signal)  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match=rf"wait after command 0 of queue 'a': event:a >= .*: the queue's own "
                                          rf"timeline is at most {most} there.*can never complete"):
        lower(queues(q))


def test_a_wait_on_the_own_timeline_no_queue_signals_is_refused() -> None:
    x = buffer("x", 64)
    q = Queue(DEV)
    q.wait(q.timeline, 1).exec(SCALE, [x, x])
    with pytest.raises(EncodeError, match=r"wait after command 0: event >= 1: no queue of the program signals event"):
        lower(q.submit())


def test_waits_on_the_own_timeline_for_what_was_signaled_lower_to_nothing() -> None:
    """The previous submit's value (``v - 1``), a value signaled earlier in the submit, 0, and a constant the
    previous submit signaled are fine."""
    x = buffer("x", 64)
    v = timeline_value()
    q = Queue(DEV)
    q.wait(q.timeline, v - 1).exec(SCALE, [x, x]).signal(q.timeline, v).wait(q.timeline, v).wait(q.timeline, 0)
    q.exec(SCALE, [x, x]).signal(q.timeline, v + 1)
    lines = message_lines(lower(q.submit()).program)
    assert not any("encodeWaitForEvent:value:" in line for line in lines)
    c = Queue(DEV)
    c.wait(c.timeline, 5).exec(SCALE, [x, x]).signal(c.timeline, 5)
    lower(c.submit())


def test_the_same_signal_value_twice_is_refused() -> None:
    x = buffer("x", 64)
    v = timeline_value()
    q = Queue(DEV)
    q.exec(SCALE, [x, x]).signal(q.timeline, v).exec(SCALE, [x, x]).signal(q.timeline, v)
    with pytest.raises(EncodeError, match=r"signal after command 2: event does not go up from timeline to timeline "
                                          r"\(the same value again\).*only increases"):
        lower(q.submit())
    c = Queue(DEV)
    c.exec(SCALE, [x, x]).signal(c.timeline, 3).signal(c.timeline, 3)
    with pytest.raises(EncodeError, match=r"signal after command 1: event does not go up from 3 to 3"):
        lower(c.submit())
