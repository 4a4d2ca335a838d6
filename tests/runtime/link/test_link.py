"""link (every placeholder kind, the exact link-time messages, errors naming the object, release) and the Session's
replay, wait and error reporting, against RecordingBridge fakes (the simulated device is in test_end_to_end)."""
from __future__ import annotations

import re
import struct
from typing import Any

import pytest
from progbuild import submit_program

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL, Prototype
from mtlir.errors import ArgumentError, GPUExecutionError, LinkError
from mtlir.runtime.bridge.recording import FakeDevice, RecordingBridge
from mtlir.runtime.link.link import link
from mtlir.runtime.session import Session

_CREATES = ("new", "newCommandQueueWithMaxCommandBufferCount:", "newSharedEvent", "newFence",
            "newBufferWithLength:options:", "newLibraryWithSource:options:error:", "newFunctionWithName:",
            "newComputePipelineStateWithDescriptor:options:reflection:error:",
            "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", "newResidencySetWithDescriptor:error:")


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_link_messages_with_a_residency_set(target: str) -> None:
    b = RecordingBridge(target=target)
    linked = link(submit_program(target, kernels=2), b)
    sels = [(m["receiver"], m["selector"]) for m in b.messages]
    # the queue, event, fence, then buffers each followed by contents
    assert sels[:9] == [("device", "newCommandQueueWithMaxCommandBufferCount:"), ("device", "newSharedEvent"),
                        ("device", "newFence"), ("device", "newBufferWithLength:options:"), ("buffer:0", "contents"),
                        ("device", "newBufferWithLength:options:"), ("buffer:1", "contents"),
                        ("device", "newBufferWithLength:options:"), ("varbuf", "contents")]
    # pipeline from source, through a descriptor that supports ICBs
    i = sels.index(("device", "newLibraryWithSource:options:error:"))
    assert sels[i - 1] == ("NSString", "stringWithUTF8String:")
    assert ("library:add1", "newFunctionWithName:") in sels
    assert ("descriptor:pipeline:add1", "setComputeFunction:") in sels
    assert {"receiver": "descriptor:pipeline:add1", "selector": "setSupportIndirectCommandBuffers:",
            "args": [True]} in b.messages
    # the ICB descriptor, then each command: retained, pipeline, bindings, sizes, barrier
    icb_desc = [m for m in b.messages if m["receiver"] == "descriptor:icb"]
    assert [(m["selector"], m["args"]) for m in icb_desc] == [
        ("setCommandTypes:", [MTL.IndirectCommandTypeConcurrentDispatch]), ("setInheritBuffers:", [False]),
        ("setInheritPipelineState:", [False]), ("setMaxKernelBufferBindCount:", [3]), ("release", [])]
    cmd1 = [(m["selector"], m["args"]) for m in b.messages if m["receiver"] == "icb[1]"]
    assert cmd1 == [("retain", []), ("setComputePipelineState:", ["pipeline:add1"]),
                    ("setKernelBuffer:offset:atIndex:", ["buffer:1", 0, 0]),
                    ("setKernelBuffer:offset:atIndex:", ["buffer:0", 0, 1]),
                    ("setKernelBuffer:offset:atIndex:", ["varbuf", 0, 2]),
                    ("concurrentDispatchThreadgroups:threadsPerThreadgroup:", [[16, 1, 1], [4, 1, 1]]),
                    ("setBarrier", [])]
    # every allocation in the residency set, committed, attached to the queue
    rs = [(m["selector"], m["args"]) for m in b.messages if m["receiver"] == "residency_set"]
    assert rs == [("addAllocation:", ["buffer:0"]), ("addAllocation:", ["buffer:1"]), ("addAllocation:", ["varbuf"]),
                  ("addAllocation:", ["icb"]), ("commit", [])]
    assert sels[-1] == ("queue", "addResidencySet:")
    assert linked.names[linked.handles["icb[0]"]] == "icb[0]"
    for r, obj in linked.program.objects.items():  # every placeholder register holds its object
        assert linked.registers[r] == linked.handles[obj.name]


