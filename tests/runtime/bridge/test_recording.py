"""RecordingBridge: records with objects by name and structs decoded per target (the same record on arm64 and
x86_64); its FakeDevice answers link and a submit sensibly; as a wrapper it passes calls on."""
from __future__ import annotations

import struct

import pytest
from progbuild import submit_program

from mtlir.errors import BridgeError
from mtlir.metal import MTL, abi_prototype, c_prototype
from mtlir.runtime.bridge.recording import FakeDevice, RecordingBridge
from mtlir.runtime.link.link import link
from mtlir.runtime.session import Session


def _recv(b: RecordingBridge, name: str) -> int:
    h = b.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ())
    b.name_object(h, name)
    return h


def _send(b: RecordingBridge, recv: int, selector: str, *args: object) -> object:
    return b.msg_send(abi_prototype(selector, b.target), (recv, b.sel_registerName(selector), *args))


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_structs_are_decoded_per_target(target: str) -> None:
    b = RecordingBridge(target=target)
    enc, icb = _recv(b, "encoder"), _recv(b, "icb")
    if target == "arm64":  # MTLSize: a pointer to a 24-byte copy
        grid, tg = b.malloc(24), b.malloc(24)
        b.write(grid, struct.pack("<3Q", 7, 2, 1))
        b.write(tg, struct.pack("<3Q", 32, 1, 1))
    else:  # MTLSize by value
        grid, tg = (7, 2, 1), (32, 1, 1)
    _send(b, enc, "dispatchThreadgroups:threadsPerThreadgroup:", grid, tg)
    _send(b, enc, "executeCommandsInBuffer:withRange:", icb, 16384, 5)  # NSRange: two words on both targets
    _send(b, enc, "useResources:count:usage:", 0, 3, MTL.ResourceUsageRead | MTL.ResourceUsageWrite)
    assert b.clear() == [
        {"receiver": "encoder", "selector": "dispatchThreadgroups:threadsPerThreadgroup:",
         "args": [[7, 2, 1], [32, 1, 1]]},
        {"receiver": "encoder", "selector": "executeCommandsInBuffer:withRange:", "args": ["icb", [16384, 5]]},
        {"receiver": "encoder", "selector": "useResources:count:usage:", "args": [None, 3, 3]},
    ]


def test_a_submit_records_the_same_on_both_targets() -> None:
    records = []
    for target in ("arm64", "x86_64"):
        b = RecordingBridge(target=target)
        with Session(submit_program(target), b) as s:
            records.append(s.record_submit(n=9))
    assert records[0] == records[1]
    assert [m["selector"] for m in records[0]] == [
        "commandBuffer", "retain", "computeCommandEncoder", "waitForFence:", "setComputePipelineState:",
        "dispatchThreadgroups:threadsPerThreadgroup:", "concurrentDispatchThreadgroups:threadsPerThreadgroup:",
        "executeCommandsInBuffer:withRange:", "updateFence:", "endEncoding", "encodeSignalEvent:value:", "commit"]
    assert records[0][6] == {"receiver": "icb[0]", "selector": "concurrentDispatchThreadgroups:threadsPerThreadgroup:",
                             "args": [[3, 1, 1], [4, 1, 1]]}
    assert records[0][10]["args"] == ["event", 1]


def test_results_are_named_and_bools_recorded_as_bools() -> None:
    b = RecordingBridge()
    q = _recv(b, "queue")
    cb = _send(b, q, "commandBuffer")
    enc = _send(b, cb, "computeCommandEncoder")
    desc = _send(b, b.objc_getClass("MTLComputePipelineDescriptor"), "new")
    _send(b, desc, "setSupportIndirectCommandBuffers:", 1)
    recs = b.clear()
    assert b.name_of(cb) == "cmdbuf" and b.name_of(enc) == "encoder"
    assert recs[2]["receiver"] == "MTLComputePipelineDescriptor"
    assert recs[3] == {"receiver": f"0x{desc:x}", "selector": "setSupportIndirectCommandBuffers:", "args": [True]}


