"""Direct dispatches reuse their launches across submits (``GPU.direct_launches``), a released buffer drops them;
the GPU syncs only when a kernel ran since the last sync; a host wait blocks until the command buffer ends."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mtlir.metal import MTL
from mtlir.runtime.sim.kernels.runner import KernelRunner
from simscene import Scene

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
MSL = HEAD + """
kernel void add1(device float* out, uint3 lid [[thread_position_in_threadgroup]]) { out[lid.x] += 1.0f; }
kernel void addk(device float* out, constant float& k, uint3 lid [[thread_position_in_threadgroup]]) {
  out[lid.x] += k;
}
kernel void bump(device float* out, device float* k, uint3 lid [[thread_position_in_threadgroup]]) {
  out[lid.x] += k[lid.x];
  k[lid.x] = k[lid.x] + 1.0f;
}
"""


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


@pytest.fixture
def scene(runner: KernelRunner) -> Iterator[Scene]:
    s = Scene(strict=False, runner=runner, autorun=True)
    s.lib = s.send(s.device, "newLibraryWithSource:options:error:", s.m.string(MSL), 0, s.err)
    s.pipelines = {k: s.pipeline(k) for k in ("add1", "addk", "bump")}
    try:
        yield s
    finally:
        s.close()


def _direct(s: Scene, kernel: str, out: int, extra: bytes | int | None = None, wait: bool = True) -> int:
    """One command buffer of one direct dispatch of ``kernel`` (4 threads) on ``out`` (index 0); ``extra`` at
    index 1: bytes through setBytes, or a buffer. Committed; waited for unless ``wait`` is False."""
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "retain")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "setComputePipelineState:", s.pipelines[kernel])
    s.send(enc, "setBuffer:offset:atIndex:", out, 0, 0)
    if isinstance(extra, bytes):
        s.send(enc, "setBytes:length:atIndex:", _host_bytes(s, extra), len(extra), 1)
    elif extra is not None:
        s.send(enc, "setBuffer:offset:atIndex:", extra, 0, 1)
    s.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (4, 1, 1))
    s.send(enc, "endEncoding")
    s.send(cb, "commit")
    if wait:
        s.send(cb, "waitUntilCompleted")
        assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
    return int(cb)


def _host_bytes(s: Scene, data: bytes) -> int:
    addr = int(s.dev.malloc(len(data)))
    s.dev.write(addr, data)
    return addr


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    prepared: list[Any] = []
    real = KernelRunner.prepare

    def counting(self: KernelRunner, *a: Any, **kw: Any) -> Any:
        prepared.append(kw.get("keep"))
        return real(self, *a, **kw)
    monkeypatch.setattr(KernelRunner, "prepare", counting)
    return prepared


def test_a_direct_dispatch_encoded_again_reuses_its_launch(scene: Scene, monkeypatch: pytest.MonkeyPatch) -> None:
    s = scene
    out = s.buffer(16)
    prepared = _counting(monkeypatch)
    for round_ in (1, 2, 3, 4):
        _direct(s, "add1", out)
        assert s.floats(out)[:4].tolist() == [float(round_)] * 4
    # prepared at its first run (the compiled kernel's shared kernel object), again with one of its own at the
    # second, then reused
    assert prepared == [False, True]
    other = s.buffer(16)  # another buffer is another dispatch: a launch of its own
    _direct(s, "add1", other)
    assert s.floats(other)[:4].tolist() == [1.0] * 4 and s.floats(out)[:4].tolist() == [4.0] * 4
    assert prepared == [False, True, False]


def test_a_released_buffer_drops_the_launches_that_name_it(scene: Scene) -> None:
    s = scene
    out = s.buffer(16)
    for _ in range(2):
        _direct(s, "add1", out)
    gpu = s.dev.gpu.executor  # the launches kept per direct dispatch are the executor's
    assert any(len(k[3]) == 2 and k[3][1] is s.dev.object(out) for k in gpu.direct_launches)
    s.send(out, "release")
    assert gpu.direct_launches == {}  # nothing keeps the released buffer's memory alive
    pipeline = s.dev.object(s.pipelines["add1"])
    assert not gpu._direct_by_object.get(pipeline)  # nor the pipeline's index of its launches


def test_set_bytes_into_a_constant_parameter_is_kept_by_its_content(scene: Scene,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    s = scene
    out = s.buffer(16)
    prepared = _counting(monkeypatch)
    for k in (2.0, 2.0, 2.0, 5.0):
        _direct(s, "addk", out, np.float32(k).tobytes())
    assert s.floats(out)[:4].tolist() == [11.0] * 4  # 2 + 2 + 2 + 5: the new value is seen
    assert prepared == [False, True, False]


def test_set_bytes_into_a_device_parameter_is_fresh_at_every_run(scene: Scene) -> None:
    """The kernel writes its setBytes copy: a reused launch would see the value it wrote the run before."""
    s = scene
    out = s.buffer(16)
    for _ in range(3):
        _direct(s, "bump", out, np.ones(4, np.float32).tobytes())
    assert s.floats(out)[:4].tolist() == [3.0] * 4


def test_a_wait_blocks_until_the_command_buffer_ends(scene: Scene) -> None:
    s = scene
    out = s.buffer(16)
    cb = _direct(s, "add1", out, wait=False)
    assert s.dev.wait_command_buffers([cb], 5.0)
    assert s.status(cb) == MTL.StatusCompleted and s.floats(out)[:4].tolist() == [1.0] * 4
    assert s.dev.wait_command_buffers([cb], 0.0)  # ended already: at once


def test_a_wait_for_a_command_buffer_that_never_runs_times_out() -> None:
    s = Scene(strict=False, autorun=False)  # the GPU held: nothing runs
    try:
        cb = _direct(s, "add1", s.buffer(16), wait=False)
        assert not s.dev.wait_command_buffers([cb], 0.05)
        s.dev.run_until_idle()
        assert s.status(cb) == MTL.StatusCompleted and s.dev.wait_command_buffers([cb], 0.0)
    finally:
        s.close()


def test_a_command_buffer_syncs_once_after_its_kernels(scene: Scene, monkeypatch: pytest.MonkeyPatch,
                                                       runner: KernelRunner) -> None:
    s = scene
    out = s.buffer(16)
    _direct(s, "add1", out)
    syncs: list[int] = []
    real = KernelRunner.sync

    def counting(self: KernelRunner) -> None:
        syncs.append(1)
        real(self)
    monkeypatch.setattr(KernelRunner, "sync", counting)
    cb = s.send(s.queue, "commandBuffer")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "setComputePipelineState:", s.pipelines["add1"])
    s.send(enc, "setBuffer:offset:atIndex:", out, 0, 0)
    s.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (4, 1, 1))
    s.send(enc, "endEncoding")
    s.send(cb, "encodeSignalEvent:value:", s.event, 1)
    s.send(cb, "commit")
    s.send(cb, "waitUntilCompleted")
    # the start (nothing ran since the last command buffer's end), the signal (the kernel ran: synced, so a
    # waiter on the event sees its results) and the end (nothing ran since the signal): one sync
    assert len(syncs) == 1
    assert s.floats(out)[:4].tolist() == [2.0] * 4


def test_on_a_device_with_its_own_memory_the_results_come_back_with_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies back of what the kernels wrote ride on the batch's wait: the sync after it finds nothing to copy
    (one round trip to the device fewer), and the host reads the results."""
    copies = KernelRunner(in_host_memory=False)
    s = Scene(strict=False, runner=copies, autorun=True)
    try:
        s.lib = s.send(s.device, "newLibraryWithSource:options:error:", s.m.string(MSL), 0, s.err)
        s.pipelines = {k: s.pipeline(k) for k in ("add1", "addk", "bump")}
        out = s.buffer(16)
        left: list[int] = []
        real = KernelRunner._sync_locked

        def counting(self: KernelRunner) -> None:
            left.append(sum(1 for e in self._buffers.values() if e.dirty and not e.in_place))
            real(self)
        monkeypatch.setattr(KernelRunner, "_sync_locked", counting)
        for round_ in (1, 2, 3):
            _direct(s, "add1", out)
            assert s.floats(out)[:4].tolist() == [float(round_)] * 4
        assert left and not any(left)
        # through a page-locked mirror of the buffer (a DMA the wait covers), then into the host array
        assert [m.nbytes for m in copies._mirrors.values()] == [16]
        s.dev.write(s.contents(out), np.full(4, 10.0, np.float32).tobytes())  # the host writes: copied in again
        _direct(s, "add1", out)
        assert s.floats(out)[:4].tolist() == [11.0] * 4
    finally:
        s.close()
