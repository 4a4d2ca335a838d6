"""The tinygrad device: loaded as ``tinygrad.runtime.ops_metal`` (``mtlir.tinygrad.register``), so the device keeps
the name METAL and tinygrad's unmodified ``MetalRenderer`` writes the kernels (MSL). Every kernel runs through
mtlir's lowering on a ``DeviceContext`` (mtlir.runtime.context) of the simulated Metal device, or of any Bridge.

- ``MetalDevice``: one ``DeviceContext``; ``synchronize`` waits for every submit.
- ``MetalAllocator``: ``DeviceContext.alloc`` / ``free`` / ``read`` / ``write``; a view is the same buffer at a byte
  offset (``MetalBuffer``).
- ``MetalCompiler``: the "library" is the MSL itself (the simulated device compiles MSL: its translator and OpenCL).
- ``MetalProgram``: an eager call is one submit of a one-dispatch Program, lowered once per (view sizes,
  threadgroup size) and replayed with the buffers, their byte offsets, the ``constant`` values and the grid as
  run-time variables.
- TinyJit batches: ``mtlir.tinygrad.graph.MtlirGraph`` (one ICB submit per call).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Protocol

from tinygrad.device import BufferSpec, Compiled, Compiler, LRUAllocator, Program, TinyELF
from tinygrad.device import CompileError as TinygradCompileError
from tinygrad.helpers import prod
from tinygrad.renderer.cstyle import MetalRenderer

from mtlir.errors import MtlirError
from mtlir.metal import DeviceSpec, Kernel
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.context import DeviceBuffer, DeviceContext, SessionRing
from mtlir.tinygrad.batch import Arg, Batch, Dispatch, kernel_of, variable_bounds
from mtlir.tinygrad.settings import SETTINGS

__all__ = ["MetalDevice", "MetalAllocator", "MetalCompiler", "MetalProgram", "MetalBuffer", "CompileError"]

# the recording hook (mtlir.tinygrad.record): every Recorder here sees each eager kernel call before its submit,
# each host write into a buffer, each buffer tinygrad allocates or takes back from its LRU cache, and each buffer
# tinygrad frees (into that cache: it may come back as another Tensor's); empty (no cost but the loop) when nothing
# records
class Recorder(Protocol):
    def alloc(self, opaque: MetalBuffer) -> None: ...

    def dispatch(self, prog: MetalProgram, bufs: tuple[MetalBuffer, ...], global_size: tuple[int, ...],
                 local_size: tuple[int, ...], vals: tuple[int | None, ...]) -> None: ...

    def copyin(self, dest: MetalBuffer) -> None: ...

    def free(self, opaque: MetalBuffer) -> None: ...


RECORDERS: list[Recorder] = []

_MAX_THREADS = 2**32 - 1  # MSL thread positions are 32-bit: grid x threadgroup per axis stays below


class CompileError(MtlirError, TinygradCompileError):
    """Kept for tinygrad code that imports it from ops_metal: a ``tinygrad.device.CompileError`` (what tinygrad
    catches) and an ``MtlirError``."""


@dataclass(frozen=True)
class MetalBuffer:
    """tinygrad's opaque buffer: a ``DeviceBuffer`` of the context, a view of ``size`` bytes from byte ``offset``."""

    buf: DeviceBuffer
    size: int
    offset: int = 0


def _bridge() -> Bridge:
    if SETTINGS.bridge is not None:
        return SETTINGS.bridge()
    from mtlir.runtime.sim.device import SimDevice
    # the kernel watchdog at the waits' timeout: a kernel running that long ends its command buffer in Error,
    # Timeout, naming the kernel, where the wait would have timed out, and a wait may then run the GPU's steps on
    # its own thread (SimDevice.wait_command_buffers: no thread hand-off per submit)
    return SimDevice(SETTINGS.target, family=SETTINGS.family, strict=SETTINGS.strict,
                     timeout_s=SETTINGS.timeout_s, gpu_timeout_s=SETTINGS.timeout_s,
                     kernel_timeout_s=SETTINGS.timeout_s)


