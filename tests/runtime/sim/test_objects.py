"""Object lifetimes (retain/release, autorelease pools, zombies), strings, errors, libraries, pipelines, buffers,
residency sets and ICB creation on the simulated device."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL, c_prototype
from mtlir.errors import BridgeError, MetalValidationError, UnsupportedKernelError
from mtlir.runtime.sim.kernels.pyrunner import PyKernelRunner
from simscene import MSL, Scene


@pytest.fixture
def s() -> Iterator[Scene]:
    scene = Scene()
    yield scene
    scene.close()


def test_autorelease_pool_releases_plus_zero_objects(s: Scene) -> None:
    pool = s.m.push()
    cb = s.send(s.queue, "commandBuffer")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "endEncoding")
    icb = s.icb(2)
    cmd = s.send(icb, "indirectComputeCommandAtIndex:", 0)
    string = s.m.string("hello")
    kept = s.send(s.queue, "commandBuffer")
    s.send(kept, "retain")
    s.m.pop(pool)
    for h, cls in ((cb, "MTLCommandBuffer"), (enc, "MTLComputeCommandEncoder"),
                   (cmd, "MTLIndirectComputeCommand"), (string, "NSString")):
        with pytest.raises(BridgeError, match=rf"message sent to deallocated instance {cls} {h:#x}"):
            s.send(h, "retain")
    assert s.status(kept) == MTL.StatusNotEnqueued  # retained: survives the pop
    s.send(kept, "release")
    with pytest.raises(BridgeError, match=r"status \(receiver\): message sent to deallocated instance "
                                          r"MTLCommandBuffer"):
        s.send(kept, "status")
    assert s.send(icb, "indirectComputeCommandAtIndex:", 1) >= 1 << 32  # the ICB itself lives on (+1)


def test_nested_pools_and_bad_tokens(s: Scene) -> None:
    outer = s.m.push()
    a = s.send(s.queue, "commandBuffer")
    inner = s.m.push()
    b = s.send(s.queue, "commandBuffer")
    s.m.pop(outer)  # pops the inner pool too
    for h in (a, b):
        with pytest.raises(BridgeError, match="deallocated"):
            s.send(h, "status")
    with pytest.raises(BridgeError, match=r"objc_autoreleasePoolPop\(.*\): not a pool that is pushed"):
        s.m.pop(inner)
    with pytest.raises(BridgeError, match=r"cut to 32 bits"):
        s.m.pop(outer & 0xFFFFFFFF)


def test_autorelease_pools_are_per_thread(s: Scene) -> None:
    """Objective-C's pools are per thread: the device kept one stack for all threads, so one thread's pop drained
    another thread's objects (its encoder released mid-encoding: "message sent to deallocated instance") and popped
    its pool (a user's 8 Sessions on one device, one per thread)."""
    import threading
    mine = s.m.push()
    a = s.send(s.queue, "commandBuffer")
    pushed, go, done = threading.Event(), threading.Event(), threading.Event()
    theirs: list[int] = []

    def other() -> None:
        theirs.append(s.m.push())
        theirs.append(s.send(s.queue, "commandBuffer"))
        pushed.set()
        go.wait(10)
        s.m.pop(theirs[0])
        done.set()

    t = threading.Thread(target=other)
    t.start()
    assert pushed.wait(10)
    with pytest.raises(BridgeError, match="a pool pushed on another thread"):
        s.m.pop(theirs[0])
    s.m.pop(mine)  # drains this thread's pool only: the other thread's command buffer lives on
    assert s.status(theirs[1]) == MTL.StatusNotEnqueued
    with pytest.raises(BridgeError, match="deallocated"):
        s.send(a, "status")
    go.set()
    assert done.wait(10)
    t.join(10)
    with pytest.raises(BridgeError, match="deallocated"):
        s.send(theirs[1], "status")


def test_no_pool_leaks_like_objective_c(s: Scene) -> None:
    before = s.dev.leaked_autoreleased
    cb = s.send(s.queue, "commandBuffer")
    assert s.dev.leaked_autoreleased == before + 1 and s.status(cb) == MTL.StatusNotEnqueued


def test_committed_command_buffer_lives_until_it_finishes(s: Scene) -> None:
    pool = s.m.push()
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "commit")
    s.m.pop(pool)
    assert s.status(cb) == MTL.StatusCommitted  # the GPU holds it
    s.dev.run_until_idle()
    with pytest.raises(BridgeError, match="deallocated instance MTLCommandBuffer"):
        s.send(cb, "status")


