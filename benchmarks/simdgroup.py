"""What SIMD-group matrices cost on the simulated device: a matmul with simdgroup_multiply_accumulate against the
same matmul written as scalar loops.

    python -m benchmarks --only simdgroup            (docs/performance.md: how to run the package)

The simulated device has no SIMD groups: ``msl.simd`` exchanges each 8x8 multiply's A and B through threadgroup
memory between two barriers. Both kernels compute C = A B for N x N float32 matrices with the same threadgroups
(32 x 4 threads) and the same work per thread: each SIMD group owns an 8 x 32 block of C, each lane 8 of its
elements (its two elements of four 8x8 tiles). ``simdgroup`` steps k by 8 with ``simdgroup_load`` and four
``simdgroup_multiply_accumulate`` per step, the way tinygrad's and llama.cpp's Metal matmuls do; ``scalar``
computes the lane's 8 elements with a plain loop over k. A third kernel, ``wmma helper``, is tinygrad's own form
(the Apple9 traces'): a helper function ``__WMMA_8_8_8_float_float`` called in the kernel's loop, the elements
moved through ``thread_elements()``. ``simdgroup_figures`` returns, per size, the median time of each kernel over
at least 7 rounds (the kernels built and checked against numpy beforehand, taking turns in each round, CPU time of
the whole process, PoCL's worker threads included; a run is ``CompiledKernel.run``: its binding
and queue round trip included) and the ratio of each to ``scalar`` (``simdgroup_over_scalar``: the worst size;
the aim is at most 3x). Numbers are measured in this run only; nothing is compared with a stored value.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.timing import interleaved, ratio
from mtlir.runtime.sim.kernels.runner import KernelRunner

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
# each SIMD group (lane, sg): rows 8 * (by * 4 + sg) .. + 8 of C, columns 32 * bx .. + 32 (four 8x8 tiles)
SIMDGROUP = HEAD + """kernel void mm(device float* c, device const float* a, device const float* b, constant int& n,
                      uint2 g [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]]) {
  uint row = 8 * (g.y * 4 + sg), col = 32 * g.x;
  simdgroup_float8x8 acc[4];
  for (int j = 0; j < 4; j++) acc[j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  simdgroup_float8x8 ma, mb;
  for (int k = 0; k < n; k += 8) {
    simdgroup_load(ma, a, n, ulong2(k, row));
    for (int j = 0; j < 4; j++) {
      simdgroup_load(mb, b, n, ulong2(col + 8 * j, k));
      simdgroup_multiply_accumulate(acc[j], ma, mb, acc[j]);
    }
  }
  for (int j = 0; j < 4; j++) simdgroup_store(acc[j], c, n, ulong2(col + 8 * j, row));
}"""
# the same elements per lane, by the same layout (row r, columns c0, c0 + 1 of each tile), as scalar loops
SCALAR = HEAD + """kernel void mm(device float* c, device const float* a, device const float* b, constant int& n,
                      uint2 g [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
  uint row = 8 * (g.y * 4 + sg) + ((lane >> 1) & 3) + ((lane >> 2) & 4);
  uint col = 32 * g.x + ((lane & 1) << 1) + ((lane >> 1) & 4);
  float acc[8];
  for (int j = 0; j < 8; j++) acc[j] = 0.0f;
  for (int k = 0; k < n; k++) {
    float av = a[row * n + k];
    for (int j = 0; j < 4; j++) {
      acc[2 * j] += av * b[k * n + col + 8 * j];
      acc[2 * j + 1] += av * b[k * n + col + 8 * j + 1];
    }
  }
  for (int j = 0; j < 4; j++) { c[row * n + col + 8 * j] = acc[2 * j]; c[row * n + col + 8 * j + 1] = acc[2 * j + 1]; }
}"""
# tinygrad's form: the helper the Apple9 traces define, called four times per k step with the lane's elements
WMMA = HEAD + """float2 __WMMA_8_8_8_float_float(float2 a, float2 b, float2 c){
  simdgroup_float8x8 mat_a, mat_b; simdgroup_float8x8 mat_c;
  mat_a.thread_elements()[0] = a[0]; mat_b.thread_elements()[0] = b[0]; mat_c.thread_elements()[0] = c[0];
  mat_a.thread_elements()[1] = a[1]; mat_b.thread_elements()[1] = b[1]; mat_c.thread_elements()[1] = c[1];
  simdgroup_multiply_accumulate(mat_c, mat_a, mat_b, mat_c);
  return float2(mat_c.thread_elements()[0], mat_c.thread_elements()[1]);
}
kernel void mm(device float* c, device const float* a, device const float* b, constant int& n,
               uint2 g [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
               uint lane [[thread_index_in_simdgroup]]) {
  uint row = 8 * (g.y * 4 + sg) + ((lane >> 1) & 3) + ((lane >> 2) & 4);
  uint col = 32 * g.x + ((lane & 1) << 1) + ((lane >> 1) & 4);
  float2 acc[4];
  for (int j = 0; j < 4; j++) acc[j] = float2(0.0f);
  for (int k = 0; k < n; k += 8) {
    uint ka = k + ((lane & 1) << 1) + ((lane >> 1) & 4), kb = k + ((lane >> 1) & 3) + ((lane >> 2) & 4);
    float2 va = float2(a[row * n + ka], a[row * n + ka + 1]);
    for (int j = 0; j < 4; j++) {
      float2 vb = float2(b[kb * n + col + 8 * j], b[kb * n + col + 8 * j + 1]);
      acc[j] = __WMMA_8_8_8_float_float(va, vb, acc[j]);
    }
  }
  for (int j = 0; j < 4; j++) { c[row * n + col + 8 * j] = acc[j].x; c[row * n + col + 8 * j + 1] = acc[j].y; }
}"""
KERNELS = {"scalar": SCALAR, "simdgroup": SIMDGROUP, "wmma helper": WMMA}


def prepare(runner: KernelRunner, msl: str, n: int) -> Callable[[], np.ndarray]:
    """A run of ``msl``'s kernel on N x N matrices of small integers, checked once against numpy (exact in
    float32); the call runs it again and returns C."""
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-4, 5, (n, n)).astype(np.float32) for _ in range(2))
    storages = [np.zeros(n * n * 4, np.uint8), a.view(np.uint8).ravel().copy(), b.view(np.uint8).ravel().copy(),
                np.frombuffer(np.int32(n).tobytes(), np.uint8).copy()]
    kernel = runner.compile(msl, "mm")
    bindings = {i: (s, 0) for i, s in enumerate(storages)}
    grid, threadgroup = (n // 32, n // 32, 1), (32, 4, 1)

    def once() -> np.ndarray:
        kernel.run(bindings, grid, threadgroup)
        return storages[0].view(np.float32).reshape(n, n)
    np.testing.assert_array_equal(once(), a @ b)
    return once


def simdgroup_figures(quick: bool = False) -> dict[str, Any]:
    """Per N (``quick``: 32; else 64, 128, 256) the median ms of each kernel of ``KERNELS`` and its ratio to
    ``scalar``; ``simdgroup_over_scalar``: the largest ratio of the ``simdgroup`` kernel."""
    runner = KernelRunner()
    sizes = [32] if quick else [64, 128, 256]
    rows: dict[str, Any] = {}
    for n in sizes:
        t = interleaved({name: prepare(runner, msl, n) for name, msl in KERNELS.items()}, 1, cpu=True)
        rows[str(n)] = {**{f"ms_{name.replace(' ', '_')}": v * 1e3 for name, v in t.items()},
                        **{f"{name.replace(' ', '_')}_over_scalar": ratio(t[name], t["scalar"])
                           for name in KERNELS if name != "scalar"}}
    return {"simdgroup_over_scalar": max(r["simdgroup_over_scalar"] for r in rows.values()), "simdgroup": rows,
            "simdgroup_device": runner.device.name.strip()}
