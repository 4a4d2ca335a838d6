"""PyKernelRunner: a kernel runner whose kernels are Python functions over numpy views, for tests that need the
simulated device without OpenCL (the interface of ``mtlir.runtime.sim.kernels.runner.KernelRunner``).

A ``PyKernel`` names the MSL function it stands for, its parameters (``PyKernelArg``: name, kind ``"buffer"`` or
``"constant"``, Metal buffer index, dtype) and ``fn(args, grid, threadgroup)``: ``args`` maps buffer index to a
numpy view of the bound bytes from the binding's offset to the end of the buffer, typed with the parameter's
dtype (``constant int&`` parameters as a one-element int32 view). ``compile(msl, function)`` returns the kernel
registered under ``function`` when the MSL defines a kernel of that name, else raises ``KernelCompileError``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtlir.errors import KernelCompileError

__all__ = ["PyKernelArg", "PyKernel", "PyKernelRunner"]


@dataclass(frozen=True)
class PyKernelArg:
    """One kernel parameter: ``name``, ``kind`` (``"buffer"`` for ``device T*``, ``"constant"`` for
    ``constant T&``), Metal buffer ``index``, element ``dtype`` (a numpy dtype name such as ``"float32"``)."""

    name: str
    kind: str
    index: int
    dtype: str = "float32"


@dataclass
class PyKernel:
    """A kernel implemented in Python: ``fn(args, grid, threadgroup)`` with ``args`` index -> typed numpy view;
    ``grid`` counts threadgroups and ``threadgroup`` threads, per axis (Metal's dispatchThreadgroups)."""

    function: str
    params: tuple[PyKernelArg, ...]
    fn: Callable[[dict[int, np.ndarray], tuple[int, int, int], tuple[int, int, int]], None]
    runs: list[tuple[tuple[int, int, int], tuple[int, int, int]]] = field(default_factory=list)

    def run(self, bindings: dict[int, tuple[np.ndarray, int]], grid: tuple[int, int, int],
            threadgroup: tuple[int, int, int], *, timeout_s: float | None = None, keep: bool = False) -> None:
        """Run once: ``bindings`` maps buffer index -> (whole buffer uint8 storage, byte offset). ``keep`` changes
        nothing: a Python kernel works in the host arrays themselves; nor does ``timeout_s`` (the GPU watchdog's
        limit for an OpenCL kernel): a Python kernel runs on the calling thread to its end. Raises ``KeyError`` for an unbound
        parameter."""
        args: dict[int, np.ndarray] = {}
        for p in self.params:
            storage, offset = bindings[p.index]
            dt = np.dtype(p.dtype)
            n = (len(storage) - offset) // dt.itemsize
            args[p.index] = storage[offset:offset + n * dt.itemsize].view(dt)
        self.runs.append((tuple(grid), tuple(threadgroup)))  # type: ignore[arg-type]
        self.fn(args, grid, threadgroup)


class PyKernelRunner:
    """Compiles by name lookup: ``PyKernelRunner([kernel, ...])``; ``compiled`` counts ``compile`` calls."""

    def __init__(self, kernels: list[PyKernel] | tuple[PyKernel, ...] = ()) -> None:
        self.kernels = {k.function: k for k in kernels}
        self.compiled = 0

    def compile(self, msl: str, function: str) -> Any:
        """The kernel registered as ``function``; ``KernelCompileError`` when the MSL has a ``#error`` line or
        no kernel registered under that name."""
        self.compiled += 1
        if "#error" in msl:
            raise KernelCompileError(f"program_source: error: {msl.split('#error', 1)[1].splitlines()[0].strip()}")
        kernel = self.kernels.get(function)
        if kernel is None:
            raise KernelCompileError(f"no Python kernel registered for function {function!r}")
        return kernel

    def sync(self) -> None:
        """Nothing to copy back: Python kernels work in the host arrays (``KernelRunner.sync``)."""
