"""SIMD groups on the simulated device (msl.simd): every SIMD-group and quad-group function against a numpy model of
the lanes (whole and partial groups, threadgroups of several dimensions), the 8x8 SIMD-group matrices' lane mapping
and arithmetic exactly against numpy, loads and stores with stride, origin and transpose, helpers that take the
scratch, and what stays refused."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from mtlir.errors import KernelAccessError, UnsupportedKernelError
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.msl.simd import scratch_bytes
from mtlir.runtime.sim.msl.translate import translate

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


def run(runner: KernelRunner, msl: str, arrays: list[np.ndarray], threadgroup: tuple[int, int, int],
        grid: tuple[int, int, int] = (1, 1, 1)) -> list[np.ndarray]:
    storages = [np.frombuffer(a.tobytes(), np.uint8).copy() for a in arrays]
    runner.compile(HEAD + msl, "k").run({i: (s, 0) for i, s in enumerate(storages)}, grid, threadgroup)
    return [s.view(a.dtype).reshape(a.shape) for s, a in zip(storages, arrays)]


# --- a numpy model of the lanes: thread t is lane t % w of group t // w; a partial last group has n < w lanes ---

def groups(threads: int, width: int) -> list[tuple[int, int]]:
    """(first thread, active lanes) of each group."""
    return [(b, min(width, threads - b)) for b in range(0, threads, width)]


def per_lane(threads: int, width: int, f: Callable[[np.ndarray, int, int], object]) -> np.ndarray:
    """f(values of the group, lane, active lanes) for every thread."""
    return np.array([f(np.arange(b, b + n), lane, n) for b, n in groups(threads, width) for lane in range(n)],
                    dtype=object)


def shuffled(v: np.ndarray, threads: int, width: int, src: Callable[[int, int], int]) -> np.ndarray:
    """Lane l reads lane src(l, n) of its group when that lane is active, else keeps its own value."""
    def one(idx: np.ndarray, lane: int, n: int) -> object:
        s = src(lane, n)
        return v[idx[s]] if 0 <= s < n else v[idx[lane]]
    return per_lane(threads, width, one).astype(np.int64)


def reduce(v: np.ndarray, threads: int, width: int, f: Callable[[np.ndarray], object]) -> np.ndarray:
    return per_lane(threads, width, lambda idx, lane, n: f(v[idx])).astype(np.int64)


def scan(v: np.ndarray, threads: int, width: int, f: Callable[[np.ndarray], object], inclusive: bool) -> np.ndarray:
    return per_lane(threads, width, lambda idx, lane, n: f(v[idx[:lane + int(inclusive)]])).astype(np.int64)


FUNCTIONS: list[tuple[str, Callable[[np.ndarray, int], np.ndarray]]] = [
    ("simd_sum(x)", lambda v, t: reduce(v, t, 32, np.sum)),
    ("simd_product(p)", lambda v, t: reduce(np.where(v % 5 == 0, 2, 1), t, 32, np.prod)),
    ("simd_min(x)", lambda v, t: reduce(v, t, 32, np.min)),
    ("simd_max(x)", lambda v, t: reduce(v, t, 32, np.max)),
    ("simd_and(x | 0x100)", lambda v, t: reduce(v | 0x100, t, 32, np.bitwise_and.reduce)),
    ("simd_or(x)", lambda v, t: reduce(v, t, 32, np.bitwise_or.reduce)),
    ("simd_xor(x)", lambda v, t: reduce(v, t, 32, np.bitwise_xor.reduce)),
    ("simd_prefix_inclusive_sum(x)", lambda v, t: scan(v, t, 32, np.sum, True)),
    ("simd_prefix_exclusive_sum(x)", lambda v, t: scan(v, t, 32, np.sum, False)),
    ("simd_prefix_inclusive_product(p)", lambda v, t: scan(np.where(v % 5 == 0, 2, 1), t, 32, np.prod, True)),
    ("simd_prefix_exclusive_product(p)", lambda v, t: scan(np.where(v % 5 == 0, 2, 1), t, 32, np.prod, False)),
    ("simd_shuffle(x, (lane * 7u + 3u) % 32u)", lambda v, t: shuffled(v, t, 32, lambda l, n: (l * 7 + 3) % 32)),
    ("simd_shuffle_down(x, 3)", lambda v, t: shuffled(v, t, 32, lambda l, n: l + 3)),
    ("simd_shuffle_up(x, 5)", lambda v, t: shuffled(v, t, 32, lambda l, n: l - 5)),
    ("simd_shuffle_xor(x, 6)", lambda v, t: shuffled(v, t, 32, lambda l, n: l ^ 6)),
    ("simd_shuffle_rotate_down(x, 7)", lambda v, t: shuffled(v, t, 32, lambda l, n: (l + 7) % 32)),
    ("simd_shuffle_rotate_up(x, 9)", lambda v, t: shuffled(v, t, 32, lambda l, n: (l - 9) % 32)),
    ("simd_broadcast(x, 4)", lambda v, t: shuffled(v, t, 32, lambda l, n: 4)),
    ("simd_broadcast_first(x)", lambda v, t: shuffled(v, t, 32, lambda l, n: 0)),
    ("(int)simd_ballot(x > 40)", lambda v, t: per_lane(t, 32, lambda idx, l, n: int(
        sum(1 << k for k in range(n) if v[idx[k]] > 40)) - (1 << 32 if any(v[idx[31:32]] > 40) else 0)).astype(
        np.int64)),
    ("simd_all(x > -30)", lambda v, t: reduce(v, t, 32, lambda g: int((g > -30).all()))),
    ("simd_any(x == 17)", lambda v, t: reduce(v, t, 32, lambda g: int((g == 17).any()))),
    ("simd_is_first()", lambda v, t: per_lane(t, 32, lambda idx, l, n: int(l == 0)).astype(np.int64)),
    ("(int)simd_active_threads_mask()", lambda v, t: per_lane(t, 32, lambda idx, l, n: (1 << n) - 1 - (
        1 << 32 if n == 32 else 0)).astype(np.int64)),
    ("quad_sum(x)", lambda v, t: reduce(v, t, 4, np.sum)),
    ("quad_max(x)", lambda v, t: reduce(v, t, 4, np.max)),
    ("quad_prefix_inclusive_sum(x)", lambda v, t: scan(v, t, 4, np.sum, True)),
    ("quad_shuffle(x, 3 - lane % 4u)", lambda v, t: shuffled(v, t, 4, lambda l, n: 3 - l)),
    ("quad_shuffle_down(x, 1)", lambda v, t: shuffled(v, t, 4, lambda l, n: l + 1)),
    ("quad_shuffle_xor(x, 2)", lambda v, t: shuffled(v, t, 4, lambda l, n: l ^ 2)),
    ("quad_broadcast(x, 3)", lambda v, t: shuffled(v, t, 4, lambda l, n: 3)),
    ("quad_all(x > 0)", lambda v, t: reduce(v, t, 4, lambda g: int((g > 0).all()))),
    ("quad_any(x > 50)", lambda v, t: reduce(v, t, 4, lambda g: int((g > 50).any()))),
    ("(int)quad_is_first()", lambda v, t: per_lane(t, 4, lambda idx, l, n: int(l == 0)).astype(np.int64)),
]


@pytest.mark.parametrize("threadgroup", [(64, 1, 1), (8, 5, 1), (3, 4, 2)], ids=["2 groups", "8x5: a partial group",
                                                                                  "3x4x2: partial, 3-D"])
def test_simd_group_functions_against_a_model_of_the_lanes(runner: KernelRunner,
                                                          threadgroup: tuple[int, int, int]) -> None:
    threads = threadgroup[0] * threadgroup[1] * threadgroup[2]
    body = "\n".join(f"  out[{k} * {threads} + t] = {expr};" for k, (expr, _) in enumerate(FUNCTIONS))
    msl = f"""kernel void k(device int* out, device const int* values, uint t [[thread_index_in_threadgroup]],
                          ushort lane [[thread_index_in_simdgroup]]) {{
      int x = values[t];
      int p = x % 5 == 0 ? 2 : 1;
    {body}
    }}"""
    values = np.random.default_rng(3).integers(-40, 60, threads).astype(np.int32)
    out, _ = run(runner, msl, [np.zeros((len(FUNCTIONS), threads), np.int32), values], threadgroup)
    v = values.astype(np.int64)
    for k, (expr, model) in enumerate(FUNCTIONS):
        want = model(v, threads).astype(np.int64).astype(np.int32)
        np.testing.assert_array_equal(out[k], want, err_msg=expr)


def test_positions_in_simd_groups_and_quad_groups(runner: KernelRunner) -> None:
    msl = """kernel void k(device uint* out, uint t [[thread_index_in_threadgroup]],
                          ushort lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                          uint width [[threads_per_simdgroup]], ushort groups [[simdgroups_per_threadgroup]],
                          uint q [[thread_index_in_quadgroup]], uint qg [[quadgroup_index_in_threadgroup]],
                          uint quads [[quadgroups_per_threadgroup]]) {
      out[7 * t] = lane; out[7 * t + 1] = sg; out[7 * t + 2] = width; out[7 * t + 3] = groups;
      out[7 * t + 4] = q; out[7 * t + 5] = qg; out[7 * t + 6] = quads;
    }"""
    (out,) = run(runner, msl, [np.zeros((70, 7), np.uint32)], (7, 10, 1))
    t = np.arange(70)
    np.testing.assert_array_equal(out, np.stack([t % 32, t // 32, t * 0 + 32, t * 0 + 3, t % 4, t // 4,
                                                 t * 0 + 18], axis=1))


def test_float_vectors_and_a_helper_called_in_a_loop(runner: KernelRunner) -> None:
    """A helper that uses SIMD-group functions gets the scratch passed through, also from a loop and from a helper
    that takes a buffer pointer (whose calls pass the bounds too)."""
    msl = """float lane_sum(float v) { return simd_sum(v); }
    float4 from_buffer(device const float4* p, uint t) { return simd_shuffle_xor(p[t], 1) + lane_sum(1.0f); }
    kernel void k(device float4* out, device const float4* in, uint t [[thread_index_in_threadgroup]]) {
      float acc = 0.0f;
      for (int r = 0; r < 3; r++) { acc += lane_sum(in[t].x * (float)r); }
      out[t] = from_buffer(in, t) + simd_sum(in[t]) * 0.0f + float4(acc);
    }"""
    x = np.arange(64 * 4, dtype=np.float32).reshape(64, 4) / 8
    out, _ = run(runner, msl, [np.zeros((64, 4), np.float32), x], (64, 1, 1))
    sums = np.repeat(x[:, 0].reshape(2, 32).sum(axis=1), 32)
    partner = x[np.arange(64) ^ 1]
    np.testing.assert_array_equal(out, partner + 32 + (0 + sums + 2 * sums)[:, None])
    src = translate(HEAD + msl).source
    assert "float lane_sum(float v, __local uchar* __mtl_simd)" in src
    assert "uint __mtl_k_p, uint t, __global uint* __mtl_fault, __local uchar* __mtl_simd)" in src
    assert "__mtl_fault, __local uchar* __mtl_simd) {" in src  # the kernel's own last parameter
    assert "for (int r = 0; r < 3; r++)" in src  # a loop with a SIMD-group function is never cut short


def test_scratch_size_covers_every_simd_group() -> None:
    per_thread = 32 + 32 + 4  # a function's slot, a share of the two matrix buffers, the buffer phase
    assert scratch_bytes(1) == scratch_bytes(32) == 32 * per_thread
    assert scratch_bytes(33) == scratch_bytes(64) == 64 * per_thread
    assert scratch_bytes(1024) == 1024 * per_thread


def test_a_branch_that_all_lanes_of_a_simd_group_take_alike_runs(runner: KernelRunner) -> None:
    """The reduction of many Metal kernels: SIMD group 0 alone reduces the groups' partial sums (its condition is
    the same for a whole SIMD group); a loop of literal bounds; a condition on a reduction's result."""
    msl = """kernel void k(device float* out, device const float* x, constant int& n,
                          uint t [[thread_index_in_threadgroup]], ushort lane [[thread_index_in_simdgroup]],
                          ushort sg [[simdgroup_index_in_threadgroup]]) {
      threadgroup float part[4];
      float v = simd_sum(x[t]);
      if (lane == 0) part[sg] = v;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (sg == 0) { v = simd_sum(lane < 4 ? part[lane] : 0.0f); }
      int rounds = n * 2;
      for (int r = 0; r < rounds; r++) { if (simd_all(v > 0.0f)) v = v + simd_broadcast(v, 0) * 0.0f; }
      if (t == 0) out[0] = v;
    }"""
    x = np.arange(128, dtype=np.float32)
    out, *_ = run(runner, msl, [np.zeros(1, np.float32), x, np.int32([2])], (128, 1, 1))
    assert out[0] == x.sum()


