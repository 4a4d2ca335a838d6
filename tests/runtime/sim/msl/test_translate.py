"""The MSL -> OpenCL C translator: one hand-written kernel per construct, run on the OpenCL device and checked
against numpy; the translated text where it is the point; refusals that name the construct."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mtlir.errors import KernelCompileError, UnsupportedKernelError
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.msl.translate import kernel_functions, translate
from mtlir.runtime.sim.msl.lex import MslSyntaxError, render, tokenize
from mtlir.runtime.sim.msl.names import canonical_type_spellings

TRACES = Path(__file__).resolve().parents[4] / "examples" / "traces"
HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


def launch(runner: KernelRunner, msl: str, function: str, arrays: list[np.ndarray], grid: tuple[int, int, int],
           threadgroup: tuple[int, int, int], consts: dict[int, np.ndarray] | None = None) -> list[np.ndarray]:
    """Bind ``arrays`` at buffer indices 0.. (and ``consts`` at theirs), run, return the arrays after the run."""
    storages = [np.frombuffer(a.tobytes(), np.uint8).copy() for a in arrays]
    bindings = {i: (s, 0) for i, s in enumerate(storages)}
    for index, value in (consts or {}).items():
        bindings[index] = (np.frombuffer(value.tobytes(), np.uint8).copy(), 0)
    runner.compile(HEAD + msl, function).run(bindings, grid, threadgroup)
    return [s.view(a.dtype).reshape(a.shape) for s, a in zip(storages, arrays)]


def refused(msl: str) -> UnsupportedKernelError:
    with pytest.raises(UnsupportedKernelError) as info:
        translate(HEAD + msl)
    return info.value


# --- lexing ---

def test_tokens_keep_the_source_text() -> None:
    src = HEAD + "kernel void k(device float* a /* out */, uint i [[thread_position_in_grid]]) {\n  a[i] = 1.5e-3f;\n}"
    toks = tokenize(src)
    assert render(toks) == src
    assert [t.text for t in toks[:3]] == ["#include <metal_stdlib>", "using", "namespace"]
    k = [t.text for t in toks].index("thread_position_in_grid")
    assert [t.text for t in toks[k - 2:k + 3]] == ["[", "[", "thread_position_in_grid", "]", "]"]


def test_lexer_errors_name_the_place() -> None:
    with pytest.raises(MslSyntaxError, match="line 2, column 3: unexpected character '@'"):
        tokenize("a\n  @")
    with pytest.raises(MslSyntaxError, match="unterminated block comment"):
        tokenize("a /* b")


# --- the construct tests: translated, run, checked against numpy ---

def test_header_removed_and_kernel_becomes_opencl_kernel(runner: KernelRunner) -> None:
    msl = "kernel void copy(device float* out, device float* in, uint i [[thread_position_in_grid]]) {out[i] = in[i];}"
    src = translate(HEAD + msl).source
    assert "metal_stdlib" not in src and "using" not in src
    assert ("__kernel void copy(__global uchar* out_base, __global uchar* in_base, __global const ulong* __mtl_args, "
            "__global uint* __mtl_fault)") in src
    x = np.arange(8, dtype=np.float32)
    out, _ = launch(runner, msl, "copy", [np.zeros(8, np.float32), x], (2, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(out, x)


def test_device_pointers_bind_in_order_or_by_buffer_attribute(runner: KernelRunner) -> None:
    msl = """kernel void sub(device const float* b [[buffer(2)]], device float* __restrict__ out [[buffer(0)]],
                            device const float* a [[buffer(1)]], uint i [[thread_position_in_grid]]) {
      out[i] = a[i] - b[i];
    }"""
    t = translate(HEAD + msl).kernels["sub"]
    assert [(a.name, a.kind, a.index, a.dtype) for a in t.args] == [
        ("b", "buffer", 2, "float32"), ("out", "buffer", 0, "float32"), ("a", "buffer", 1, "float32")]
    assert [b.writable for b in t.bindings] == [False, True, False]
    a, b = np.arange(4, dtype=np.float32), np.float32([5, 1, 2, 9])
    out, _, _ = launch(runner, msl, "sub", [np.zeros(4, np.float32), a, b], (1, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(out, a - b)


def test_const_after_the_star_fixes_the_pointer_not_the_data(runner: KernelRunner) -> None:
    # `device float* const p`: a constant pointer to writable data (valid MSL, stored through); a `const` before
    # the `*` (or the `constant` space) makes the data read-only, and a fixed pointer cannot be moved
    msl = """kernel void fill(device float* const out, device float*const o2, const device float* const a,
                             uint i [[thread_position_in_grid]]) { out[i] = a[i] + 1.0f; o2[i] = a[i]; }"""
    t = translate(HEAD + msl)
    assert [b.writable for b in t.kernels["fill"].bindings] == [True, True, False]
    assert "__global float* const out = " in t.source
    a = np.arange(4, dtype=np.float32)
    out, o2, _ = launch(runner, msl, "fill", [np.zeros(4, np.float32), np.zeros(4, np.float32), a],
                        (1, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(out, a + 1)
    np.testing.assert_array_equal(o2, a)
    for param in ("const device float* const p", "device const float* const p", "constant float* const p"):
        with pytest.raises(KernelCompileError, match="read-only"):
            runner.compile(HEAD + f"kernel void k({param}, uint i [[thread_position_in_grid]]) {{ p[i] = 1.0f; }}",
                           "k")
    with pytest.raises(KernelCompileError):
        runner.compile(HEAD + "kernel void k(device float* const p, uint i [[thread_position_in_grid]]) "
                       "{ p = p + 1; p[i] = 1.0f; }", "k")


def test_constant_reference_is_read_from_its_buffer(runner: KernelRunner) -> None:
    msl = """kernel void axpb(device float* y, device const float* x, constant int& n, constant float& s,
                             uint i [[thread_position_in_grid]]) {
      if ((int)i < n) { y[i] = s * x[i] + 1.0f; }
    }"""
    t = translate(HEAD + msl)
    assert "const int n = *((__global const int*)(n_base + __mtl_args[6]));" in t.source
    assert [(a.kind, a.index, a.dtype) for a in t.kernels["axpb"].args][2:] == [("constant", 2, "int32"),
                                                                                  ("constant", 3, "float32")]
    x = np.arange(8, dtype=np.float32)
    y, _ = launch(runner, msl, "axpb", [np.zeros(8, np.float32), x], (1, 1, 1), (8, 1, 1),
                  consts={2: np.int32([5]), 3: np.float32([2.5])})
    np.testing.assert_array_equal(y, np.where(np.arange(8) < 5, 2.5 * x + 1, 0))


def test_group_and_local_ids_come_from_opencl_work_item_functions(runner: KernelRunner) -> None:
    msl = """kernel void ids(device int* out, uint3 gid [[threadgroup_position_in_grid]],
                            uint3 lid [[thread_position_in_threadgroup]]) {
      int flat = ((gid.z * 3 + gid.y) * 2 + gid.x) * 8 + (lid.z * 2 + lid.y) * 2 + lid.x;
      out[flat * 6 + 0] = gid.x; out[flat * 6 + 1] = gid.y; out[flat * 6 + 2] = gid.z;
      out[flat * 6 + 3] = lid.x; out[flat * 6 + 4] = lid.y; out[flat * 6 + 5] = lid.z;
    }"""
    src = translate(HEAD + msl).source
    assert "uint3 gid = (uint3)((uint)get_group_id(0), (uint)get_group_id(1), (uint)get_group_id(2));" in src
    assert "uint3 lid = (uint3)((uint)get_local_id(0), (uint)get_local_id(1), (uint)get_local_id(2));" in src
    (out,) = launch(runner, msl, "ids", [np.zeros(4 * 8 * 6 * 3 * 2, np.int32)], (2, 3, 4), (2, 2, 2))
    gz, gy, gx, lz, ly, lx = np.meshgrid(*(np.arange(n) for n in (4, 3, 2, 2, 2, 2)), indexing="ij")
    want = np.stack([gx, gy, gz, lx, ly, lz], axis=-1).reshape(-1, 6)
    np.testing.assert_array_equal(out.reshape(-1, 6), want)


def test_grid_sizes_and_flat_positions(runner: KernelRunner) -> None:
    msl = """kernel void sizes(device uint* out, uint tid [[thread_position_in_grid]],
                              uint2 tpg [[threads_per_threadgroup]], ushort3 groups [[threadgroups_per_grid]],
                              uint total [[threads_per_grid]], uint flat [[thread_index_in_threadgroup]]) {
      out[tid * 6 + 0] = tpg.x; out[tid * 6 + 1] = tpg.y; out[tid * 6 + 2] = groups.x;
      out[tid * 6 + 3] = groups.z; out[tid * 6 + 4] = total; out[tid * 6 + 5] = flat;
    }"""
    (out,) = launch(runner, msl, "sizes", [np.zeros(12 * 6, np.uint32)], (3, 1, 1), (4, 1, 1))
    rows = out.reshape(12, 6)
    np.testing.assert_array_equal(rows[:, :5], np.tile([4, 1, 3, 1, 12], (12, 1)))
    np.testing.assert_array_equal(rows[:, 5], np.arange(12) % 4)


THREADGROUP_SUM = """kernel void group_sum(device float* out, device const float* in,
                      uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup __attribute__((aligned(16))) float part[16];
  part[lid.x] = in[gid.x * 16 + lid.x];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid.x == 0) {
    float acc = 0.0f;
    for (int k = 0; k < 16; k++) { acc += part[k]; }
    out[gid.x] = acc;
  }
}"""


def test_threadgroup_memory_and_barrier_translation() -> None:
    t = translate(HEAD + THREADGROUP_SUM, bounds_checks=False)
    assert t.source == (
        "// OpenCL C translated from MSL by mtlir.runtime.sim.msl.translate\n"
        "__kernel void group_sum(__global uchar* out_base, __global const uchar* in_base, "
        "__global const ulong* __mtl_args, __global uint* __mtl_fault) {\n"
        "  __global float* out = (__global float*)(out_base + __mtl_args[0]);\n"
        "  __global const float* in = (__global const float*)(in_base + __mtl_args[3]);\n"
        "  uint3 gid = (uint3)((uint)get_group_id(0), (uint)get_group_id(1), (uint)get_group_id(2));\n"
        "  uint3 lid = (uint3)((uint)get_local_id(0), (uint)get_local_id(1), (uint)get_local_id(2));\n"
        "  __local __attribute__((aligned(16))) float part[16];\n"
        "  part[lid.x] = in[gid.x * 16 + lid.x];\n"
        "  barrier(CLK_LOCAL_MEM_FENCE);\n"
        "  if (lid.x == 0) {\n"
        "    float acc = 0.0f;\n"
        "    for (int k = 0; k < 16; k++) { acc += part[k]; }\n"
        "    out[gid.x] = acc;\n"
        "  }\n"
        "}")
    info = t.kernels["group_sum"]
    assert info.uses_barrier and info.threadgroup_vars == ("part",)


def test_threadgroup_memory_and_barrier_run(runner: KernelRunner) -> None:
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    out, _ = launch(runner, THREADGROUP_SUM, "group_sum", [np.zeros(4, np.float32), x], (4, 1, 1), (16, 1, 1))
    np.testing.assert_allclose(out, x.reshape(4, 16).sum(1), rtol=1e-5)


def test_device_memory_barrier(runner: KernelRunner) -> None:
    msl = """kernel void shift(device float* buf, uint i [[thread_position_in_threadgroup]]) {
      float v = buf[i];
      threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
      buf[(i + 1) % 8] = v;
    }"""
    assert "barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);" in translate(HEAD + msl).source
    x = np.arange(8, dtype=np.float32)
    (out,) = launch(runner, msl, "shift", [x], (1, 1, 1), (8, 1, 1))
    np.testing.assert_array_equal(out, np.roll(x, 1))


def test_vector_types_components_and_constructors(runner: KernelRunner) -> None:
    msl = """kernel void vec(device float* out, device const float* in, device int* iout, device uint* uout,
                            uint i [[thread_position_in_grid]]) {
      float4 v = float4(in[4 * i], in[4 * i + 1], in[4 * i + 2], in[4 * i + 3]);
      float2 lo = v.xy;
      float2 hi = float2(v.z, v.w);
      float4 w = float4(hi, lo) * 2.0f;
      out[4 * i] = w.x; out[4 * i + 1] = w.y; out[4 * i + 2] = w.z; out[4 * i + 3] = w.w;
      int2 a = int2(3, -4);
      uint2 b = uint2(i, 7u);
      iout[2 * i] = a.x * (int)i; iout[2 * i + 1] = a.y;
      uout[2 * i] = b.x + b.y; uout[2 * i + 1] = b.y;
    }"""
    src = translate(HEAD + msl, bounds_checks=False).source
    assert "float4 v = (float4)(in[4 * i]," in src and "float4 w = (float4)(hi, lo) * 2.0f;" in src
    x = np.arange(8, dtype=np.float32)
    out, _, iout, uout = launch(runner, msl, "vec", [np.zeros(8, np.float32), x, np.zeros(4, np.int32),
                                                     np.zeros(4, np.uint32)], (1, 1, 1), (2, 1, 1))
    np.testing.assert_array_equal(out, 2 * x.reshape(2, 4)[:, [2, 3, 0, 1]].reshape(-1))
    np.testing.assert_array_equal(iout, [0, -4, 3, -4])
    np.testing.assert_array_equal(uout, [7, 7, 8, 7])


def test_one_argument_constructors_broadcast_and_convert(runner: KernelRunner) -> None:
    msl = """kernel void conv(device float* out, device int* iout, uint i [[thread_position_in_grid]]) {
      float4 b = float4(1.5f);
      float4 c = float4(int4(1, -2, 3, -4));
      int2 t = int2(float2(2.75f, -2.75f));
      float4 z = float4();
      out[0] = b.x + b.w; out[1] = c.y; out[2] = c.w; out[3] = z.z;
      iout[0] = t.x; iout[1] = t.y; iout[2] = static_cast<int>(-3.5f); iout[3] = int(7.9f);
    }"""
    src = translate(HEAD + msl).source
    assert "__mtl_make_float4(1.5f)" in src and "((float4)(0))" in src
    out, iout = launch(runner, msl, "conv", [np.zeros(4, np.float32), np.zeros(4, np.int32)], (1, 1, 1), (1, 1, 1))
    np.testing.assert_array_equal(out, [3.0, -2.0, -4.0, 0.0])
    np.testing.assert_array_equal(iout, [2, -2, -3, 7])


def test_vector_loads_and_stores_through_pointer_casts_at_any_element_offset(runner: KernelRunner) -> None:
    msl = """kernel void v4(device float* out, device float* in, uint i [[thread_position_in_grid]]) {
      float4 v = *((device float4*)(in + 1 + 4 * i));
      *((device float4*)(out + 3 + 4 * i)) = v * v;
      float2 p = *((device float2*)((in + 1)));
      *((device float2*)(out + 1)) += p;
    }"""
    src = translate(HEAD + msl, bounds_checks=False).source  # without checks too: vload/vstore, no check
    assert "typedef float4 __mtl_float4_u __attribute__((aligned(4)));" in src  # the pointer types' alias
    assert "vload4(0, (const __global float*)({ __auto_type __mtl_a0 = (((__global __mtl_float4_u*)(in + 1 + 4 * i" \
           "))); __mtl_a0; }))" in src
    assert src.count("vstore") == 2 and "__MTL_CHK" not in src and "(*({" not in src
    x = np.arange(1, 18, dtype=np.float32)  # float4 at in + 1 + 4 i: 4-byte aligned, not 16
    out, _ = launch(runner, msl, "v4", [np.zeros(20, np.float32), x], (1, 1, 1), (1, 1, 1))
    want = np.zeros(20, np.float32)
    want[3:7] = x[1:5] ** 2
    want[1:3] += x[1:3]
    np.testing.assert_array_equal(out, want)


def test_math_functions_and_namespace_prefixes(runner: KernelRunner) -> None:
    msl = """kernel void m(device float* out, device const float* x, uint i [[thread_position_in_grid]]) {
      float v = x[i];
      out[8 * i + 0] = exp2(v);
      out[8 * i + 1] = metal::log2(v);
      out[8 * i + 2] = precise::sqrt(v);
      out[8 * i + 3] = fast::exp(v);
      out[8 * i + 4] = metal::precise::sin(v);
      out[8 * i + 5] = (v > 2.0f) ? INFINITY : -INFINITY;
      out[8 * i + 6] = max(v, 2.0f) + min(v, 1.0f) + clamp(v, 0.5f, 1.5f);
      out[8 * i + 7] = fma(v, v, 1.0f) + pow(v, 0.5f) + rsqrt(v);
    }"""
    src = translate(HEAD + msl).source
    assert "metal" not in src.split("\n", 1)[1] and "precise" not in src and "fast::" not in src
    x = np.float32([0.5, 1.0, 3.0, 7.25])
    out, _ = launch(runner, msl, "m", [np.zeros(32, np.float32), x], (1, 1, 1), (4, 1, 1))
    want = np.stack([np.exp2(x), np.log2(x), np.sqrt(x), np.exp(x), np.sin(x), np.where(x > 2, np.inf, -np.inf),
                     np.maximum(x, 2) + np.minimum(x, 1) + np.clip(x, 0.5, 1.5),
                     x * x + 1 + np.sqrt(x) + 1 / np.sqrt(x)], axis=1)
    np.testing.assert_allclose(out.reshape(4, 8), want, rtol=1e-5)


def test_builtins_whose_opencl_namesakes_differ(runner: KernelRunner) -> None:
    msl = """kernel void b(device float* out, device int* iout, device const float* x, device const int* n,
                          uint i [[thread_position_in_grid]]) {
      out[3 * i] = abs(x[i]);
      out[3 * i + 1] = fract(x[i]);
      out[3 * i + 2] = saturate(x[i]);
      iout[2 * i] = (abs(n[i]) - 10) / 2;  // int in MSL: an unsigned abs would divide 2^32 - 5
      iout[2 * i + 1] = mulhi(n[i], 1 << 30);
    }"""
    src = translate(HEAD + msl, bounds_checks=False).source
    assert "__mtl_abs(x[i])" in src and "__mtl_fract(" in src and "__mtl_saturate(" in src and "mul_hi(" in src
    x = np.float32([-3.25, 0.75, 1.5, -0.5])
    n = np.int32([-5, 7, -2 ** 31 + 1, 123456789])
    out, iout, _, _ = launch(runner, msl, "b", [np.zeros(12, np.float32), np.zeros(8, np.int32), x, n],
                             (1, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(out.reshape(4, 3), np.stack([np.abs(x), x - np.floor(x), np.clip(x, 0, 1)], 1))
    np.testing.assert_array_equal(iout.reshape(4, 2)[:, 0], np.fix((np.abs(n.astype(np.int64)) - 10) / 2))
    np.testing.assert_array_equal(iout.reshape(4, 2)[:, 1], (n.astype(np.int64) * (1 << 30)) >> 32)


def test_as_type_reinterprets_bits(runner: KernelRunner) -> None:
    msl = """kernel void bits(device uint* u, device float* f, uint i [[thread_position_in_grid]]) {
      uint b = as_type<uint>(f[i]);
      u[i] = b;
      f[i] = as_type<float>(b ^ 0x80000000u);
    }"""
    assert "as_uint(f[i])" in translate(HEAD + msl, bounds_checks=False).source
    x = np.float32([1.0, -2.5, 0.0, 3.75])
    u, f = launch(runner, msl, "bits", [np.zeros(4, np.uint32), x], (1, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(u, x.view(np.uint32))
    np.testing.assert_array_equal(f, -x)


def test_opencl_keywords_used_as_msl_names_are_renamed(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* global, constant int& local, uint private [[thread_position_in_grid]]) {
      float read_only = global[private];
      global[private] = read_only + local;
    }"""
    t = translate(HEAD + msl)
    assert "__global float* __mtl_global = (__global float*)(__mtl_global_base + __mtl_args[0]);" in t.source
    assert [a.name for a in t.kernels["k"].args] == ["global", "local"]  # Metal's names
    x = np.arange(4, dtype=np.float32)
    (out,) = launch(runner, msl, "k", [x], (1, 1, 1), (4, 1, 1), consts={1: np.int32([10])})
    np.testing.assert_array_equal(out, x + 10)