def test_retain_release_counts_and_live_objects(s: Scene) -> None:
    buf = s.buffer(64)
    live = s.dev.live_objects()["MTLBuffer"]
    assert s.send(buf, "retain") == buf
    s.send(buf, "release")
    assert s.send(buf, "length") == 64
    s.send(buf, "release")
    assert s.dev.live_objects().get("MTLBuffer", 0) == live - 1
    with pytest.raises(BridgeError, match="deallocated instance MTLBuffer"):
        s.send(buf, "release")


def test_strings_round_trip(s: Scene) -> None:
    text = "héllo, Metal"
    ns = s.m.string(text)
    assert s.dev.read_cstring(s.send(ns, "UTF8String")) == text
    assert s.dev.read_cstring(s.send(s.dev.make_string("x"), "UTF8String")) == "x"
    assert s.send(s.m.cls("NSString"), "stringWithUTF8String:", 0) == 0
    with pytest.raises(BridgeError, match=r"\+\[MTLCompileOptions stringWithUTF8String:\]: unrecognized selector"):
        s.send(s.m.cls("MTLCompileOptions"), "stringWithUTF8String:", s.m.cstring("x"))
    bad = s.dev.malloc(4)
    s.dev.write(bad, b"abcd")
    with pytest.raises(BridgeError, match=r"no terminating NUL"):
        s.send(s.m.cls("NSString"), "stringWithUTF8String:", bad)


def test_library_compile_error_comes_through_nserror(s: Scene) -> None:
    src = s.m.string(MSL + "\n#error missing semicolon\n")
    assert s.send(s.device, "newLibraryWithSource:options:error:", src, 0, s.err) == 0
    err = s.dev.load(s.err, dtypes.id)
    assert err != 0 and s.send(err, "code") == 3
    text = s.dev.read_cstring(s.send(s.send(err, "localizedDescription"), "UTF8String"))
    assert "Compilation failed" in text and "missing semicolon" in text
    s.send(s.device, "newLibraryWithSource:options:error:", s.m.string(MSL), 0, s.err)
    assert s.dev.load(s.err, dtypes.id) == 0  # success clears the out-parameter


def test_unsupported_kernel_propagates_unchanged() -> None:
    class Refuses(PyKernelRunner):
        def compile(self, msl: str, function: str) -> object:
            raise UnsupportedKernelError("simdgroup matrices", "simdgroup_float8x8")
    with pytest.raises(UnsupportedKernelError) as e:
        Scene(runner=Refuses())
    assert e.value.construct == "simdgroup_float8x8"


def test_functions_and_pipelines(s: Scene) -> None:
    assert s.send(s.lib, "newFunctionWithName:", s.m.string("absent")) == 0
    desc = s.send(s.m.cls("MTLComputePipelineDescriptor"), "new")
    assert s.send(s.device, "newComputePipelineStateWithDescriptor:options:reflection:error:", desc, 0, 0, s.err) == 0
    assert s.send(s.dev.load(s.err, dtypes.id), "code") == 1
    p = s.pipelines["fill"]
    assert s.send(p, "maxTotalThreadsPerThreadgroup") == 1024
    alloc = s.send(s.send(s.m.cls("MTLCompileOptions"), "alloc"), "init")
    assert s.send(s.device, "newLibraryWithSource:options:error:", s.m.string(MSL), alloc, 0) != 0
    with pytest.raises(ValueError, match=r"must be in \[1, 1024\]"):
        s.dev.set_max_total_threads(p, 2048)


def test_icb_pipeline_needs_support_icb(s: Scene) -> None:
    plain = s.pipeline("fill", support_icb=False)
    cmd = s.send(s.icb(1), "indirectComputeCommandAtIndex:", 0)
    with pytest.raises(MetalValidationError, match=r"without supportIndirectCommandBuffers = YES"):
        s.send(cmd, "setComputePipelineState:", plain)


def test_buffers(s: Scene) -> None:
    buf = s.buffer(100)
    addr = s.contents(buf)
    assert s.send(buf, "length") == 100
    s.dev.store(addr + 4, dtypes.float32, 2.5)
    assert s.floats(buf)[1] == 2.5  # contents is the storage the kernels see
    s.floats(buf)[2] = 7.0
    assert s.dev.load(addr + 8, dtypes.float32) == 7.0
    with pytest.raises(BridgeError, match=r"run past the end of contents of MTLBuffer"):
        s.dev.read(addr + 96, 8)
    with pytest.raises(BridgeError, match=r"not malloc memory"):
        s.dev.free(addr)
    private = s.send(s.device, "newBufferWithLength:options:", 64, 2 << 4)
    assert private != 0 and s.contents(private) == 0  # private storage: no CPU mapping
    assert s.send(s.device, "newBufferWithLength:options:", 0, 0) == 0
    s.send(buf, "release")
    with pytest.raises(BridgeError, match=r"host address .* is in freed memory \(contents of MTLBuffer"):
        s.dev.load(addr, dtypes.float32)
    with pytest.raises(BridgeError, match=r"does not fit"):
        s.dev.store(s.contents(s.buffer(8)), dtypes.uint32, -1)


