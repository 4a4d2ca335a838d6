"""RecordingBridge: records with objects by name and structs decoded per target (the same record on arm64 and
x86_64); as a standalone fake device it answers link and a submit sensibly; as a wrapper it passes calls on."""
from __future__ import annotations

import struct

import pytest
from progbuild import submit_program

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL, abi_prototype, c_prototype
from mtlir.runtime import HostMemory, RecordingBridge, Session, link
from mtlir.errors import BridgeError


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


def test_host_memory_checks() -> None:
    m = HostMemory()
    a = m.malloc(16)
    assert a % 16 == 0 and a >= 2**32
    m.store(a, dtypes.int32, -1)
    assert m.load(a, dtypes.uint32) == 2**32 - 1
    m.store(a + 8, dtypes.float32, 1.5)
    assert m.load(a + 8, dtypes.float32) == 1.5
    with pytest.raises(BridgeError, match="outside host memory"):
        m.read(a + 1000, 4)
    with pytest.raises(BridgeError, match="outside host memory"):
        m.read(a & 0xFFFFFFFF, 4)  # an address cut to 32 bits
    m.free(a)
    with pytest.raises(BridgeError, match="freed twice"):
        m.free(a)


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


def test_host_memory_maps_big_blocks_lazily_and_keeps_accesses_inside_one_allocation() -> None:
    """A 4 GiB buffer of a fake device is an anonymous map (pages only when touched: `mtlir lower --json` of a trace
    with such a buffer took 4.2 GB and 14 s when host memory was one bytearray); an access never spans two
    allocations."""
    import mmap

    from mtlir.runtime.bridge.bridge import HostMemory
    mem = HostMemory()
    small = mem.malloc(24)
    big = mem.malloc(1 << 32)
    assert isinstance(mem.blocks[-1], mmap.mmap) and isinstance(mem.blocks[0], bytearray)
    mem.write(big + (1 << 32) - 4, b"\x01\x02\x03\x04")
    assert mem.read(big + (1 << 32) - 4, 4) == b"\x01\x02\x03\x04" and mem.read(big, 4) == bytes(4)
    mem.store(big + 8, dtypes.uint64, 2**64 - 1)
    assert mem.load(big + 8, dtypes.uint64) == 2**64 - 1
    with pytest.raises(BridgeError, match="outside host memory"):
        mem.read(small + 24, 16)  # past the small block's padding, into the next allocation
    with pytest.raises(BridgeError, match="outside host memory"):
        mem.read(big + (1 << 32) - 2, 4)