def test_casts_ternary_loops_branches_and_bool(runner: KernelRunner) -> None:
    msl = """kernel void ctl(device float* out, device const int* n, uint i [[thread_position_in_grid]]) {
      float acc = 0.0f;
      for (int k = 0; k < n[i]; k++) {
        bool odd = (k & 1) != 0;
        if (odd) { acc += (float)k; } else { acc -= float(k) * 0.5f; }
      }
      out[i] = acc > 0.0f ? acc : (float)(int)(acc * 10.0f) / 10.0f;
    }"""
    n = np.int32([0, 3, 6, 9])
    out, _ = launch(runner, msl, "ctl", [np.zeros(4, np.float32), n], (1, 1, 1), (4, 1, 1))

    def ref(m: int) -> float:
        acc = np.float32(0)
        for k in range(m):
            acc = acc + np.float32(k) if k & 1 else acc - np.float32(k) * np.float32(0.5)
        return float(acc) if acc > 0 else int(acc * 10) / 10

    np.testing.assert_allclose(out, [ref(m) for m in n], rtol=1e-6)


def test_helper_functions_defined_before_the_kernel(runner: KernelRunner) -> None:
    msl = """inline float sq(float x) { return x * x; }
    static float dot3(device const float* p, int i) { return sq(p[i]) + sq(p[i + 1]) + sq(p[i + 2]); }
    #define SCALE 0.5f
    #define TWICE(x) ((x) * float(2))
    #define ROOT sqrt
    kernel void norms(device float* out, device const float* p, const uint i [[thread_position_in_grid]]) {
      out[i] = TWICE(ROOT(dot3(p, 3 * i))) * SCALE;
    }"""
    assert "#define TWICE(x) ((x) * ((float)(2)))" in translate(HEAD + msl).source
    p = np.arange(12, dtype=np.float32)
    out, _ = launch(runner, msl, "norms", [np.zeros(4, np.float32), p], (1, 1, 1), (4, 1, 1))
    np.testing.assert_allclose(out, np.linalg.norm(p.reshape(4, 3), axis=1), rtol=1e-6)