def test_without_a_residency_set_the_resources_table_holds_the_handles() -> None:
    b = RecordingBridge()
    linked = link(submit_program("arm64", residency_set=False), b)
    assert not any("esidency" in m["selector"] for m in b.messages)
    table = linked.handles["resources"]
    names = ("buffer:0", "buffer:1", "varbuf", "icb")
    assert struct.unpack("<4Q", b.read(table, 32)) == tuple(linked.handles[n] for n in names)


def test_initial_data_and_buffer_access() -> None:
    b = RecordingBridge()
    linked = link(submit_program(), b, initial={"buffer:1": b"\x01\x02\x03", "buffer:0": (8, b"\xff")})
    assert linked.read_buffer("buffer:1", 0, 4) == b"\x01\x02\x03\x00"
    assert linked.read_buffer("buffer:0", 7, 3) == b"\x00\xff\x00"
    assert len(linked.read_buffer("buffer:0")) == 256
    linked.write_buffer("buffer:0", b"zz", offset=254)
    assert linked.read_buffer("buffer:0", 254) == b"zz"
    with pytest.raises(ValueError, match="outside its 256 bytes"):
        linked.read_buffer("buffer:0", 250, 10)
    with pytest.raises(ArgumentError, match="no buffer named 'buffer:9'"):
        linked.read_buffer("buffer:9")


@pytest.mark.parametrize("initial, match", [
    ({"buffer:9": b"x"}, "initial data for 'buffer:9', which is not a buffer"),
    ({"buffer:0": bytes(257)}, "257 bytes at offset 0 do not fit its 256 bytes"),
])
def test_bad_initial_data(initial: dict[str, Any], match: str) -> None:
    with pytest.raises(LinkError, match=match):
        link(submit_program(), RecordingBridge(), initial=initial)


class NilBridge(RecordingBridge):
    """A fake device where one selector returns nil, with an NSError when the call has an error out-param."""

    def __init__(self, nil_for: str, message: str = "", max_threads: int = 1024, **kw: Any) -> None:
        super().__init__(**kw)
        self.nil_for, self.message, self.max_threads = nil_for, message, max_threads
        self.errors: dict[int, str] = {}

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        sel = self.selector_name(args[1])
        if sel == self.nil_for:
            super().msg_send(proto, args)
            if sel.endswith("error:"):
                err = self.make_string("NSError")
                self.errors[err] = self.message
                self.store(args[-1], dtypes.uint64, err)
            return 0
        if sel == "maxTotalThreadsPerThreadgroup":
            super().msg_send(proto, args)
            return self.max_threads
        if sel == "localizedDescription" and args[0] in self.errors:
            return self.make_string(self.errors[args[0]])
        if sel == "code" and args[0] in self.errors:
            return 3
        return super().msg_send(proto, args)


def _released(b: RecordingBridge) -> list[str]:
    return [m["receiver"] for m in b.messages if m["selector"] == "release"]


def test_nil_library_names_the_pipeline_and_metal_says_why() -> None:
    b = NilBridge("newLibraryWithSource:options:error:", "program_source:3:1: error: unknown type name 'flot'")
    with pytest.raises(LinkError, match=r"library of pipeline:add1: .*returned nil: program_source:3:1: error: "
                                        r"unknown type name 'flot' \(NSError code 3\)"):
        link(submit_program(), b)
    # what was created before the failure is released, newest first
    assert _released(b)[:4] == ["varbuf", "buffer:1", "buffer:0", "fence"]
    assert _released(b)[-1] == "device"


@pytest.mark.parametrize("selector, match", [
    ("newCommandQueueWithMaxCommandBufferCount:", "command queue 'queue': Metal returned nil"),
    ("newBufferWithLength:options:", r"buffer:0 \(256 bytes\): Metal returned nil"),
    ("newFunctionWithName:", "pipeline:add1: function 'add1' of its library: Metal returned nil"),
    ("newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", "out of memory, or has no ICB support .*--no-icb"),
    ("newResidencySetWithDescriptor:error:", "residency set .*--no-residency-set"),
])
def test_nil_results_name_the_object(selector: str, match: str) -> None:
    with pytest.raises(LinkError, match=match):
        link(submit_program(), NilBridge(selector, "unsupported"))


