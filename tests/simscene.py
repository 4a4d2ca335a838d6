"""Helpers of the simulated-device tests (no tests here): a Scene that builds the objects of METAL.md §1 through
the Bridge, with Python kernels (``PyKernelRunner``) so the rules can be broken without OpenCL."""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.kernels.pyrunner import PyKernel, PyKernelArg, PyKernelRunner
from mtlir.runtime.bridge.messenger import Messenger

MSL = """
kernel void fill(device float* out, constant int& value, uint3 gid [[threadgroup_position_in_grid]]) {}
kernel void add1(device float* data, uint3 gid [[threadgroup_position_in_grid]]) {}
kernel void copy(device float* dst, device float* src, uint3 gid [[threadgroup_position_in_grid]]) {}
"""


def _threads(grid: tuple[int, int, int], tg: tuple[int, int, int]) -> int:
    return math.prod(grid) * math.prod(tg)


def _fill(a: dict[int, np.ndarray], grid: tuple[int, int, int], tg: tuple[int, int, int]) -> None:
    a[0][:_threads(grid, tg)] = a[1][0]


def _add1(a: dict[int, np.ndarray], grid: tuple[int, int, int], tg: tuple[int, int, int]) -> None:
    a[0][:_threads(grid, tg)] += 1


def _copy(a: dict[int, np.ndarray], grid: tuple[int, int, int], tg: tuple[int, int, int]) -> None:
    n = _threads(grid, tg)
    a[0][:n] = a[1][:n]


def make_runner() -> PyKernelRunner:
    """Python stand-ins for three kernels: fill(out, value), add1(data), copy(dst, src); one thread per element."""
    buf, const = "buffer", "constant"
    return PyKernelRunner([
        PyKernel("fill", (PyKernelArg("out", buf, 0), PyKernelArg("value", const, 1, "int32")), _fill),
        PyKernel("add1", (PyKernelArg("data", buf, 0),), _add1),
        PyKernel("copy", (PyKernelArg("dst", buf, 0), PyKernelArg("src", buf, 1)), _copy),
    ])