def test_struct_constants_and_program_scope_tables(runner: KernelRunner) -> None:
    msl = """struct Params { int n; float scale; };
    constant float lut[4] = {1.0f, 10.0f, 100.0f, 1000.0f};
    constexpr constant int stride = 2;
    kernel void affine(device float* out, constant Params& prm [[buffer(1)]], uint i [[thread_position_in_grid]]) {
      out[i] = (int)i < prm.n ? prm.scale * lut[i % 4] * stride : -1.0f;
    }"""
    src = translate(HEAD + msl).source
    assert "typedef struct Params Params;" in src and "__constant float lut[4]" in src
    params = np.zeros(2, np.int32)
    params[0] = 6
    params[1:] = np.float32([0.5]).view(np.int32)
    (out,) = launch(runner, msl, "affine", [np.zeros(8, np.float32)], (1, 1, 1), (8, 1, 1), consts={1: params})
    np.testing.assert_array_equal(out, [1, 10, 100, 1000, 1, 10, -1, -1])


def test_fixed_width_and_small_integer_types(runner: KernelRunner) -> None:
    msl = """kernel void bytes(device uchar* out, device const uint8_t* in, device short2* s,
                              uint i [[thread_position_in_grid]]) {
      out[i] = (uchar)(in[i] * 3u);
      s[i] = short2((short)i, (short)-i);
    }"""
    x = np.uint8([1, 100, 200, 255])
    out, _, s = launch(runner, msl, "bytes", [np.zeros(4, np.uint8), x, np.zeros(8, np.int16)], (1, 1, 1),
                       (4, 1, 1))
    np.testing.assert_array_equal(out, (x.astype(np.uint32) * 3).astype(np.uint8))
    np.testing.assert_array_equal(s.reshape(4, 2), [[0, 0], [1, -1], [2, -2], [3, -3]])