def test_threadgroup_above_the_pipeline_limit() -> None:
    with pytest.raises(LinkError, match=r"icb\[0\] \(pipeline:add1\): threadgroup \[4, 1, 1\] = 4 threads is more "
                                        r"than the pipeline's maxTotalThreadsPerThreadgroup 2"):
        link(submit_program(), NilBridge("", max_threads=2))


def test_target_mismatch() -> None:
    with pytest.raises(LinkError, match="lowered for arm64 but the bridge decodes x86_64"):
        link(submit_program("arm64"), RecordingBridge(target="x86_64"))


def test_release_gives_back_every_object_once() -> None:
    b = RecordingBridge()
    linked = link(submit_program(), b)
    created = sum(1 for m in b.messages if m["selector"] in _CREATES) + 1  # + the device (a C call)
    descriptors = 3  # released by link itself
    retained = sum(1 for m in b.messages if m["selector"] == "retain")
    b.clear()
    linked.release()
    linked.release()  # idempotent
    rel = _released(b)
    assert len(rel) == len(set(rel)) == created - descriptors + retained
    assert rel[-1] == "device" and "icb[1]" in rel and "pipeline:add1" in rel


# ---- the Session: replay, wait, errors


class FaultBridge(RecordingBridge):
    """Command buffers stay Committed until ``complete`` is called; ``fail(code)`` puts them in status Error with
    an NSError of that code (Metal then skips their event signals)."""

    def __init__(self) -> None:
        self.device = FakeDevice()
        super().__init__(self.device)
        self.state = MTL.StatusCommitted
        self.code = 0
        self.cbs: set[int] = set()
        self.signals: dict[int, tuple[int, int]] = {}
        self.err = 0

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        sel, recv = self.selector_name(args[1]), args[0]
        if sel == "commandBuffer":
            cb = super().msg_send(proto, args)
            self.cbs.add(cb)
            return cb
        if sel == "encodeSignalEvent:value:":  # held back until complete(), not signalled at commit
            self.signals[recv] = (args[2], args[3])
            return None
        if sel == "status" and recv in self.cbs:
            return self.state
        if sel == "error" and recv in self.cbs:
            return self.err if self.state == MTL.StatusError else 0
        if sel == "code" and recv == self.err:
            return self.code
        if sel == "localizedDescription" and recv == self.err:
            return self.make_string("Caused GPU Address Fault Error (kIOGPUCommandBufferCallbackErrorPageFault)")
        return super().msg_send(proto, args)

    def complete(self) -> None:
        self.state = MTL.StatusCompleted
        for event, value in self.signals.values():
            self.device.signaled[event] = max(self.device.signaled.get(event, 0), value)

    def fail(self, code: int) -> None:
        self.state, self.code = MTL.StatusError, code
        self.err = self.make_string("NSError")


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_submit_wait_replay(executor: str) -> None:
    b = RecordingBridge()
    with Session(submit_program(), b, executor=executor) as s:
        vb = s.linked.buffers["varbuf"][1]
        for n in (1, 17, 64):
            rec = s.submit(n=n)
            assert b.load(vb, dtypes.int32) == n  # the variable patched into the variables buffer
            assert rec.value == s.last_value and len(rec.cbs) == 1
        assert [r.value for r in s.inflight] == [3]  # serialized: each submit waited for the one before
        done = s.wait(3, timeout_s=1.0)
        assert [r.value for r in done] == [3] and not s.inflight
        assert len(done[0].gpu_times) == 1 and s.timeline_value() == 3
        s.submit(n=2, timeline=10)
        assert s.last_value == 10
        with pytest.raises(ValueError, match=r"'n' = 65 is outside its bounds \[1, 64\]"):
            s.submit(n=65)
        assert s.submits == 4 and s.host_s_per_submit > 0
    assert s.closed and not s.inflight


def test_command_buffers_in_cbslots_are_released_when_done() -> None:
    b = RecordingBridge()
    s = Session(submit_program(), b)
    b.clear()
    rec = s.submit(n=4)
    (cb,) = rec.cbs
    retains = [m for m in b.messages if m["selector"] == "retain"]
    assert retains == [{"receiver": "cmdbuf", "selector": "retain", "args": []}]
    s.wait()
    assert b.messages[-1] == {"receiver": "cmdbuf", "selector": "release", "args": []}
    s.close()


