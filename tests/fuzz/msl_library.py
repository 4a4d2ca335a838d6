"""The kernel library of the differential fuzzing: small MSL kernels over int32 elements, each with its numpy meaning.

Every kernel takes its output buffer first, then its inputs, then ``constant int& n`` (the elements it works on) and
runs as ``ceil(n / 32)`` threadgroups of 32 threads (``GROUP``). Integers, so the numpy meaning is exact (wrapping
int32 arithmetic) and any difference is a real one, never a rounding.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mtlir.metal import Kernel, KernelParam

GROUP = 32  # threads per threadgroup of every kernel (one SIMD group)

_HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
_POS = "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]"

ELEMENTWISE = _HEAD + f"""kernel void ew(device int* out, const device int* a, constant int& n, {_POS}) {{
  int i = gid.x * 32 + lid.x;
  if (i < n) out[i] = a[i] * 3 + 1;
}}
"""

# one partial sum per threadgroup, a tree in threadgroup memory
TG_SUM = _HEAD + f"""kernel void tgsum(device int* out, const device int* a, constant int& n, {_POS}) {{
  threadgroup int part[32];
  int i = gid.x * 32 + lid.x;
  part[lid.x] = i < n ? a[i] : 0;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint s = 16; s > 0; s >>= 1) {{
    if (lid.x < s) part[lid.x] += part[lid.x + s];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }}
  if (lid.x == 0) out[gid.x] = part[0];
}}
"""

# out[i] = a[idx[i] mod m]: m the elements of a
GATHER = _HEAD + f"""kernel void gather(device int* out, const device int* a, const device int* idx, constant int& n,
                   constant int& m, {_POS}) {{
  int i = gid.x * 32 + lid.x;
  if (i < n) out[i] = a[(uint)idx[i] % (uint)m];
}}
"""

# every thread writes its own element, reversed: disjoint ranges of out
SCATTER = _HEAD + f"""kernel void scatter(device int* out, const device int* a, constant int& n, {_POS}) {{
  int i = gid.x * 32 + lid.x;
  if (i < n) out[n - 1 - i] = a[i] - i;
}}
"""

# one sum per SIMD group (32 lanes) with simd_sum
SIMD_SUM = _HEAD + f"""kernel void simdsum(device int* out, const device int* a, constant int& n, {_POS},
                    uint lane [[thread_index_in_simdgroup]]) {{
  int i = gid.x * 32 + lid.x;
  int s = simd_sum(i < n ? a[i] : 0);
  if (lane == 0) out[gid.x] = s;
}}
"""


def _ew(out: np.ndarray, ins: list[np.ndarray], n: int, m: int) -> None:
    out[:n] = ins[0][:n] * np.int32(3) + np.int32(1)


def _sums(out: np.ndarray, ins: list[np.ndarray], n: int, m: int) -> None:
    a = np.zeros(-(-n // GROUP) * GROUP, np.int32)
    a[:n] = ins[0][:n]
    out[:len(a) // GROUP] = a.reshape(-1, GROUP).sum(axis=1, dtype=np.int32)


def _gather(out: np.ndarray, ins: list[np.ndarray], n: int, m: int) -> None:
    out[:n] = ins[0][ins[1][:n].view(np.uint32) % np.uint32(m)]


def _scatter(out: np.ndarray, ins: list[np.ndarray], n: int, m: int) -> None:
    out[n - 1::-1] = ins[0][:n] - np.arange(n, dtype=np.int32)


@dataclass(frozen=True)
class LibKernel:
    """One kernel of the library: the ``Kernel`` mtlir gets, ``inputs``: its input buffers, ``gathers``: it takes
    ``m`` (the elements of its first input) after ``n``, ``outs(n)``: the output elements it writes for ``n``
    elements, ``numpy``: its meaning, ``out[...] = f(inputs)`` in place on int32 arrays."""

    kernel: Kernel
    inputs: int
    gathers: bool
    reduces: bool
    numpy: Callable[[np.ndarray, list[np.ndarray], int, int], None]

    def outs(self, n: int) -> int:
        """Output elements written for ``n`` input elements."""
        return -(-n // GROUP) if self.reduces else n


def _kernel(key: str, msl: str, inputs: int, gathers: bool) -> Kernel:
    params = [KernelParam(None, j, "int32") for j in range(1 + inputs)]
    params.append(KernelParam("n", 1 + inputs, "int32"))
    if gathers:
        params.append(KernelParam("m", 2 + inputs, "int32"))
    return Kernel(key, key, msl, tuple(params))


LIBRARY: tuple[LibKernel, ...] = (
    LibKernel(_kernel("ew", ELEMENTWISE, 1, False), 1, False, False, _ew),
    LibKernel(_kernel("tgsum", TG_SUM, 1, False), 1, False, True, _sums),
    LibKernel(_kernel("gather", GATHER, 2, True), 2, True, False, _gather),
    LibKernel(_kernel("scatter", SCATTER, 1, False), 1, False, False, _scatter),
    LibKernel(_kernel("simdsum", SIMD_SUM, 1, False), 1, False, True, _sums),
)