def test_c_type_spellings_in_parameters_casts_as_type_and_declarations(runner: KernelRunner) -> None:
    msl = """kernel void k(device unsigned char* out, device const signed char* a, device unsigned short* s,
                          device unsigned long* u, device ushort2* v, constant unsigned int& n,
                          uint i [[thread_position_in_grid]]) {
      unsigned x = (unsigned char)(a[i]) + as_type<unsigned int>((float)n) + static_cast<unsigned short>(s[i]);
      signed int y = -1; long int z = y; unsigned long int w = (unsigned long)x;
      out[i] = (unsigned char)x;
      u[i] = w + (unsigned long)(z < 0);
      v[i] = ushort2((unsigned short)i, as_type<unsigned short>((short)y));
    }"""
    t = translate(HEAD + msl)
    assert [a.dtype for a in t.kernels["k"].args] == ["uint8", "int8", "uint16", "uint64", "uint16x2", "uint32"]
    a = np.int8([-3, 5, 100, -128])
    s = np.uint16([1, 65535, 7, 300])
    n = np.uint32(7)
    out, _, _, u, v = launch(runner, msl, "k", [np.zeros(4, np.uint8), a, s, np.zeros(4, np.uint64),
                                                np.zeros(8, np.uint16)], (1, 1, 1), (4, 1, 1),
                             consts={5: n})
    x = (a.astype(np.uint8).astype(np.uint32) + np.float32(7).view(np.uint32) + s).astype(np.uint32)
    np.testing.assert_array_equal(out, x.astype(np.uint8))
    np.testing.assert_array_equal(u, x.astype(np.uint64) + 1)
    np.testing.assert_array_equal(v.reshape(4, 2), [[0, 65535], [1, 65535], [2, 65535], [3, 65535]])