class Scene:
    """A device with a queue, an event, a fence and the three pipelines, built through the Bridge. GPU held
    (``autorun=False``) unless asked; short timeouts so a broken rule never slows the suite."""

    def __init__(self, strict: bool = True, *, target: str = "x86_64", family: str = "Apple9",
                 autorun: bool = False, max_cbs: int = 8, runner: Any = None, **kw: Any) -> None:
        kw.setdefault("timeout_s", 2.0)
        kw.setdefault("gpu_timeout_s", 0.2)
        self.dev = SimDevice(target, strict=strict, family=family, autorun=autorun,
                             kernel_runner=runner or make_runner(), **kw)
        m = self.m = Messenger(self.dev)
        self.device = m.device()
        self.queue = m.send(self.device, "newCommandQueueWithMaxCommandBufferCount:", max_cbs)
        self.event = m.send(self.device, "newSharedEvent")
        self.fence = m.send(self.device, "newFence")
        self.err = self.dev.malloc(8)
        self.lib = m.send(self.device, "newLibraryWithSource:options:error:", m.string(MSL), 0, self.err)
        self.pipelines = {name: self.pipeline(name) for name in ("fill", "add1", "copy")}

    def close(self) -> None:
        self.dev.close()

    def send(self, receiver: int, selector: str, *args: Any) -> Any:
        return self.m.send(receiver, selector, *args)

    def pipeline(self, name: str, support_icb: bool = True) -> int:
        m = self.m
        fn = m.send(self.lib, "newFunctionWithName:", m.string(name))
        desc = m.send(m.cls("MTLComputePipelineDescriptor"), "new")
        m.send(desc, "setComputeFunction:", fn)
        m.send(desc, "setSupportIndirectCommandBuffers:", support_icb)
        return int(m.send(self.device, "newComputePipelineStateWithDescriptor:options:reflection:error:", desc, 0, 0,
                          self.err))

    def buffer(self, nbytes: int = 256) -> int:
        return int(self.send(self.device, "newBufferWithLength:options:", nbytes, MTL.ResourceStorageModeShared))

    def contents(self, buf: int) -> int:
        return int(self.send(buf, "contents"))

    def floats(self, buf: int) -> np.ndarray:
        return self.dev.buffer_bytes(buf).view(np.float32)

    def set_int(self, buf: int, offset: int, value: int) -> None:
        self.dev.store(self.contents(buf) + offset, dtypes.int32, value)

    def icb(self, count: int, max_bind: int = 4) -> int:
        m = self.m
        desc = m.send(m.cls("MTLIndirectCommandBufferDescriptor"), "new")
        m.send(desc, "setCommandTypes:", MTL.IndirectCommandTypeConcurrentDispatch)
        m.send(desc, "setInheritBuffers:", False)
        m.send(desc, "setInheritPipelineState:", False)
        m.send(desc, "setMaxKernelBufferBindCount:", max_bind)
        return int(m.send(self.device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", desc, count,
                          0))

    def command(self, icb: int, index: int, kernel: str | None, bindings: list[tuple[int, int]],
                grid: tuple[int, int, int] = (1, 1, 1), tg: tuple[int, int, int] = (4, 1, 1),
                barrier: bool = True) -> int:
        """Program ICB command ``index`` (pipeline, buffers at indices 0.., sizes, barrier); the command, retained."""
        cmd = self.send(icb, "indirectComputeCommandAtIndex:", index)
        self.send(cmd, "retain")
        if kernel is not None:
            self.send(cmd, "setComputePipelineState:", self.pipelines[kernel])
        for i, (buf, off) in enumerate(bindings):
            self.send(cmd, "setKernelBuffer:offset:atIndex:", buf, off, i)
        self.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", grid, tg)
        if barrier:
            self.send(cmd, "setBarrier")
        return int(cmd)

    def residency(self, *resources: int) -> int:
        m = self.m
        desc = m.send(m.cls("MTLResidencySetDescriptor"), "new")
        rs = m.send(self.device, "newResidencySetWithDescriptor:error:", desc, self.err)
        for r in resources:
            m.send(rs, "addAllocation:", r)
        m.send(rs, "commit")
        m.send(self.queue, "addResidencySet:", rs)
        return int(rs)

    def resources(self, *handles: int) -> int:
        arr = self.dev.malloc(8 * max(1, len(handles)))
        for k, h in enumerate(handles):
            self.dev.store(arr + 8 * k, dtypes.id, h)
        return arr

    def encode_icb(self, cb: int, icb: int, first: int, count: int, use: tuple[int, ...] = (),
                   warmup: tuple[str, ...] = (), fence: bool = False) -> int:
        """One compute encoder on ``cb`` as METAL.md §1 steps 2-9 (optional fence, useResources, warm-up)."""
        enc = self.send(cb, "computeCommandEncoder")
        if fence:
            self.send(enc, "waitForFence:", self.fence)
        if use:
            self.send(enc, "useResources:count:usage:", self.resources(*use), len(use), 3)
        for name in warmup:
            self.send(enc, "setComputePipelineState:", self.pipelines[name])
            self.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (0, 0, 0), (0, 0, 0))
        self.send(enc, "executeCommandsInBuffer:withRange:", icb, (first, count))
        if fence:
            self.send(enc, "updateFence:", self.fence)
        self.send(enc, "endEncoding")
        return int(enc)

    def submit_icb(self, icb: int, first: int, count: int, *, use: tuple[int, ...] = (),
                   warmup: tuple[str, ...] = (), signal: int | None = None, commit: bool = True) -> int:
        """commandBuffer (retained) + one encoder + optional signal + commit; the command buffer."""
        cb = self.send(self.queue, "commandBuffer")
        self.send(cb, "retain")
        self.encode_icb(cb, icb, first, count, use, warmup)
        if signal is not None:
            self.send(cb, "encodeSignalEvent:value:", self.event, signal)
        if commit:
            self.send(cb, "commit")
        return int(cb)

    def status(self, cb: int) -> int:
        return int(self.send(cb, "status"))

    def error_code(self, cb: int) -> int:
        err = self.send(cb, "error")
        return 0 if err == 0 else int(self.send(err, "code"))

    def error_text(self, cb: int) -> str:
        err = self.send(cb, "error")
        text = self.send(err, "localizedDescription")
        return self.dev.read_cstring(self.send(text, "UTF8String"))


# ---- for the rule tests: each test in both modes, its Scenes closed after it

MODES = [pytest.param(True, id="strict"), pytest.param(False, id="faithful")]


@pytest.fixture
def scenes() -> Iterator[list[Scene]]:
    """The Scenes a test makes with ``scene``, closed after the test (import the fixture into the test module)."""
    made: list[Scene] = []
    yield made
    for s in made:
        s.close()


def scene(scenes: list[Scene], strict: bool = True, **kw: object) -> Scene:
    """A Scene in strict or faithful mode that the ``scenes`` fixture closes after the test."""
    s = Scene(strict, **kw)  # type: ignore[arg-type]
    scenes.append(s)
    return s