def test_standalone_device_answers() -> None:
    b = RecordingBridge()
    dev = b.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ())
    assert dev >= 2**32 and b.sel_registerName("commit") >= 2**32
    buf = _send(b, dev, "newBufferWithLength:options:", 100, 0)
    contents = _send(b, buf, "contents")
    assert contents >= 2**32 and _send(b, buf, "length") == 100
    b.write(contents + 96, b"abcd")
    assert b.read(contents + 96, 4) == b"abcd"
    event, q = _send(b, dev, "newSharedEvent"), _send(b, dev, "newCommandQueueWithMaxCommandBufferCount:", 8)
    cb = _send(b, q, "commandBuffer")
    _send(b, cb, "encodeSignalEvent:value:", event, 5)
    assert _send(b, event, "signaledValue") == 0  # not before commit
    _send(b, cb, "commit")
    assert _send(b, event, "signaledValue") == 5
    assert _send(b, event, "waitUntilSignaledValue:timeoutMS:", 5, 10) is True
    assert _send(b, cb, "status") == MTL.StatusCompleted and _send(b, cb, "error") == 0
    ns = b.make_string("hello")
    assert b.read_cstring(_send(b, ns, "UTF8String")) == "hello"
    icb = _send(b, dev, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", 0, 4, 0)
    assert _send(b, icb, "indirectComputeCommandAtIndex:", 2) == _send(b, icb, "indirectComputeCommandAtIndex:", 2)


def test_wrapping_passes_calls_on_and_can_pause() -> None:
    inner = RecordingBridge(target="x86_64")
    outer = RecordingBridge(inner)
    assert outer.target == "x86_64"
    prog = submit_program("x86_64")
    linked = link(prog, outer)
    assert inner.messages == outer.messages  # every message reached the inner bridge, decoded the same
    outer.recording = False
    q = linked.handles["queue"]
    _send(outer, q, "commandBuffer")
    assert outer.messages[-1]["selector"] != "commandBuffer" and inner.messages[-1]["selector"] == "commandBuffer"
    with pytest.raises(ValueError, match="disagrees"):
        RecordingBridge(inner, target="arm64")
    with pytest.raises(ValueError, match="unknown target"):
        RecordingBridge(target="riscv")


def test_unknown_sel_is_refused() -> None:
    b = RecordingBridge()
    with pytest.raises(BridgeError, match="unknown SEL"):
        b.msg_send(abi_prototype("commit", "arm64"), (2**40, 12345))


def test_pointers_into_named_regions() -> None:
    b = RecordingBridge()
    base = b.malloc(512)
    b.name_region(base, 512, "contents:varbuf")
    enc = _recv(b, "encoder")
    _send(b, enc, "setBytes:length:atIndex:", base + 256, 4, 3)
    _send(b, enc, "setBytes:length:atIndex:", base, 4, 2)
    _send(b, enc, "setBytes:length:atIndex:", base + 512, 4, 1)  # one past the end: not in the region
    assert [m["args"][0] for m in b.clear()] == ["contents:varbuf+256", "contents:varbuf", f"0x{base + 512:x}"]


def test_a_fake_device_is_a_bridge_of_its_own() -> None:
    """The standalone RecordingBridge records a FakeDevice: the same answers wrapped or alone, its buffers' contents
    are the device's memory (not malloc memory), and a selector it does not know answers by its return type."""
    dev = FakeDevice("x86_64")
    b = RecordingBridge(dev)
    assert isinstance(RecordingBridge().inner, FakeDevice) and b.target == "x86_64"
    device = dev.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ())
    buf = _send(b, device, "newBufferWithLength:options:", 64, 0)
    contents = _send(b, buf, "contents")
    assert dev.buffers[buf] == (64, contents) and _send(b, buf, "length") == 64
    with pytest.raises(BridgeError, match="is not malloc memory"):
        b.free(contents)
    assert _send(b, device, "newFence") >= FakeDevice.HANDLE_BASE  # an object: a fresh handle
    assert _send(b, device, "newSharedEvent") != _send(b, device, "newSharedEvent")
    assert _send(b, 0, "contents") == 0 and _send(b, 0, "release") is None  # messages to nil
    with pytest.raises(BridgeError, match="C function 'dlopen' is unknown to the recording bridge"):
        b.c_call("dlopen", c_prototype("objc_getClass"), (0,))


def test_sels_and_classes_from_c_calls_are_known_by_name() -> None:
    b = RecordingBridge()
    name = b.malloc(32)
    b.write(name, b"MTLComputePipelineDescriptor\0")
    cls = b.c_call("objc_getClass", c_prototype("objc_getClass"), (name,))
    b.write(name, b"commit\0")
    sel = b.c_call("sel_registerName", c_prototype("sel_registerName"), (name,))
    assert sel == b.sel_registerName("commit") and cls == b.objc_getClass("MTLComputePipelineDescriptor")
    b.msg_send(abi_prototype("new", b.target), (cls, b.sel_registerName("new")))
    assert b.clear() == [{"receiver": "MTLComputePipelineDescriptor", "selector": "new", "args": []}]