def test_gpu_error_is_reported_with_code_and_name() -> None:
    b = FaultBridge()
    s = Session(submit_program(), b, timeout_s=5.0)
    s.submit(n=3)
    b.fail(MTL.ErrorPageFault)
    with pytest.raises(GPUExecutionError) as e:
        s.wait(1, timeout_s=5.0)
    assert e.value.code == 3 and e.value.name == "PageFault"
    assert "MTLCommandBufferError 3 (PageFault)" in str(e.value)
    assert "kIOGPUCommandBufferCallbackErrorPageFault" in str(e.value)
    assert not s.inflight  # its command buffers were released
    s.close()


def test_timeout_says_what_it_waited_for() -> None:
    b = FaultBridge()
    s = Session(submit_program(), b)
    s.submit(n=3)
    with pytest.raises(TimeoutError, match=r"waiting for timeline value 1 \(the last value signaled is 0\); "
                                           r"command buffer statuses: submit 0 \(value 1\): Committed"):
        s.wait(timeout_s=0.02)
    b.complete()
    assert [r.value for r in s.wait(timeout_s=5.0)] == [1]
    s.close()


def test_wait_for_a_value_leaves_later_submits_in_flight() -> None:
    b = RecordingBridge()
    s = Session(submit_program(), b, serialize=False)
    for _ in range(3):
        s.submit(n=1)
    assert [r.value for r in s.wait(2)] == [1, 2]
    assert [r.value for r in s.inflight] == [3]
    s.close()
    assert not s.inflight


def test_timestamp_slots_get_the_gpu_times_of_their_command_buffers() -> None:
    from typing import NamedTuple

    from progbuild import PB

    from mtlir.metal import Obj

    class Stamp(NamedTuple):  # the shape of mtlir.program.payloads.Stamp
        slot: int
        cb: int
        which: str

    p = PB("arm64")
    queue = p.obj(Obj("queue", "queue"))
    slots = p.obj(Obj("cbslots", "cbslots", (3, (Stamp(0, 0, "GPUStartTime"), Stamp(1, 1, "GPUEndTime")))))
    p.obj(Obj("event", "event"))
    loop = p.range(p.const(2))  # one command buffer per command, as a profiled submit does
    cb = p.msg(queue, "commandBuffer")
    p.store(dtypes.uint64, p.index(8, slots, loop[0]), p.msg(cb, "retain"))
    p.msg(cb, "commit")
    p.end(loop)
    b = RecordingBridge()
    with Session(p.build(), b) as s:
        rec = s.submit()
        assert rec.value is None and rec.cbs[2] == 0 and all(rec.cbs[:2])
        (done,) = s.wait(timeout_s=5)
        assert done.timestamps == {0: done.gpu_times[0][0], 1: done.gpu_times[1][1]}
        released = [m for m in b.messages if m["selector"] == "release" and m["receiver"] == "cmdbuf"]
        assert len(released) == 2


def test_varbuf_constants_and_new_buffers() -> None:
    from progbuild import PB

    from mtlir.metal import Obj
    p = PB("arm64")
    p.obj(Obj("varbuf", "varbuf", (512, ((0, "int32", 7), (256, "int64", -3)))))
    p.obj(Obj("queue", "queue"))
    b = RecordingBridge()
    linked = link(p.build(), b)
    assert linked.read_buffer("varbuf", 0, 4) == struct.pack("<i", 7)
    assert linked.read_buffer("varbuf", 256, 8) == struct.pack("<q", -3)
    b.clear()
    h = linked.new_buffer("input:x", 64, b"\x01\x02")
    assert linked.read_buffer("input:x", 0, 3) == b"\x01\x02\x00" and linked.names[h] == "input:x"
    assert [(m["receiver"], m["selector"], m["args"]) for m in b.messages][-2:] == [
        ("residency_set", "addAllocation:", ["input:x"]), ("residency_set", "commit", [])]
    with pytest.raises(LinkError, match="is taken"):
        linked.new_buffer("input:x", 64)
    with pytest.raises(LinkError, match="3 bytes of data in a buffer of 2 bytes"):
        linked.new_buffer("input:y", 2, b"abc")
    b.clear()
    linked.release()
    assert b.messages[0] == {"receiver": "input:x", "selector": "release", "args": []}