def test_kernels_without_multi_word_type_names_keep_their_tokens() -> None:
    ts = tokenize(HEAD + "kernel void k(device int* x) { long long y = 0; char c = 1; x[0] = (int)y + c; }")
    assert canonical_type_spellings(ts) is ts  # `long long` is not an MSL type name: left for OpenCL to judge
    merged = canonical_type_spellings(tokenize("unsigned short int a; signed b; unsigned\nlong c;"))
    assert [(t.text, t.line, t.col) for t in merged[:-1]] == [
        ("ushort", 1, 1), ("a", 1, 20), (";", 1, 21), ("int", 1, 23), ("b", 1, 30), (";", 1, 31), ("ulong", 1, 33),
        ("c", 2, 6), (";", 2, 7)]


def test_half_runs_in_software_on_any_opencl_device(runner: KernelRunner) -> None:
    msl = """kernel void h(device half* out, device const float* x, uint i [[thread_position_in_grid]]) {
      half v = (half)x[i] * 2.0h;
      out[i] = v;
    }"""
    t = translate(HEAD + msl)
    assert "cl_khr_fp16" not in t.source and "half" not in t.source.split("__kernel")[1]
    assert t.kernels["h"].args[0].dtype == "float16"
    x = np.float32([0.5, 1.25, -3.0, 1000.0])
    out, _ = launch(runner, msl, "h", [np.zeros(4, np.float16), x], (1, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(out, x.astype(np.float16) * np.float16(2))


def test_every_kernel_in_a_library_is_translated() -> None:
    msl = """kernel void a(device float* x [[buffer(0)]]) { x[0] = 1.0f; }
    /* kernel void commented_out(device float* x) {} */
    float helper(float x) { return x; }
    kernel void b(device float* y [[buffer(3)]], constant int& n [[buffer(1)]]) { y[0] = helper(n); }"""
    t = translate(HEAD + msl)
    assert sorted(t.kernels) == ["a", "b"]
    assert kernel_functions(HEAD + msl) == ("a", "b")
    assert [(a.name, a.index) for a in t.kernels["b"].args] == [("y", 3), ("n", 1)]


def test_max_total_threads_attribute_is_kept() -> None:
    msl = "[[max_total_threads_per_threadgroup(256)]] kernel void k(device float* x) { x[0] = 0.0f; }"
    assert translate(HEAD + msl).kernels["k"].max_total_threads_per_threadgroup == 256


# --- refusals: each names the construct, never a wrong answer ---

@pytest.mark.parametrize("path", sorted(TRACES.glob("*.apple9.json")), ids=lambda p: p.stem)
def test_apple9_kernels_translate_and_the_simdgroup_ones_take_the_scratch(path: Path) -> None:
    trace = json.loads(path.read_text())
    for key, prog in trace["programs"].items():
        info = translate(prog["msl"]).kernels[prog["function"]]
        assert info.simd == ("simdgroup_multiply_accumulate" in prog["msl"]), key


def test_apple9_traces_use_simdgroup_matrices_somewhere() -> None:
    used = {path.stem for path in TRACES.glob("*.apple9.json") if "simdgroup_multiply_accumulate" in path.read_text()}
    assert used == {"layernorm_attn.apple9", "mlp.apple9", "mlp_deep.apple9"}


@pytest.mark.parametrize("msl, construct", [
    ("kernel void k(device float* x) { x[0] = simd_shuffle_and_fill_down(x[1], 0.0f, 1u); }",
     "simd_shuffle_and_fill_down"),
    ("kernel void k(device float* x) { x[0] = quad_shuffle_and_fill_up(x[1], 0.0f, 1u); }",
     "quad_shuffle_and_fill_up"),
    ("kernel void k(device atomic_int* x) { atomic_fetch_add_explicit(x, 1, memory_order_relaxed); }", "atomic_int"),
    ("kernel void k(texture2d<float> t, device float* x) { x[0] = 0; }", "texture2d"),
    ("kernel void k(device float* x) { bool4 b = bool4(true); x[0] = 0; }", "bool4"),
    ("kernel void k(device packed_float3* x) { x[0] = 0; }", "packed_float3"),
    ("kernel void k(device float* x) { float4x4 m; x[0] = 0; }", "float4x4"),
    ("kernel void k(device float* x) { vec<float, 8> v; x[0] = 0; }", "vec"),  # vec<float, 2..4> is float2..4
    ("template <typename T> T id(T x) { return x; }", "template"),
    ("kernel void k(device float* x) { x[0] = numeric_limits<float>::max(); }", "numeric_limits"),
    ("kernel void k(device float* x) { x[0] = foo::bar; }", "::"),
    ("kernel void k(device float* x) { x[0] = erfc(x[1]); }", "erfc"),
    ("kernel void k(device float* x, ushort i [[dispatch_simdgroups_per_threadgroup]]) { x[i] = 0; }",
     "[[dispatch_simdgroups_per_threadgroup]]"),
    ("kernel void k(device float* x [[user(a)]]) { x[0] = 0; }", "[[user]]"),
    ("kernel void k(device float* x, float4 v [[stage_in]]) { x[0] = 0; }", "[[stage_in]]"),
    ("kernel void k(device float* x, threadgroup float* t [[threadgroup(0)]]) { x[0] = t[0]; }", "[[threadgroup]]"),
    ("kernel void k(threadgroup_imageblock float* x) { x[0] = 0; }", "threadgroup_imageblock"),
    ("kernel void k(ray_data float* x) { x[0] = 0; }", "ray_data"),
    ("kernel void k(device float& x) { x = 0; }", "device float& x"),
    ("kernel void k(device float* x, int n) { x[0] = n; }", "int n"),
    ("kernel void k(device float* x) { thread float& r = x[0]; r = 1; }", "thread T&"),
    ("kernel void k(device float* x) { [[maybe_unused]] int a = 0; x[0] = a; }", "[[maybe_unused]]"),
    ("kernel void k(device float* x) { if (x[0] > 0) { threadgroup float t[4]; x[0] = t[0]; } }",
     "threadgroup variable"),
    ("void f() { threadgroup float t[4]; }", "threadgroup variable"),
    ("kernel void k(device float* x) { threadgroup_barrier(mem_flags::mem_texture); }", "mem_flags::mem_texture"),
    ("#include <stdio.h>\nkernel void k(device float* x) { x[0] = 0; }", "#include <stdio.h>"),
    ("kernel void k(device float* x) { using namespace std; x[0] = 0; }", "namespace"),
    ("[[visible]] kernel void k(device float* x) { x[0] = 0; }", "[[visible]]"),
    ("kernel void k(device float* x, int i [[thread_position_in_grid]]) { x[i] = 0; }",
     "int [[thread_position_in_grid]]"),
    ("kernel void k(device float* x, uint2 i [[thread_index_in_threadgroup]]) { x[i.x] = 0; }",
     "uint2 [[thread_index_in_threadgroup]]"),
])
def test_unsupported_constructs_are_refused_by_name(msl: str, construct: str) -> None:
    err = refused(msl)
    assert err.construct == construct
    assert "cannot translate" in str(err) and "line" in str(err)


def test_malformed_msl_is_a_compile_error() -> None:
    with pytest.raises(MslSyntaxError, match=r"line 3, column 48: `}` does not close the `\(` of line 3, column 41"):
        translate(HEAD + "kernel void k(device float* x) { x[0] = (1.0f; }")
    with pytest.raises(MslSyntaxError, match="never closed"):
        translate(HEAD + "kernel void k(device float* x) { x[0] = 1.0f;")
    with pytest.raises(KernelCompileError, match="both use buffer index 0"):
        translate(HEAD + "kernel void k(device float* a [[buffer(0)]], device float* b [[buffer(0)]]) { a[0] = b[0]; }")
    with pytest.raises(KernelCompileError, match="outside 0..30"):
        translate(HEAD + "kernel void k(device float* a [[buffer(31)]]) { a[0] = 0; }")
    with pytest.raises(MslSyntaxError, match="expected `kernel void name"):
        translate(HEAD + "kernel float k(device float* a) { a[0] = 0; }")


# --- bounds checks (msl/guard): every access through a buffer pointer is checked; what cannot be followed is refused

def test_each_access_form_is_checked() -> None:
    msl = """kernel void k(device float* a, device const float* b, uint i [[thread_position_in_grid]]) {
      float buf0[2];
      threadgroup float t[4];
      *(buf0+0) = b[i];
      t[i] = *(b + i);
      *((device float2*)(a + 2 * i)) = *((device const float2*)((b + i)));
      a[i] += buf0[0] + t[0] + buf0[i];
    }"""
    src = translate(HEAD + msl).source
    # b[i]: a read of binding 1 (code 2 * 1 + 1); a private array's constant element in bounds stays as it was
    assert "*(buf0+0) = (*({ __auto_type __mtl_a0 = (b + (i)); __MTL_CHK(__mtl_a0, __mtl_s_b, __mtl_n_b, 3u); }));" \
        in src
    # a threadgroup array: checked against its own bytes, code 2 * (2 bindings + array 1) + 2 for a write
    assert ("(*({ __auto_type __mtl_a1 = (t + (i)); __MTL_CHK_L(__mtl_a1, (ulong)t, sizeof(t), 8u); })) = "
            "(*({ __auto_type __mtl_a2 = ((b + i)); __MTL_CHK(__mtl_a2, __mtl_s_b, __mtl_n_b, 3u); }));") in src
    # a store through a vector cast: vstore2 (any element offset), code 2 * 0 + 2; its value, a vload2 of b
    assert ("({ __auto_type __mtl_a4 = (((__global __mtl_float2_u*)(a + 2 * i))); __global float* __mtl_p4 = "
            "(__global float*)__MTL_CHK(__mtl_a4, __mtl_s_a, __mtl_n_a, 2u); float2 __mtl_v4 = ( vload2(0, "
            "(const __global float*)({ __auto_type __mtl_a3 = (((__global const __mtl_float2_u*)((b + i)))); "
            "__MTL_CHK(__mtl_a3, __mtl_s_b, __mtl_n_b, 3u); }))); vstore2(__mtl_v4, 0, __mtl_p4); __mtl_v4; })") in src
    assert ("+= buf0[0] + t[0] + (*({ __auto_type __mtl_a6 = (buf0 + (i)); __MTL_CHK_P(__mtl_a6, (ulong)buf0, "
            "sizeof(buf0), 5u); }));") in src  # a private array at a run-time index: checked
    assert "const ulong __mtl_s_a = (ulong)a_base - __mtl_args[1], __mtl_n_a = __mtl_args[2];" in src
    assert "__local uchar __mtl_lscratch[256]" in src and "uchar __mtl_pscratch[256]" in src
    arrays = translate(HEAD + msl).kernels["k"].arrays
    assert [(x.name, x.memory, x.elem) for x in arrays] == [("buf0", "thread", 4), ("t", "threadgroup", 4)]


def test_a_guarded_load_in_a_ternary_is_only_checked_when_taken(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* out, device const float* x, uint i [[thread_position_in_grid]]) {
      bool far = i > 100;
      out[i] = far ? *(x + (i + 100000000)) : x[i] * 2.0f;
    }"""
    x = np.arange(4, dtype=np.float32)
    out, _ = launch(runner, msl, "k", [np.zeros(4, np.float32), x], (1, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(out, 2 * x)


@pytest.mark.parametrize("body,construct,why", [
    ("*((device float*)(ulong(i) * 4)) = 1.0f;", "*", "does not come from a buffer parameter"),
    ("device float* q = i > 2 ? a : b; q[0] = 1.0f;", "a, b", "mixes the buffer pointers a, b"),
    ("ulong addr = (ulong)a; b[0] = addr;", "a", "cannot follow this use of the buffer pointer `a`"),
    ("if (a == b) { a[0] = 1.0f; }", "a", "cannot follow this use"),
    ("device float* q; q[0] = 1.0f;", "q", "used before it is initialised or assigned from a buffer"),
    ("device float *q = a, *r = b; q[0] = r[0];", "q", "one device pointer per declaration"),
    ("device float* q = a; q = b; q[0] = 1.0f;", "q", "a pointer into another buffer"),
    ("ulong x = (ulong)(device float*)(i * 4u); a[0] = x;", "(device T*)", "a cast to a device or constant pointer"),
])
def test_a_buffer_pointer_the_translator_cannot_follow_is_refused(body: str, construct: str, why: str) -> None:
    err = refused(f"kernel void k(device float* a, device float* b, uint i [[thread_position_in_grid]]) {{ {body} }}")
    assert err.construct == construct and why in str(err)


def test_macros_structs_and_prototypes_that_hide_buffer_pointers_are_refused() -> None:
    err = refused("#define FIRST a[0]\nkernel void k(device float* a) { FIRST = 1.0f; }")
    assert err.construct == "#define FIRST" and "names the buffer parameter `a`" in str(err)
    err = refused("struct S { device float* p; };\nkernel void k(device float* a) { a[0] = 1.0f; }")
    assert err.construct == "device T*"
    err = refused("#define AT(p, k) p[k]\nkernel void k(device float* a) { AT(a, 0) = 1.0f; }")
    assert err.construct == "a" and "cannot follow this use" in str(err)
    err = refused("device float* at(ulong x) { return (device float*)x; }\n"
                  "kernel void k(device float* a) { *at(0) = 1.0f; }")
    assert err.construct == "at()" and "returning a device or constant pointer" in str(err)
    # without the checks (reading a translation only) the same source translates
    assert "FIRST" in translate(HEAD + "#define FIRST a[0]\nkernel void k(device float* a) { FIRST = 1.0f; }",
                                bounds_checks=False).source


def test_an_attribute_closed_but_never_opened_is_a_syntax_error() -> None:
    with pytest.raises(MslSyntaxError, match="`]]` closes no `\\[\\[` attribute"):
        translate(HEAD + "kernel void k(device float* a, uint3 lid [;[thread_position_in_threadgroup]]) { a[0] = 1; }")


def test_every_trace_kernel_translates_with_the_checks() -> None:
    for path in sorted(TRACES.glob("*.json")):
        for key, prog in json.loads(path.read_text())["programs"].items():
            src = translate(prog["msl"]).source
            assert "__MTL_CHK(" in src, key


def test_loops_end_after_a_fault_unless_they_hold_a_barrier() -> None:
    msl = """float twice(float x) { return 2.0f * x; }
    kernel void k(device float* a, uint i [[thread_position_in_grid]]) {
      threadgroup float t[4];
      for (int j = 0; j < 4; j++) a[j] = 1.0f;
      int n = 4;
      while (n > 0) n--;
      do { n++; } while (n < 2);
      for (;;) { break; }
      for (int j = 0; j < 4; j++) { t[j] = 0.0f; threadgroup_barrier(mem_flags::mem_threadgroup); }
      for (int j = 0; j < 4; j++) a[j] = twice(a[j]);
    }"""
    src = translate(HEAD + msl).source
    assert "for (int j = 0; (j < 4) && !__MTL_FAULTED; j++)" in src
    assert "while ((n > 0) && !__MTL_FAULTED) n--;" in src and "while ((n < 2) && !__MTL_FAULTED);" in src
    assert "for (; !__MTL_FAULTED;)" in src
    assert src.count("for (int j = 0; j < 4; j++)") == 2  # a barrier in it, a call of the source's function