class MetalDevice(Compiled):
    """tinygrad's METAL device on mtlir: ``ctx`` is the ``DeviceContext`` (``SETTINGS``: family, target, strict)."""

    def __init__(self, device: str) -> None:
        self.bridge = _bridge()
        spec = DeviceSpec(SETTINGS.family, residency_set=SETTINGS.residency_set, icb=True)
        self.ctx = DeviceContext(self.bridge, name=device, spec=spec, timeout_s=SETTINGS.timeout_s)
        self.spec, self.target = spec, self.bridge.target
        self.eager_calls = 0
        from mtlir.tinygrad.graph import MtlirGraph
        super().__init__(device, MetalAllocator(self), [MetalRenderer], MetalProgram, MtlirGraph, arch=spec.family)

    def synchronize(self) -> None:
        self.ctx.synchronize()

    def finalize(self) -> None:
        try:
            self.ctx.close()
        finally:
            close = getattr(self.bridge, "close", None)
            if close is not None:
                close()


class MetalCompiler(Compiler):
    """The library of a program is its MSL source (the simulated device compiles MSL); MSL the translator refuses
    fails when the program is first called, naming the kernel (``UnsupportedKernelError``)."""

    def __init__(self) -> None:
        super().__init__(None)

    def compile(self, src: str) -> bytes:
        return src.encode()


