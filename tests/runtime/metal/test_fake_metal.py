"""MetalBridge through a real Objective-C runtime: GNU's libobjc4 with an Apple-convention objc_msgSend, and a fake
Metal framework written in Objective-C (tests/native/fakemetal.m), on x86_64.

``mtlir run TRACE --device metal`` drives the unmodified MetalBridge over the built libraries; the fake logs every
message it receives and runs each dispatch through the kernel server (the simulator's KernelRunner on the
buffers' real bytes). Every Apple7 trace must match, the fake must have received exactly the messages ``mtlir
lower --json`` lists, and the dispatch records (kernel, grid, threadgroup, bindings, offsets) must be those of
``--device sim``. The same runs on AArch64 under qemu are ``make test-arm64`` (tests/arm64/).
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fake_metal import (APPLE7, FLAGS, NATIVE, Libs, build, canonical, compiler, lowered_messages, run_on_fake,
                        run_on_sim)
from mtlir.errors import ArgumentError
from mtlir.ir.dtypes import dtypes
from mtlir.metal import Prototype, abi_prototype, c_prototype
from mtlir.runtime.metal.bridge import LIBS_ENV, MetalBridge, host_target, library_paths, metal_available

sys.path.insert(0, str(NATIVE))
from kernel_server import KernelServer  # noqa: E402

pytestmark = pytest.mark.skipif(host_target() != "x86_64" or not sys.platform.startswith("linux"),
                                reason="the fake Metal is built for Linux x86_64 here (AArch64: make test-arm64)")


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Libs:
    if compiler("x86_64") is None:
        pytest.fail("gcc-12 with Objective-C is missing: `make sysdeps` installs gobjc-12 and libobjc4")
    return build("x86_64", tmp_path_factory.mktemp("fakemetal"))


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[dict[str, Any]], Any]]:
    """The kernel server (a thread of this process; ctypes lets go of the GIL during the fake's commit)."""
    from mtlir.runtime.sim.kernels.runner import KernelRunner
    runner = KernelRunner()
    records: list[dict[str, Any]] = []
    path = str(tmp_path_factory.mktemp("ks") / "kernels.sock")
    server = KernelServer(path, runner, records.append)
    yield path, records, runner
    server.close()


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "fake.jsonl"


# ---- every Apple7 trace, end to end ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", list(FLAGS))
@pytest.mark.parametrize("trace", APPLE7, ids=[Path(t).name.split(".")[0] for t in APPLE7])
def test_trace_on_the_fake_matches_the_listing_and_the_simulator(libs: Libs, kernels: Any, log_path: Path,
                                                                trace: str, how: str) -> None:
    path, records, runner = kernels
    records.clear()
    run = run_on_fake(trace, FLAGS[how], libs, path, log_path)
    assert run.code == 0 and run.doc["match"] is True and run.doc["device"] == "metal", run.stderr
    assert run.doc["icb"] is (how != "direct") and run.doc["residency_set"] is (how != "no-rs")
    # what arrived in the fake's methods is what the lowering lists, message for message
    listing = lowered_messages(trace, FLAGS[how], "x86_64")
    assert run.first_submit(len(listing)) == listing
    # and the kernels ran as on the simulated device
    code, sim = run_on_sim(trace, FLAGS[how], runner)
    assert code == 0
    assert canonical(records) == canonical(sim) and len(sim) == run.doc["kernels"]


def test_the_cli_runs_on_the_libraries_the_variable_names(libs: Libs, kernels: Any, tmp_path: Path) -> None:
    """``mtlir run --device metal`` as a program: only MTLIR_METAL_LIBS says where Metal is."""
    path, _, _ = kernels
    env = dict(os.environ, **{LIBS_ENV: libs.env, "FAKE_METAL_KERNELS": path,
                              "FAKE_METAL_LOG": str(tmp_path / "cli.jsonl")})
    done = subprocess.run([sys.executable, "-m", "mtlir.cli.main", "run", APPLE7[0], "--device", "auto", "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["device"] == "metal" and doc["match"] is True and doc["path"] == "ICB"
    assert '"sel": "commit"' in (tmp_path / "cli.jsonl").read_text()


@pytest.mark.parametrize("off,path", [("FAKE_METAL_NO_ICB", "direct path, no ICB"),
                                      ("FAKE_METAL_NO_RESIDENCY_SETS", "ICB")])
def test_the_probe_lowers_for_what_the_fake_offers(libs: Libs, kernels: Any, log_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, off: str, path: str) -> None:
    monkeypatch.setenv(off, "1")
    run = run_on_fake(APPLE7[0], [], libs, kernels[0], log_path)
    assert run.code == 0 and run.doc["match"] is True and run.doc["path"] == path
    assert run.doc["residency_set"] is (off != "FAKE_METAL_NO_RESIDENCY_SETS")
    assert "lowering without it" in run.stderr


# ---- the bridge's library paths -------------------------------------------------------------------------------

def test_library_paths() -> None:
    assert library_paths({}) == ("/usr/lib/libobjc.A.dylib", "/System/Library/Frameworks/Metal.framework/Metal",
                                 "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics")
    assert library_paths({LIBS_ENV: "/a/objc.so:/b/metal.so"}) == ("/a/objc.so", "/b/metal.so", None)
    assert library_paths({LIBS_ENV: "/a:/b:/c"}) == ("/a", "/b", "/c")
    for bad in ("/a", ":/b", "/a:/b:/c:/d"):
        with pytest.raises(ArgumentError, match="expected LIBOBJC:METAL"):
            library_paths({LIBS_ENV: bad})


def test_metal_available_is_whether_the_libraries_load(libs: Libs, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        monkeypatch.setenv(LIBS_ENV, libs.env)
        metal_available.cache_clear()
        assert metal_available() is True
        monkeypatch.setenv(LIBS_ENV, f"{libs.libobjc}:/nonexistent/Metal")
        metal_available.cache_clear()
        assert metal_available() is False
    finally:
        metal_available.cache_clear()


# ---- single messages: structs, events, errors, status ---------------------------------------------------------

@pytest.fixture(scope="module")
def bridge(libs: Libs) -> MetalBridge:
    return MetalBridge(libobjc=libs.libobjc, metal=libs.metal, coregraphics=None)


def send(b: MetalBridge, selector: str, receiver: int, *args: Any) -> Any:
    return b.msg_send(abi_prototype(selector, b.target), (receiver, b.sel_registerName(selector), *args))


def last_logged(log_path: Path, selector: str) -> list[Any]:
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    return next(m["args"] for m in reversed(lines) if m["sel"] == selector)


@pytest.fixture
def device(bridge: MetalBridge, kernels: Any, log_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv("FAKE_METAL_LOG", str(log_path))
    monkeypatch.setenv("FAKE_METAL_KERNELS", kernels[0])
    return int(bridge.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ()))


BIG = (1 << 64) - 1


def test_structs_arrive_intact(bridge: MetalBridge, device: int, log_path: Path) -> None:
    cb = send(bridge, "commandBuffer", send(bridge, "newCommandQueueWithMaxCommandBufferCount:", device, 4))
    enc = send(bridge, "computeCommandEncoder", cb)
    grid, group = ((1 << 33) + 1, 7, BIG), (32, (1 << 63) + 5, 1)
    send(bridge, "dispatchThreadgroups:threadsPerThreadgroup:", enc, grid, group)
    assert last_logged(log_path, "dispatchThreadgroups:threadsPerThreadgroup:") == [list(grid), list(group)]
    send(bridge, "executeCommandsInBuffer:withRange:", enc, device, 1 << 35, BIG)
    assert last_logged(log_path, "executeCommandsInBuffer:withRange:") == [device, [1 << 35, BIG]]
    send(bridge, "setBuffer:offset:atIndex:", enc, device, BIG - 1, 30)
    assert last_logged(log_path, "setBuffer:offset:atIndex:") == [device, BIG - 1, 30]


def test_negative_control_mtlsize_by_pointer_on_x86_64_is_caught(bridge: MetalBridge, device: int,
                                                                 log_path: Path) -> None:
    """arm64's convention (a pointer to a copy) used on x86_64: the method reads its MTLSizes from the stack, so
    the check above sees other values. The check can fail."""
    cb = send(bridge, "commandBuffer", send(bridge, "newCommandQueueWithMaxCommandBufferCount:", device, 4))
    enc = send(bridge, "computeCommandEncoder", cb)
    grid, group = bridge.malloc(24), bridge.malloc(24)
    bridge.store(grid, dtypes.MTLSize, (3, 5, 7))
    bridge.store(group, dtypes.MTLSize, (11, 13, 17))
    wrong = Prototype(dtypes.void, (dtypes.id, dtypes.SEL, dtypes.voidptr, dtypes.voidptr))
    bridge.msg_send(wrong, (enc, bridge.sel_registerName("dispatchThreadgroups:threadsPerThreadgroup:"), grid, group))
    assert last_logged(log_path, "dispatchThreadgroups:threadsPerThreadgroup:") != [[3, 5, 7], [11, 13, 17]]


def test_shared_event_status_and_gpu_times(bridge: MetalBridge, device: int) -> None:
    event = send(bridge, "newSharedEvent", device)
    assert send(bridge, "signaledValue", event) == 0
    assert send(bridge, "waitUntilSignaledValue:timeoutMS:", event, 1, 5) == 0
    queue = send(bridge, "newCommandQueueWithMaxCommandBufferCount:", device, 4)
    fence = send(bridge, "newFence", device)
    waiter = send(bridge, "commandBuffer", queue)
    send(bridge, "encodeWaitForEvent:value:", waiter, event, (1 << 40) + 7)
    send(bridge, "commit", waiter)
    assert send(bridge, "status", waiter) == 2  # Committed: waits for a value no one has signalled yet
    cb = send(bridge, "commandBuffer", queue)
    enc = send(bridge, "computeCommandEncoder", cb)
    send(bridge, "waitForFence:", enc, fence)
    send(bridge, "updateFence:", enc, fence)
    send(bridge, "endEncoding", enc)
    send(bridge, "encodeSignalEvent:value:", cb, event, (1 << 40) + 7)
    assert send(bridge, "status", cb) == 0
    send(bridge, "commit", cb)
    send(bridge, "waitUntilCompleted", cb)
    assert send(bridge, "status", cb) == 4 and send(bridge, "error", cb) == 0
    assert send(bridge, "status", waiter) == 4  # ran once the signal came
    assert send(bridge, "signaledValue", event) == (1 << 40) + 7
    assert send(bridge, "waitUntilSignaledValue:timeoutMS:", event, (1 << 40) + 7, 5) == 1
    assert send(bridge, "waitUntilSignaledValue:timeoutMS:", event, (1 << 40) + 8, 5) == 0
    start, end = send(bridge, "GPUStartTime", cb), send(bridge, "GPUEndTime", cb)
    assert isinstance(start, float) and 0.0 < start <= end


def _nsstring(b: MetalBridge, ptr: int) -> str:
    return b.read_cstring(send(b, "UTF8String", ptr))


def test_a_library_that_fails_to_compile_gives_an_nserror(bridge: MetalBridge, device: int) -> None:
    err = bridge.malloc(8)
    lib = send(bridge, "newLibraryWithSource:options:error:", device, bridge.make_string("kernel void k( {"), 0, err)
    assert lib == 0
    nserror = bridge.load(err, dtypes.id)
    assert nserror != 0 and send(bridge, "code", nserror) == 3  # MTLLibraryErrorCompileFailure
    assert "is never closed" in _nsstring(bridge, send(bridge, "localizedDescription", nserror))


KERNEL = "#include <metal_stdlib>\nkernel void twice(device float* a [[buffer(0)]], uint i [[thread_position_in_grid]])" \
         " { a[i] = 2.0f * a[i]; }\n"


def _pipeline(b: MetalBridge, device: int) -> int:
    lib = send(b, "newLibraryWithSource:options:error:", device, b.make_string(KERNEL), 0, 0)
    fn = send(b, "newFunctionWithName:", lib, b.make_string("twice"))
    desc = send(b, "new", b.objc_getClass("MTLComputePipelineDescriptor"))
    send(b, "setComputeFunction:", desc, fn)
    send(b, "setSupportIndirectCommandBuffers:", desc, True)
    return int(send(b, "newComputePipelineStateWithDescriptor:options:reflection:error:", device, desc, 0, 0, 0))


def test_icb_commands_and_use_resources_run_on_real_bytes(bridge: MetalBridge, device: int, log_path: Path) -> None:
    pso = _pipeline(bridge, device)
    buf = send(bridge, "newBufferWithLength:options:", device, 64, 0)
    ptr = send(bridge, "contents", buf)
    bridge.write(ptr, (ctypes.c_float * 16)(*range(16)))
    desc = send(bridge, "new", bridge.objc_getClass("MTLIndirectCommandBufferDescriptor"))
    icb = send(bridge, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", device, desc, 2, 0)
    cmd = send(bridge, "indirectComputeCommandAtIndex:", icb, 1)
    send(bridge, "setComputePipelineState:", cmd, pso)
    send(bridge, "setKernelBuffer:offset:atIndex:", cmd, buf, 32, 0)
    send(bridge, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", cmd, (2, 1, 1), (4, 1, 1))
    send(bridge, "setBarrier", cmd)
    cb = send(bridge, "commandBuffer", send(bridge, "newCommandQueueWithMaxCommandBufferCount:", device, 4))
    enc = send(bridge, "computeCommandEncoder", cb)
    table = bridge.malloc(8)
    bridge.store(table, dtypes.id, buf)
    send(bridge, "useResources:count:usage:", enc, table, 1, 3)
    assert last_logged(log_path, "useResources:count:usage:") == [table, 1, 3]
    send(bridge, "executeCommandsInBuffer:withRange:", enc, icb, 0, 2)
    send(bridge, "endEncoding", enc)
    send(bridge, "commit", cb)
    assert send(bridge, "status", cb) == 4
    got = list((ctypes.c_float * 16).from_address(ptr))
    assert got == [float(i) for i in range(8)] + [2.0 * i for i in range(8, 16)]


def test_a_failing_dispatch_fails_its_command_buffer(bridge: MetalBridge, device: int) -> None:
    pso = _pipeline(bridge, device)
    buf = send(bridge, "newBufferWithLength:options:", device, 64, 0)
    cb = send(bridge, "commandBuffer", send(bridge, "newCommandQueueWithMaxCommandBufferCount:", device, 4))
    enc = send(bridge, "computeCommandEncoder", cb)
    send(bridge, "setComputePipelineState:", enc, pso)
    send(bridge, "setBuffer:offset:atIndex:", enc, buf, 0, 0)
    send(bridge, "dispatchThreadgroups:threadsPerThreadgroup:", enc, (1, 1, 1), (8192, 1, 1))
    send(bridge, "endEncoding", enc)
    send(bridge, "commit", cb)
    assert send(bridge, "status", cb) == 5  # Error
    error = send(bridge, "error", cb)
    assert error != 0 and "threadgroup" in _nsstring(bridge, send(bridge, "localizedDescription", error))


def test_messages_to_nil_return_zero(bridge: MetalBridge) -> None:
    assert send(bridge, "commandBuffer", 0) == 0
    assert send(bridge, "GPUEndTime", 0) == 0.0
    assert send(bridge, "waitUntilSignaledValue:timeoutMS:", 0, 1, 1) == 0