@pytest.mark.parametrize("body, construct, where", [
    ("if (lane < 16) { out[t] = simd_sum(x[t]); }", "simd_sum", "line 5, column 11"),
    ("if (t >= 40) return;\n      out[t] = simd_shuffle_down(x[t], 1);", "simd_shuffle_down", "line 5, column 11"),
    ("simdgroup_float8x8 m = simdgroup_float8x8(1.0f);\n      if (x[t] > 0.0f) simdgroup_multiply(m, m, m);",
     "simdgroup_multiply", "line 6, column 11"),
    ("for (uint i = lane; i < 40; i += 8) out[t] += simd_sum(x[i]);", "simd_sum", "line 5, column 27"),
    ("out[t] = lane & 1 ? simd_sum(x[t]) : 0.0f;", "simd_sum", "line 5, column 16"),
    ("for (int i = 0; i < 4; i++) { if (x[t + i] > 1.0f) break; out[t] = simd_max(x[i]); }", "simd_max",
     "line 5, column 23"),  # the loop's condition: lanes that took the break are no longer in the loop
    ("float w = x[t];\n      while (w < 8.0f) { w = simd_sum(w); }", "simd_sum", "line 6, column 14"),
])
def test_an_exchange_where_the_lanes_of_a_simd_group_may_part_is_refused(body: str, construct: str,
                                                                          where: str) -> None:
    """On Metal the lanes that are not there are inactive; OpenCL barriers reached by some work-items and not
    others are undefined (PoCL crashes the process): refused when translating, naming the call and the condition."""
    msl = f"""kernel void k(device float* out, device const float* x, uint t [[thread_index_in_threadgroup]],
                           ushort lane [[thread_index_in_simdgroup]]) {{
      {body}
    }}"""
    with pytest.raises(UnsupportedKernelError, match=f"the condition at {where} may differ between them") as info:
        translate(HEAD + msl)
    assert info.value.construct == construct