def test_malloc_free(s: Scene) -> None:
    a = s.dev.malloc(10)
    assert a >= 1 << 32 and a % 16 == 0 and s.dev.read(a, 10) == bytes(10)
    s.dev.free(a)
    with pytest.raises(BridgeError, match=r"double free"):
        s.dev.free(a)
    with pytest.raises(BridgeError, match=r"not the start of a block"):
        s.dev.free(s.dev.malloc(8) + 4)


@pytest.mark.parametrize("strict", [True, False])
def test_icb_descriptor_checks(strict: bool) -> None:
    s = Scene(strict)
    try:
        m = s.m
        desc = m.send(m.cls("MTLIndirectCommandBufferDescriptor"), "new")
        m.send(desc, "setCommandTypes:", MTL.IndirectCommandTypeConcurrentDispatch)
        m.send(desc, "setMaxKernelBufferBindCount:", 32)
        make = "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:"
        if strict:
            with pytest.raises(MetalValidationError, match=r"maxKernelBufferBindCount 32 is above 31.*rule 8"):
                m.send(s.device, make, desc, 4, 0)
        else:
            assert m.send(s.device, make, desc, 4, 0) == 0
        m.send(desc, "setMaxKernelBufferBindCount:", 31)
        assert m.send(s.device, make, desc, 4, 0) != 0
        assert m.send(s.device, make, desc, 0, 0) == 0
    finally:
        s.close()


def test_devices_without_icb_or_residency_sets() -> None:
    s = Scene(icb=False, residency_sets=False)
    try:
        assert s.icb(4) == 0
        desc = s.send(s.m.cls("MTLResidencySetDescriptor"), "new")
        assert s.send(s.device, "newResidencySetWithDescriptor:error:", desc, s.err) == 0
        assert "macOS 15" in s.dev.read_cstring(s.send(s.send(s.dev.load(s.err, dtypes.id), "localizedDescription"),
                                                       "UTF8String"))
    finally:
        s.close()


def test_labels_and_classes(s: Scene) -> None:
    s.send(s.queue, "setLabel:", s.m.string("main queue"))
    assert "'main queue'" in s.dev.object(s.queue).describe()
    with pytest.raises(BridgeError, match=r"-\[MTLComputePipelineState setLabel:\]: unrecognized selector"):
        s.send(s.pipelines["fill"], "setLabel:", s.m.string("x"))
    assert s.m.cls("NSString") == s.m.cls("NSString")
    s.send(s.m.cls("NSString"), "release")  # class objects are immortal
    assert s.send(s.m.cls("NSString"), "retain") == s.m.cls("NSString")
    assert s.dev.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ()) == s.device


def test_live_objects_leak_check_after_a_full_cycle(s: Scene) -> None:
    out, var = s.buffer(64), s.buffer(256)
    icb = s.icb(1)
    s.command(icb, 0, "fill", [(out, 0), (var, 0)])
    s.residency(out, var)
    before = s.dev.live_objects()
    for _ in range(3):
        pool = s.m.push()
        cb = s.submit_icb(icb, 0, 1)
        s.send(cb, "release")
        s.m.pop(pool)
    s.dev.run_until_idle()
    after = s.dev.live_objects()
    assert after.get("MTLCommandBuffer", 0) == before.get("MTLCommandBuffer", 0) == 0
    assert after.get("MTLComputeCommandEncoder", 0) == 0
    assert np.all(s.floats(out)[:4] == 0)  # var is 0: fill wrote zeros


def test_two_devices_never_hand_out_the_same_handle() -> None:
    """Each SimDevice numbers its objects in a block of its own: a buffer of one device sent to another is refused
    naming the other device, never taken for the object the second device numbered the same (a silent wrong
    answer: both used to start at the same handle)."""
    a, b = Scene(), Scene()
    try:
        ba, bb = a.buffer(64), b.buffer(64)
        assert ba != bb and not {a.queue, a.event, a.fence} & {b.queue, b.event, b.fence}
        icb = a.icb(1)
        cmd = a.send(icb, "indirectComputeCommandAtIndex:", 0)
        with pytest.raises(BridgeError, match=rf"{bb:#x} is a handle of another SimDevice \(#{b.dev.number} "):
            a.send(cmd, "setKernelBuffer:offset:atIndex:", bb, 0, 0)
        with pytest.raises(BridgeError, match="is a handle of another SimDevice"):
            b.send(ba, "length")
    finally:
        a.close()
        b.close()