def test_icb_payload_of_another_shape() -> None:
    from mtlir.runtime.link.kinds import icb_commands
    with pytest.raises(LinkError, match="has no 'commands'"):
        icb_commands(object())  # type: ignore[arg-type]
    with pytest.raises(LinkError, match=r"icb\[0\]: cannot read"):
        icb_commands(type("Spec", (), {"commands": [("p",)]})())  # type: ignore[arg-type]


def test_wait_for_a_value_no_submit_signals_is_an_error_not_a_success() -> None:
    s = Session(submit_program(), RecordingBridge())
    s.submit(n=1)
    with pytest.raises(ValueError, match=r"wait\(100\): no submit signals timeline value 100: the highest timeline "
                                         r"value submitted is 1"):
        s.wait(100, timeout_s=1.0)
    assert [r.value for r in s.wait(1, timeout_s=1.0)] == [1]
    assert s.wait(1, timeout_s=1.0) == []  # already reached: returns at once
    s.close()


class RaisingBridge(RecordingBridge):
    """A RecordingBridge whose ``selector`` raises ``error`` (after the call when ``after``), once, when armed
    (``error`` set after link)."""

    def __init__(self, selector: str, after: bool = False) -> None:
        super().__init__()
        self.selector, self.after = selector, after
        self.error: Exception | None = None

    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        name = self.selector_name(args[1])
        if name == self.selector and self.error is not None and not self.after:
            error, self.error = self.error, None
            raise error
        out = super().msg_send(proto, args)
        if name == self.selector and self.error is not None:
            error, self.error = self.error, None
            raise error
        return out


@pytest.mark.parametrize("after_commit", [False, True])
def test_an_error_mid_submit_is_raised_as_is_and_its_command_buffers_are_not_leaked(after_commit: bool) -> None:
    selector = "commit" if after_commit else "executeCommandsInBuffer:withRange:"
    b = RaisingBridge(selector, after=after_commit)
    s = Session(submit_program(), b)
    b.error = RuntimeError("boom")
    with pytest.raises(RuntimeError) as e:
        s.submit(n=4)
    assert str(e.value) == "boom" and "while running instruction" in e.value.__notes__[0]
    if after_commit:  # committed: kept in flight until a wait has seen it complete, then released
        assert len(s.inflight) == 1 and s.inflight[0].value is None
        s.wait(timeout_s=1.0)
    assert not s.inflight
    retained = sum(1 for m in b.messages if m["selector"] == "retain" and m["receiver"] == "cmdbuf")
    released = sum(1 for m in b.messages if m["selector"] == "release" and m["receiver"] == "cmdbuf")
    assert retained == released == 1
    rec = s.submit(n=4)  # the session goes on; the failed submit's timeline value is skipped (it may be encoded, or
    assert rec.value == 2  # be what the device refused: rule 12 would refuse it again)
    s.close()


@pytest.mark.parametrize("residency_sets", [True, False])
@pytest.mark.parametrize("icb", [True, False])
def test_probe_device_asks_with_the_messages_link_sends(residency_sets: bool, icb: bool) -> None:
    from mtlir.runtime.probe import probe_device
    from mtlir.runtime.sim.device import SimDevice
    dev = SimDevice("arm64", residency_sets=residency_sets, icb=icb)
    rec = RecordingBridge(dev)
    caps = probe_device(rec)
    assert (caps.residency_sets, caps.icb) == (residency_sets, icb)
    assert len(caps.notes) == (not residency_sets) + (not icb)
    assert dev.live_objects() == {}  # every probe object released, the pool drained
    sels = [m["selector"] for m in rec.messages]
    assert "newResidencySetWithDescriptor:error:" in sels
    assert "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:" in sels
    assert sels.count("new") == sels.count("release") - 1 - residency_sets - icb  # descriptors, sets, ICB, device