def test_a_helper_that_exchanges_under_a_condition_on_its_parameters_is_refused() -> None:
    """A helper's parameters are taken as per lane (its callers are not followed)."""
    msl = """float f(float v, int k) { if (k > 0) { return simd_sum(v); } return v; }
    kernel void k(device float* out, uint t [[thread_index_in_threadgroup]]) { out[t] = f(1.0f, 1); }"""
    with pytest.raises(UnsupportedKernelError, match="the condition at line 3, column 31"):
        translate(HEAD + msl)


# --- 8x8 SIMD-group matrices: lane L holds row (L // 2) % 4 + 4 (L // 16), columns 2 (L % 2) + 4 ((L // 8) % 2) + e
# for its elements e = 0, 1 (tinygrad's Metal tensor-core emulator states this layout for A, B, C and D alike) ---

def lane_elements(m: np.ndarray) -> np.ndarray:
    """The 64 per-lane elements of an 8x8 matrix, lane by lane: [lane 0 e0, lane 0 e1, lane 1 e0, ...]."""
    out = np.zeros(64, m.dtype)
    for lane in range(32):
        for e in range(2):
            out[2 * lane + e] = m[(lane // 2) % 4 + 4 * (lane // 16), e + 2 * (lane % 2) + 4 * ((lane // 8) % 2)]
    return out


def test_matrix_lane_mapping_and_multiply_accumulate_are_exact(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* d, device const float* a, device const float* b, device const float* c,
                          ushort lane [[thread_index_in_simdgroup]]) {
      simdgroup_float8x8 ma, mb, mc, md;
      for (int e = 0; e < 2; e++) {
        ma.thread_elements()[e] = a[2 * lane + e];
        mb.thread_elements()[e] = b[2 * lane + e];
        mc.thread_elements()[e] = c[2 * lane + e];
      }
      simdgroup_multiply_accumulate(md, ma, mb, mc);
      d[2 * lane] = md.thread_elements()[0]; d[2 * lane + 1] = md.thread_elements()[1];
      simdgroup_multiply(md, ma, mb);
      float2 e = md.thread_elements();
      d[64 + 2 * lane] = e.x; d[64 + 2 * lane + 1] = e.y;
    }"""
    rng = np.random.default_rng(4)
    a, b, c = (rng.integers(-8, 8, (8, 8)).astype(np.float32) for _ in range(3))
    d, *_ = run(runner, msl, [np.zeros(128, np.float32), lane_elements(a), lane_elements(b), lane_elements(c)],
                (32, 1, 1))
    np.testing.assert_array_equal(d[:64], lane_elements(a @ b + c))
    np.testing.assert_array_equal(d[64:], lane_elements(a @ b))


def test_matrix_loads_and_stores_with_stride_origin_and_transpose(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* out, device const float* src, uint t [[thread_index_in_threadgroup]]) {
      threadgroup float tile[64];
      tile[t] = src[t]; tile[t + 32] = src[t + 32];
      threadgroup_barrier(mem_flags::mem_threadgroup);
      simdgroup_float8x8 a, at, b;
      simdgroup_load(a, src, 16, ulong2(8, 4));
      simdgroup_load(at, src + 16, 16, ulong2(0, 0), true);
      simdgroup_load(b, tile);
      simdgroup_store(a, out, 12, ulong2(2, 1));
      simdgroup_store(at, out + 120, 8);
      simdgroup_store(b, out + 184, 8, 0, true);
      simdgroup_float8x8 f = make_filled_simdgroup_matrix<float, 8, 8>(3.0f), g = simdgroup_float8x8(2.0f);
      simdgroup_store(f, out + 248, 8);
      simdgroup_store(g, out + 312, 8);
    }"""
    src = np.arange(256, dtype=np.float32).reshape(16, 16)
    (out, _) = run(runner, msl, [np.zeros(376, np.float32), src], (32, 1, 1))
    want = np.zeros(376, np.float32)
    view = want[:120].reshape(10, 12)
    view[1:9, 2:10] = src[4:12, 8:16]
    want[120:184] = src[1:9, 0:8].T.ravel()
    want[184:248] = src.ravel()[:64].reshape(8, 8).T.ravel()
    want[248:312] = 3.0
    want[312:376] = (2 * np.eye(8, dtype=np.float32)).ravel()
    np.testing.assert_array_equal(out, want)


def test_a_matrix_load_past_the_buffer_is_a_fault_not_a_crash(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* out, device const float* src) {
      simdgroup_float8x8 a;
      simdgroup_load(a, src, 1000000);
      simdgroup_store(a, out);
    }"""
    with pytest.raises(KernelAccessError) as info:
        run(runner, msl, [np.zeros(64, np.float32), np.zeros(64, np.float32)], (32, 1, 1))
    assert info.value.param == "src" and not info.value.write


def test_half_matrices_round_once_to_their_type(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* d, device half* h, device const half* a, device const half* b,
                          device const float* c) {
      simdgroup_half8x8 ma, mb, mh;
      simdgroup_float8x8 mc, md;
      simdgroup_load(ma, a);
      simdgroup_load(mb, b);
      simdgroup_load(mc, c);
      simdgroup_multiply_accumulate(md, ma, mb, mc);
      simdgroup_multiply(mh, ma, mb);
      simdgroup_store(md, d);
      simdgroup_store(mh, h);
    }"""
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((8, 8)).astype(np.float16) for _ in range(2))
    c = rng.standard_normal((8, 8)).astype(np.float32)
    d, h, *_ = run(runner, msl, [np.zeros((8, 8), np.float32), np.zeros((8, 8), np.float16), a, b, c], (32, 1, 1))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(d, exact + c, rtol=1e-6, atol=1e-6)  # float accumulation, one float rounding
    assert np.abs(h.astype(np.float64) - exact).max() <= np.abs(exact).max() * 2**-11  # rounded once to half


def test_tinygrad_half_wmma_helpers(runner: KernelRunner) -> None:
    """tinygrad's helpers for half inputs with a float and with a half accumulator: half2 parameters, elements
    moved through thread_elements(), half2 loads through a pointer cast."""
    helper = """{ret}2 __WMMA_8_8_8_half_{ret}(half2 a, half2 b, {ret}2 c){{
      simdgroup_half8x8 mat_a, mat_b; simdgroup_{ret}8x8 mat_c;
      mat_a.thread_elements()[0] = a[0]; mat_b.thread_elements()[0] = b[0]; mat_c.thread_elements()[0] = c[0];
      mat_a.thread_elements()[1] = a[1]; mat_b.thread_elements()[1] = b[1]; mat_c.thread_elements()[1] = c[1];
      simdgroup_multiply_accumulate(mat_c, mat_a, mat_b, mat_c);
      return {ret}2(mat_c.thread_elements()[0], mat_c.thread_elements()[1]);
    }}
    """
    msl = helper.format(ret="float") + helper.format(ret="half") + """kernel void k(device float* df, device half* dh,
        device const half* a, device const half* b, uint3 lid [[thread_position_in_threadgroup]]) {
      int l = lid.x;
      half2 va = half2(a[2 * l], a[2 * l + 1]);
      half2 vb = *((device half2*)(b + 2 * l));
      *((device float2*)(df + 2 * l)) = __WMMA_8_8_8_half_float(va, vb, float2(0.0f));
      *((device half2*)(dh + 2 * l)) = __WMMA_8_8_8_half_half(va, vb, half2((half)(1.0f), (half)(0.0f)));
    }"""
    rng = np.random.default_rng(7)
    a, b = (rng.integers(-3, 4, (8, 8)).astype(np.float16) for _ in range(2))
    df, dh, *_ = run(runner, msl, [np.zeros(64, np.float32), np.zeros(64, np.float16), lane_elements(a),
                                   lane_elements(b)], (32, 1, 1))
    product = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_array_equal(df, lane_elements(product))
    want = lane_elements(product)
    want[0::2] += 1  # C: element 0 of every lane is 1
    np.testing.assert_array_equal(dh, want.astype(np.float16))


def test_several_simd_groups_and_a_partial_one_multiply_independently(runner: KernelRunner) -> None:
    """Threadgroups of 64 (two SIMD groups, each its own matrices) and of 24 (one partial group: the elements of
    the 8 inactive lanes count as 0)."""
    msl = """kernel void k(device float* d, device const float* a, device const float* b,
                          uint t [[thread_index_in_threadgroup]], ushort lane [[thread_index_in_simdgroup]],
                          uint sg [[simdgroup_index_in_threadgroup]]) {
      simdgroup_float8x8 ma, mb, md;
      ma.thread_elements() = float2(a[64 * sg + 2 * lane], a[64 * sg + 2 * lane + 1]);
      mb.thread_elements() = float2(b[64 * sg + 2 * lane], b[64 * sg + 2 * lane + 1]);
      simdgroup_multiply(md, ma, mb);
      d[2 * t] = md.thread_elements().x; d[2 * t + 1] = md.thread_elements().y;
    }"""
    rng = np.random.default_rng(6)
    a, b = (rng.integers(-4, 5, (2, 8, 8)).astype(np.float32) for _ in range(2))
    lanes_a = np.concatenate([lane_elements(a[0]), lane_elements(a[1])])
    lanes_b = np.concatenate([lane_elements(b[0]), lane_elements(b[1])])
    d, *_ = run(runner, msl, [np.zeros(128, np.float32), lanes_a, lanes_b], (64, 1, 1))
    np.testing.assert_array_equal(d, np.concatenate([lane_elements(a[0] @ b[0]), lane_elements(a[1] @ b[1])]))
    d, *_ = run(runner, msl, [np.zeros(48, np.float32), lanes_a, lanes_b], (24, 1, 1))
    inactive = np.zeros(64, bool)
    inactive[48:] = True  # lanes 24..31
    a0 = lanes_a[:64].copy()
    b0 = lanes_b[:64].copy()
    a0[inactive], b0[inactive] = 0, 0
    back = np.zeros((8, 8), np.float32)

    def matrix(lanes: np.ndarray) -> np.ndarray:
        m = back.copy()
        for lane in range(32):
            for e in range(2):
                m[(lane // 2) % 4 + 4 * (lane // 16), e + 2 * (lane % 2) + 4 * ((lane // 8) % 2)] = lanes[2 * lane + e]
        return m
    np.testing.assert_array_equal(d, lane_elements(matrix(a0) @ matrix(b0))[:48])


@pytest.mark.parametrize("msl, construct", [
    ("kernel void k(device float* x) { x[0] = simd_shuffle_and_fill_down(x[1], 0.0f, 1u); }",
     "simd_shuffle_and_fill_down"),
    ("kernel void k(device float* x) { simdgroup_matrix<float, 4, 4> m; x[0] = 0; }", "simdgroup_matrix"),
    ("kernel void k(device float* x) { simdgroup_float8x8 m; x[0] = m.thread_elements; }", "thread_elements"),
    ("constant float c = simd_sum(1.0f);\nkernel void k(device float* x) { x[0] = c; }", "simd_sum"),
])
def test_what_the_simd_emulation_refuses(msl: str, construct: str) -> None:
    with pytest.raises(UnsupportedKernelError) as info:
        translate(HEAD + msl)
    assert info.value.construct == construct
