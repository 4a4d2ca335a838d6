"""The checks of one dispatch before its kernel runs, and what a compiled kernel binds.

``kernel_params`` and ``elem_size``: each parameter's buffer index, kind and alignment (a pipeline state keeps them,
``methods.resources``). ``sizes_ok``: the dispatch's sizes against Metal's limits (rule 13; a wrapped grid is a
Timeout). ``bound_storage``: each parameter's (storage, byte offset) from what was bound, faulting on an unbound index,
a buffer not resident (rule 10) or released (rule 14). ``concurrent_order``: the order the GPU runs an ICB range's
commands (rule 9). The faults are ``GPUFault`` (``faults``); METAL.md §3 gives the rules.
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL
from mtlir.runtime.sim.faults import GPUFault
from mtlir.runtime.sim.objects import ICB, Binding, Buffer, Pipeline
from mtlir.runtime.sim.rules.checks import size_problem
from mtlir.runtime.sim.rules.rule import Rule

__all__ = ["elem_size", "kernel_params", "concurrent_order", "sizes_ok", "bound_storage", "buffer_storage"]


def elem_size(dtype: Any) -> int:
    """Bytes per element of a kernel parameter's dtype (a DType, a numpy dtype, or a name such as ``"float32"``,
    ``"float"``, ``"dtypes.float"``); 1 when unknown (no alignment is then required)."""
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int) and size > 0:
        return size
    name = str(dtype).removeprefix("dtypes.").removeprefix("const ").strip().rstrip("*").strip()
    name = re.sub(r"^([a-z]+\d*)x\d+$", r"\1", name)  # a vector (float32x4): its scalar's size
    c_names = {"float": 4, "half": 2, "int": 4, "uint": 4, "short": 2, "ushort": 2, "char": 1, "uchar": 1,
               "long": 8, "ulong": 8, "double": 8, "bool": 1}
    if name in c_names:
        return c_names[name]
    try:
        return dtypes.by_name(name).itemsize or 1
    except KeyError:
        pass
    try:
        return int(np.dtype(name).itemsize)
    except TypeError:
        return 1


def kernel_params(kernel: Any) -> list[tuple[int, str, int]]:
    """``(buffer index, kind "buffer"|"constant", alignment in bytes)`` of each parameter a compiled kernel
    binds: the translator's own alignment when it reports one (``info.bindings``), else the element size."""
    aligns = {int(b.arg.index): int(b.align) for b in getattr(getattr(kernel, "info", None), "bindings", ())}
    return [(int(p.index), str(p.kind), aligns.get(int(p.index)) or elem_size(p.dtype))
            for p in getattr(kernel, "params", ())]


def concurrent_order(icb: ICB, first: int, count: int, seed: int | None = None) -> list[int]:
    """The order the GPU runs commands ``[first, first + count)``: groups split where a command has setBarrier
    (it waits for everything before it), each group run in an adversarial order (rule 9: exposes races): last
    command first when ``seed`` is None, else shuffled by a generator seeded from ``seed`` and the group's first
    command (the same seed gives the same order at every run, so a failure replays)."""
    order: list[int] = []
    group: list[int] = []
    slots = icb.slots
    for i in range(first, first + count + 1):
        slot = slots.get(i) if i < first + count else None
        if slot is None and i < first + count:
            continue  # never written: an empty command
        if group and (slot is None or slot.barrier):
            if seed is None:
                group.reverse()
            else:
                random.Random(seed * 1_000_003 + group[0]).shuffle(group)
            order += group
            group = []
        if slot is not None:
            group.append(i)
    return order


def sizes_ok(p: Pipeline, grid: tuple[int, int, int], threadgroup: tuple[int, int, int], what: str) -> bool:
    """The dispatch's sizes against Metal's limits (``checks.size_problem``) before anything reaches the
    kernel runner: False for a dispatch Metal drops (rule 13); a grid of 2**32 threads or more on an axis
    raises ``GPUFault`` Timeout (2) — the modelling choice of docs/simulator.md: the hardware would run
    billions of threadgroups until the GPU watchdog ends the command buffer."""
    problem = size_problem(grid, threadgroup, p)
    if problem is None:
        return True
    if problem[0] is Rule.THREADGROUP_LIMIT:
        return False  # silently dropped
    raise GPUFault(MTL.ErrorTimeout, f"{what}: {problem[1]}; the GPU watchdog ends the command buffer")


def bound_storage(p: Pipeline, bound: Mapping[int, Binding | bytes], what: str, rule: Rule | None,
                  resident: Callable[[Buffer], bool] | None = None) -> dict[int, tuple[np.ndarray, int]]:
    """Each parameter of ``p`` as (storage, byte offset) from what the encoder or ICB command ``bound`` (a
    direct dispatch's ``setBytes`` come as bytes). Faults: an unbound index (PageFault, ``rule``), a buffer
    ``resident`` says no to (InvalidResource, rule 10), a released buffer (rule 14)."""
    out: dict[int, tuple[np.ndarray, int]] = {}
    for index, kind, size in p.params:
        b = bound.get(index)
        if b is None:
            raise GPUFault(MTL.ErrorPageFault, f"{what}: buffer index {index} is not bound (the kernel reads "
                                               "address 0)", rule)
        if isinstance(b, bytes):
            out[index] = (np.frombuffer(bytearray(b), dtype=np.uint8), 0)
            continue
        if resident is not None and b[0].alive and not resident(b[0]):
            raise GPUFault(MTL.ErrorInvalidResource, f"{what} reaches {b[0].describe()}, which is not "
                                                     "resident", Rule.RESIDENCY)
        out[index] = buffer_storage(b, kind, size, f"{what} buffer index {index}")
    return out


def buffer_storage(binding: Binding, kind: str, size: int, what: str) -> tuple[np.ndarray, int]:
    """One bound buffer as (storage, byte offset): a released one faults (InvalidResource, rule 14); a device
    pointer's offset misaligned for its element ``size`` (bytes) loses its low bits (rule 8)."""
    buf, offset = binding
    if not buf.alive:
        raise GPUFault(MTL.ErrorInvalidResource, f"{what}: {buf.describe()} was released (an indirect command "
                                                 "buffer does not retain the buffers its commands bind)",
                       Rule.FREED_IN_FLIGHT)
    if kind != "constant" and offset % size:
        offset -= offset % size  # a misaligned device pointer: the low address bits are dropped (rule 8)
    return buf.storage, offset