class MetalProgram(Program["MetalDevice"]):
    """One tinygrad program: its mtlir ``Kernel`` and, per (view sizes, threadgroup), a one-dispatch Program linked
    as a ring of two Sessions of the device's context (``DeviceContext.ring``: calls without a wait in between
    patch one while the other runs). ``__call__`` submits it with the buffers, their byte offsets, the ``constant``
    values and the grid as run-time variables; with ``wait`` it waits and returns the GPU seconds."""

    def __init__(self, dev: MetalDevice, obj: TinyELF) -> None:
        self.dev, self.name = dev, obj.name
        self.kernel: Kernel = kernel_of(obj.name, obj.lib.decode())
        self.nbufs = sum(1 for p in self.kernel.params if p.var is None)
        self.sessions: dict[tuple[Any, ...], SessionRing] = {}
        self.max_total_threads = 1024
        self.last_launch: tuple[tuple[int, ...], tuple[int, ...]] = ((1, 1, 1), (1, 1, 1))
        # the run-time variables' names, made once (an eager call costs a few µs of Python per dict it builds)
        self._bnames = tuple((f"b{i}", f"b{i}_off") for i in range(self.nbufs))
        self._vnames = tuple(f"v{i}" for i in range(len(self.kernel.params) - self.nbufs))

    def dispatch(self, bufs: tuple[MetalBuffer, ...], local: tuple[int, int, int], slots: list[str],
                 values: list[str], grid: tuple[str, str, str] | tuple[int, int, int]) -> Dispatch:
        """The Dispatch of this program over ``bufs`` (bound to the buffer variables ``slots``, each at the byte
        offset of the variable ``<slot>_off``), its constant parameters the variables ``values`` and ``grid`` (names
        or sizes)."""
        args = tuple(Arg(s, 0, b.buf.nbytes, f"{s}_off", b.size) for s, b in zip(slots, bufs))
        return Dispatch(self.kernel, args, tuple(values), grid, local)

    def _session(self, bufs: tuple[MetalBuffer, ...], local: tuple[int, int, int]) -> SessionRing:
        key = (tuple([b.size for b in bufs]), local)
        s = self.sessions.get(key)
        if s is None:
            if prod(local) > self.max_total_threads:  # checked once per threadgroup size: it is in the key
                raise RuntimeError(f"local size {local} bigger than {self.max_total_threads}")
            if min(local) < 1:
                raise RuntimeError(f"local size {local}: a threadgroup has at least 1 thread on each axis")
            nvars = len(self.kernel.params) - self.nbufs
            batch = Batch([self.dispatch(bufs, local, [f"b{i}" for i in range(len(bufs))],
                                         [f"v{i}" for i in range(nvars)], ("gx", "gy", "gz"))],
                          {**{f"v{i}": b for i, b in enumerate(variable_bounds(self.kernel))},
                           **{g: (1, _MAX_THREADS // t) for g, t in zip(("gx", "gy", "gz"), local)}})
            s = self.sessions[key] = self.dev.ctx.ring(batch.lower(self.dev.spec, self.dev.target), 2)
        return s

    def __call__(self, *bufs: MetalBuffer, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = (1, 1, 1), vals: tuple[int | None, ...] = (),
                 wait: bool = False, **kw: Any) -> float | None:
        local = tuple(local_size or (1, 1, 1))
        s = self._session(bufs, (int(local[0]), int(local[1]), int(local[2])))
        gx, gy, gz = global_size
        grid = (int(gx), int(gy), int(gz))
        self.last_launch = (grid, local)
        if RECORDERS:
            for rec in RECORDERS:
                rec.dispatch(self, bufs, tuple(global_size), local, tuple(vals))
        values: dict[str, Any] = {"gx": grid[0], "gy": grid[1], "gz": grid[2]}
        for (name, off), b in zip(self._bnames, bufs):
            values[name], values[off] = b.buf.handle, b.offset
        for name, v in zip(self._vnames, vals):
            values[name] = int(v or 0)
        t0 = time.perf_counter()
        sub = s.submit(**values)
        self.dev.eager_calls += 1
        if not wait:
            return None
        s.wait(timeout_s=SETTINGS.timeout_s)
        ns = sub.gpu_ns
        return ns / 1e9 if ns is not None else time.perf_counter() - t0


class MetalAllocator(LRUAllocator[MetalDevice]):
    """Buffers of the device's ``DeviceContext``: shared storage, resident for every Program."""

    def _alloc(self, size: int, options: BufferSpec) -> MetalBuffer:
        if options.external_ptr:
            raise RuntimeError("mtlir's METAL device cannot wrap an external pointer")
        return MetalBuffer(self.dev.ctx.alloc(max(int(size), 1)), int(size))

    def alloc(self, size: int, options: BufferSpec | None = None) -> MetalBuffer:
        opaque: MetalBuffer = super().alloc(size, options)
        for rec in RECORDERS:
            rec.alloc(opaque)
        return opaque

    def free(self, opaque: MetalBuffer, size: int, options: BufferSpec | None = None) -> None:
        for rec in RECORDERS:
            rec.free(opaque)
        super().free(opaque, size, options)

    def _free(self, opaque: MetalBuffer, options: BufferSpec) -> None:
        if self.dev.ctx.closed or getattr(self.dev.bridge, "closed", False):  # closed: nothing to free any more
            return
        self.dev.ctx.synchronize()  # a buffer freed while a submit uses it faults (METAL.md §3 rule 14)
        self.dev.ctx.free(opaque.buf)

    def _copyin(self, dest: MetalBuffer, src: memoryview) -> None:
        for rec in RECORDERS:
            rec.copyin(dest)
        self.dev.ctx.synchronize()
        self.dev.ctx.write(dest.buf, src.cast("B"), dest.offset)

    def _copyout(self, dest: memoryview, src: MetalBuffer) -> None:
        self.dev.ctx.synchronize()
        dest.cast("B")[:] = self.dev.ctx.read(src.buf, src.offset, src.size)

    def _offset(self, buf: MetalBuffer, size: int, offset: int) -> MetalBuffer:
        return MetalBuffer(buf.buf, size, offset)


@functools.cache
def to_ns_str(s: str) -> str:
    """tinygrad's graph module imports it; mtlir has no NSString to make here."""
    return s