def test_probe_device_without_a_device() -> None:
    from mtlir.runtime.probe import probe_device

    class NoDevice(RecordingBridge):
        def c_call(self, fn: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
            return 0 if fn == "MTLCreateSystemDefaultDevice" else super().c_call(fn, proto, args)
    with pytest.raises(LinkError, match="MTLCreateSystemDefaultDevice returned nil"):
        probe_device(NoDevice())


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_direct_path_constant_threadgroup_above_the_pipeline_limit(target: str) -> None:
    from progbuild import direct_program
    with pytest.raises(LinkError, match=r"dispatch at instruction \d+ \(pipeline:add1\): threadgroup \[8, 2, 1\] = "
                                        r"16 threads is more than the pipeline's maxTotalThreadsPerThreadgroup 8"):
        link(direct_program(target, threadgroup=(8, 2, 1)), NilBridge("", max_threads=8, target=target))
    link(direct_program(target, threadgroup=(8, 1, 1)), NilBridge("", max_threads=8, target=target)).release()
    # a threadgroup set per submit is the device's to check (the simulated device raises in strict mode)
    link(direct_program(target, threadgroup=None), NilBridge("", max_threads=8, target=target)).release()


# ---- what the API says about bad arguments (each a clear TypeError/ValueError/RuntimeError, never a hang)

@pytest.mark.parametrize("call, error, match", [
    (lambda s: s.wait(timeout_s=-1), ValueError, r"wait\(timeout_s=...\): -1 seconds: a finite number >= 0"),
    (lambda s: s.wait(timeout_s=float("nan")), ValueError, r"nan seconds"),
    (lambda s: s.wait(timeout_s="1"), TypeError, r"seconds are a number, got str '1'"),
    (lambda s: s.wait(-1), ValueError, r"wait\(-1\): timeline values are >= 0"),
    (lambda s: s.wait("x"), TypeError, r"wait\(value='x'\): a timeline value is an int"),
    (lambda s: s.wait(True), TypeError, r"a timeline value is an int"),
])
def test_wait_refuses_bad_arguments(call: Any, error: type[Exception], match: str) -> None:
    s = Session(submit_program(), RecordingBridge())
    s.submit(n=1)
    with pytest.raises(error, match=match):
        call(s)
    assert [r.value for r in s.wait(1)] == [1]  # nothing was lost
    s.close()


def test_wait_on_a_closed_session_says_so() -> None:
    s = Session(submit_program(), RecordingBridge())
    s.close()
    with pytest.raises(RuntimeError, match="wait on a closed Session"):
        s.wait()
    with pytest.raises(RuntimeError, match="submit on a closed Session"):
        s.submit(n=1)


@pytest.mark.parametrize("timeout", [0, -2.5, float("inf")])
def test_session_timeout_must_be_positive_seconds(timeout: float) -> None:
    with pytest.raises(ValueError, match=r"Session\(timeout_s=...\)"):
        Session(submit_program(), RecordingBridge(), timeout_s=timeout)


@pytest.mark.parametrize("data, shown", [("hello", "str 'hello'"), ([1, 2], "list [1, 2]"), ((-0.5, b"x"), "tuple")])
def test_initial_data_must_be_bytes_naming_the_buffer(data: Any, shown: str) -> None:
    b = RecordingBridge()
    with pytest.raises(TypeError, match=r"initial data for 'buffer:1' must be bytes \(or a tuple \(byte offset, "
                                        rf"bytes\)\), got {re.escape(shown)}"):
        Session(submit_program(), b, initial={"buffer:1": data})
    assert not any(m["selector"] == "newBufferWithLength:options:" for m in b.messages)  # refused before anything


def test_a_buffer_the_host_cannot_allocate_is_a_link_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A huge buffer of a trace (here 1 GiB, refused) was a MemoryError: exit 5 in the CLI instead of 2."""
    dev = FakeDevice()
    real = dev.memory.alloc

    def tight(nbytes: int, *args: Any) -> Any:
        if nbytes > 1 << 20:
            raise MemoryError
        return real(nbytes, *args)
    monkeypatch.setattr(dev.memory, "alloc", tight)
    b = RecordingBridge(dev)
    with pytest.raises(LinkError, match=r"buffer:0 \(1073741824 bytes\): not enough memory to create it"):
        link(submit_program(nbytes=1 << 30), b)
