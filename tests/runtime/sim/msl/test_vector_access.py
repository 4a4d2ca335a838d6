"""Vector loads and stores through pointers at any element offset: every form the translator accepts is a
``vloadN``/``vstoreN`` or an access to the vector's elements (OpenCL C §6.15.10: they need only the element's
alignment), so a ``float4`` at a 4-byte offset runs on any OpenCL device (NVIDIA's faults on a misaligned ``float4``
dereference, even through the element-aligned typedef; docs/kernels.md), with and without the bounds checks, in
device, threadgroup and thread memory."""
from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.msl.translate import translate

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


def run(runner: KernelRunner, msl: str, arrays: list[np.ndarray], offsets: tuple[int, ...] = (),
        threads: int = 1) -> list[np.ndarray]:
    """Bind ``arrays`` at buffer indices 0.. (array n at byte offset ``offsets[n]``, 0 past them), run kernel ``k``
    on ``threads`` threads, return the arrays after the run."""
    storages = [np.frombuffer(a.tobytes(), np.uint8).copy() for a in arrays]
    bindings = {n: (s, offsets[n] if n < len(offsets) else 0) for n, s in enumerate(storages)}
    runner.compile(HEAD + msl, "k").run(bindings, (threads, 1, 1), (1, 1, 1))
    return [s.view(a.dtype).reshape(a.shape) for s, a in zip(storages, arrays)]


def run_unchecked(runner: KernelRunner, msl: str, arrays: list[np.ndarray], offsets: tuple[int, ...] = (),
                  threads: int = 1) -> list[np.ndarray]:
    """``run`` for the translation without bounds checks (``translate(bounds_checks=False)``, what the Oclgrind
    check and the fuzzing's reference run), built and launched here with pyopencl on the runner's device: kernel
    ``k`` whose parameters are the buffers at indices 0.. (array n at byte offset ``offsets[n]``) then the
    threads' positions. The source is built ``strict``: it must dereference no vector pointer."""
    cl = runner.cl
    t = translate(HEAD + msl, bounds_checks=False)
    program = cl.Program(runner.context, strict(t.source)).build()  # it dereferences no vector (strict)
    mf = cl.mem_flags
    bufs = [cl.Buffer(runner.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a))
            for a in arrays]
    block = np.zeros(3 * len(arrays), np.uint64)
    for n, a in enumerate(arrays):
        off = offsets[n] if n < len(offsets) else 0
        block[3 * n:3 * n + 3] = (off, off, a.nbytes - off)
    args = cl.Buffer(runner.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=block)
    fault = cl.Buffer(runner.context, mf.READ_WRITE, 1 << 16)
    kernel = getattr(program, t.kernels["k"].opencl_function)
    kernel(runner.queue, (threads,), (1,), *bufs, args, fault)
    out = [np.empty_like(a) for a in arrays]
    for host, buf in zip(out, bufs):
        cl.enqueue_copy(runner.queue, host, buf)
    runner.queue.finish()
    return out


_ALIAS = re.compile(r"typedef ([a-z]+?)([234]) (__mtl_\w+_u) __attribute__\(\(aligned\(\d+\)\)\);")


def strict(src: str) -> str:
    """``src`` with each element-aligned vector alias (``typedef float4 __mtl_float4_u ...``) made a struct of the
    vector's size, ``typedef struct { float e[4]; } __mtl_float4_u;``: pointer arithmetic and ``vloadN`` through a
    cast still compile, but any dereference of a vector pointer gives a struct, which no vector expression accepts,
    so the source compiles only when no vector is dereferenced."""
    def struct(m: re.Match[str]) -> str:
        n = 4 if m[2] == "3" else int(m[2])
        return f"typedef struct {{ {m[1]} e[{n}]; }} {m[3]};"
    out, n = _ALIAS.subn(struct, src)
    assert n, "no vector alias in the source"
    return out


def assert_no_vector_dereference(runner: KernelRunner, src: str) -> None:
    """The translated ``src`` compiles with the vector aliases made structs (``strict``)."""
    runner.cl.Program(runner.context, strict(src)).build()


def test_a_cast_read_store_and_compound_store_at_element_offsets(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* out, device const float* in, uint i [[thread_position_in_grid]]) {
      float4 v = *((device const float4*)(in + 1 + 4 * i));
      *((device float4*)(out + 3 + 4 * i)) = v * 2.0f;
      *((device float2*)(out + 1 + 4 * i)) += *((device const float2*)(in + 2 + 4 * i));
      *((device float4*)(out + 11 + 4 * i)) -= 1.0f;
    }"""
    src = translate(HEAD + msl).source
    assert src.count("vload4(0, (const __global float*)") == 1 and src.count("vstore4(") == 2
    assert "__mtl_v3 = vload2(0, __mtl_p3) + (" in src and "vstore2(__mtl_v3, 0, __mtl_p3)" in src
    assert "(*({" not in src  # no vector dereference is left
    x = np.arange(1, 10, dtype=np.float32)
    out, _ = run(runner, msl, [np.full(16, 10, np.float32), x])
    want = np.full(16, 10, np.float32)
    want[1:3] += x[2:4]
    want[3:7] = x[1:5] * 2
    want[11:15] -= 1
    np.testing.assert_array_equal(out, want)


def test_the_address_of_a_compound_store_is_evaluated_once(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* out, uint i [[thread_position_in_grid]]) {
      int j = 1;
      *((device float2*)(out + j++)) += float2(5.0f, 7.0f);
      out[7] = float(j);
    }"""
    assert "vstore2(" in translate(HEAD + msl).source
    out, = run(runner, msl, [np.ones(8, np.float32)])
    np.testing.assert_array_equal(out, [1, 6, 8, 1, 1, 1, 1, 2])


def test_a_vector_pointer_variable_indexed_and_through_arrow(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* out, uint i [[thread_position_in_grid]]) {
      device float4* q = (device float4*)(out + 1);
      q[1] = q[0] + float4(1.0f, 2.0f, 3.0f, 4.0f);
      q[2] *= 3.0f;
      out[17] = q->y + q[1].w;
      *(q + 3) = *q;
      q->x = 9.0f;
      q[4].z += 0.5f;
    }"""
    src = translate(HEAD + msl).source
    assert src.count("vstore4(") == 3 and src.count("vload4(") == 3
    # out[17]; q->y, q[1].w, q->x = e, q[4].z += e: the element's own address, a float pointer checked as one element
    assert src.count("(*({") == 5 and src.count("= (__global float*)(q") == 4
    x = np.arange(21, dtype=np.float32)
    out, = run(runner, msl, [x])
    want = x.copy()
    want[5:9] = x[1:5] + [1, 2, 3, 4]
    want[9:13] = x[9:13] * 3
    want[17] = x[2] + want[8]
    want[13:17] = x[1:5]  # *(q + 3) = *q comes before q->x = 9
    want[1] = 9
    want[19] += 0.5
    np.testing.assert_array_equal(out, want)


def test_vector_buffer_parameters_and_constant_vectors_at_a_4_byte_offset(runner: KernelRunner) -> None:
    msl = """kernel void k(device float4* v, device const half4* h, constant float4& c,
                       uint i [[thread_position_in_grid]]) {
      v[i] = v[i] * c + float4(h[i]);
    }"""
    src = translate(HEAD + msl).source
    assert "vload4(0, (__global const float*)(c_base + " in src and "vload4(0, (const __global ushort*)" in src
    assert "vstore4(" in src and "(*({" not in src
    v = np.arange(1, 10, dtype=np.float32)  # bound at byte 4: v[0] is elements 1..4
    h = np.arange(9, dtype=np.float16) / 4
    c = np.float32([0, 2, 0, 0.5, -1])
    out, _, _ = run(runner, msl, [v, h, c], offsets=(4, 2, 4), threads=2)
    want = v.copy()
    want[1:9] = v[1:9] * np.tile(c[1:5], 2) + h[1:9].astype(np.float32)
    np.testing.assert_array_equal(out, want)


def test_half_vectors_through_casts_at_element_offsets(runner: KernelRunner) -> None:
    msl = """kernel void k(device half* out, device const half* in, uint i [[thread_position_in_grid]]) {
      half4 a = *((device const half4*)(in + 1));
      *((device half4*)(out + 3)) = a + half4(1.0h);
      *((device half2*)(out + 1)) = *((device const half2*)(in + 5));
    }"""
    src = translate(HEAD + msl).source
    assert "vload4(0, (const __global ushort*)" in src and "vstore4(" in src and "vstore2(" in src
    x = np.arange(8, dtype=np.float16) / 2
    out, _ = run(runner, msl, [np.ones(8, np.float16), x])
    want = np.ones(8, np.float16)
    want[3:7] = x[1:5] + np.float16(1)
    want[1:3] = x[5:7]
    np.testing.assert_array_equal(out, want)


RUNS = [pytest.param(run, id="checked"), pytest.param(run_unchecked, id="unchecked")]
Run = Callable[..., list[np.ndarray]]  # run or run_unchecked


@pytest.mark.parametrize("run_k", RUNS)
def test_stores_into_swizzles_through_pointers(runner: KernelRunner, run_k) -> None:  # type: ignore[no-untyped-def]
    msl = """kernel void k(device float* out, uint i [[thread_position_in_grid]]) {
      device float4* q = (device float4*)(out + 1);
      q->xy = float2(1.0f, 2.0f);
      (*q).w = 3.0f;
      (*(q + 1)).zw += float2(10.0f, 20.0f);
      q[2].yx -= float2(5.0f, 6.0f);
      (*((device float4*)(out + 13))).z = 4.0f;
      float2 r = ((*((device float4*)(out + 17))).xz = float2(7.0f, 8.0f));
      out[23] = r.y + (*q).y;
    }"""
    for checks in (True, False):
        src = translate(HEAD + msl, bounds_checks=checks).source
        assert "__mtl_p0[0] = __mtl_v0.s0; __mtl_p0[1] = __mtl_v0.s1;" in src  # q->xy: x and y alone
        assert "__mtl_v3 = ((float2)(__mtl_p3[1], __mtl_p3[0])) - (" in src  # q[2].yx -= e
        assert src.count("vstore") == 0
        assert_no_vector_dereference(runner, src)
    x = np.arange(24, dtype=np.float32)
    out, = run_k(runner, msl, [x])
    want = x.copy()
    want[1:3] = [1, 2]
    want[4] = 3
    want[7:9] += [10, 20]
    want[9:11] -= [6, 5]
    want[15] = 4
    want[17], want[19] = 7, 8
    want[23] = 8 + 2
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("run_k", RUNS)
def test_increments_of_vectors_through_pointers(runner: KernelRunner, run_k) -> None:  # type: ignore[no-untyped-def]
    msl = """kernel void k(device float* out, uint i [[thread_position_in_grid]]) {
      device float4* q = (device float4*)(out + 1);
      float4 a = ++*q;
      float4 b = (*(q + 1))++;
      --q[2];
      q[3]--;
      ++(*((device float2*)(out + 17)));
      q->zw++;
      *((device float4*)(out + 20)) = a + b;
    }"""
    for checks in (True, False):
        src = translate(HEAD + msl, bounds_checks=checks).source
        assert src.count("vstore4(") == 5 and src.count("vstore2(") == 1
        assert_no_vector_dereference(runner, src)
        assert "__mtl_v0 = __mtl_o0 + (float4)(1); vstore4(__mtl_v0, 0, __mtl_p0); __mtl_v0; })" in src
    x = np.arange(24, dtype=np.float32)
    out, = run_k(runner, msl, [x])
    want = x.copy()
    want[1:5] += 1
    want[5:9] += 1
    want[9:13] -= 1
    want[13:17] -= 1
    want[17:19] += 1
    want[3:5] += 1
    want[20:24] = (x[1:5] + 1) + x[5:9]
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("run_k", RUNS)
def test_pointers_the_checks_did_not_type_before(runner: KernelRunner, run_k) -> None:  # type: ignore[no-untyped-def]
    msl = """kernel void k(device float* out, uint i [[thread_position_in_grid]]) {
      device float4* q = (device float4*)(out + 1);
      int n = 1;
      *(n + q) = *(2 * n + q) + 1.0f;
      *(2 + (device float2*)(out + 13)) += float2(100.0f, 200.0f);
    }"""
    for checks in (True, False):
        src = translate(HEAD + msl, bounds_checks=checks).source
        assert src.count("vstore4(") == 1 and src.count("vload4(") == 1 and src.count("vstore2(") == 1
        assert_no_vector_dereference(runner, src)
    x = np.arange(20, dtype=np.float32)
    out, = run_k(runner, msl, [x])
    want = x.copy()
    want[5:9] = x[9:13] + 1
    want[17:19] += [100, 200]
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("run_k", RUNS)
def test_threadgroup_and_thread_vectors_through_pointers(runner: KernelRunner, run_k) -> None:  # type: ignore[no-untyped-def]
    msl = """kernel void k(device float* out, device const float* in, uint i [[thread_position_in_grid]]) {
      threadgroup float tg[16];
      thread float acc[12];
      for (int j = 0; j < 16; j++) { tg[j] = in[j]; }
      for (int j = 0; j < 12; j++) { acc[j] = 0.0f; }
      *((threadgroup float4*)(tg + 1)) += 1.0f;
      threadgroup float4* t = (threadgroup float4*)(tg + 5);
      t[1] = t[0] * 2.0f;
      t->yz = float2(-1.0f, -2.0f);
      ++*t;
      thread float4* a = (thread float4*)(acc + 1);
      *a = *((threadgroup float4*)(tg + 1));
      a[1].xw = float2(3.0f, 4.0f);
      (*(a + 1)).y += 5.0f;
      for (int j = 0; j < 16; j++) { out[j] = tg[j]; }
      for (int j = 0; j < 12; j++) { out[16 + j] = acc[j]; }
    }"""
    for checks in (True, False):
        src = translate(HEAD + msl, bounds_checks=checks).source
        assert "vload4(0, (const __local float*)" in src and "vstore4(" in src
        assert "(const __private float*)" not in src  # *a = ...: a store, no load
        assert "__private float* __mtl_p" in src and "__local float* __mtl_p" in src
        assert_no_vector_dereference(runner, src)
    x = np.arange(16, dtype=np.float32)
    out, _ = run_k(runner, msl, [np.zeros(28, np.float32), x])
    tg = x.copy()
    tg[1:5] += 1
    tg[9:13] = tg[5:9] * 2
    tg[6:8] = [-1, -2]
    tg[5:9] += 1
    acc = np.zeros(12, np.float32)
    acc[1:5] = tg[1:5]
    acc[5], acc[8] = 3, 4
    acc[6] += 5
    np.testing.assert_array_equal(out, np.concatenate([tg, acc]))


@pytest.mark.parametrize("run_k", RUNS)
def test_vector_parameters_and_helpers_at_a_4_byte_offset(runner: KernelRunner, run_k) -> None:  # type: ignore[no-untyped-def]
    msl = """void bump(device float4* p, threadgroup float4* s, int n) { p[n] += s[0]; p[n + 1].zy = s->xy; }
    kernel void k(device float4* v, device const half4* h, uint i [[thread_position_in_grid]]) {
      threadgroup float s[5];
      *((threadgroup float4*)(s + 1)) = float4(h[0]);
      bump(v, (threadgroup float4*)(s + 1), 0);
      v[2]++;
    }"""
    for checks in (True, False):
        src = translate(HEAD + msl, bounds_checks=checks).source
        assert_no_vector_dereference(runner, src) and "vload4(0, (const __global ushort*)" in src
    v = np.arange(13, dtype=np.float32)  # bound at byte 4: v[0] is elements 1..4
    h = np.arange(5, dtype=np.float16) / 4
    out, _ = run_k(runner, msl, [v, h], offsets=(4, 2))
    want = v.copy()
    want[1:5] += h[1:5].astype(np.float32)
    want[7], want[6] = h[1], h[2]
    want[9:13] += 1
    np.testing.assert_array_equal(out, want)


def test_a_prefix_increment_of_a_swizzle_through_a_pointer_is_refused() -> None:
    from mtlir.errors import UnsupportedKernelError
    with pytest.raises(UnsupportedKernelError, match=r"\+\+->xy.*prefix increment"):
        translate(HEAD + "kernel void k(device float4* p) { ++p->xy; }")


def test_the_strict_build_refuses_a_vector_dereference(runner: KernelRunner) -> None:
    src = translate(HEAD + "kernel void k(device float4* p) { p[0] = p[1]; }").source
    runner.cl.Program(runner.context, strict(src)).build()
    bad = src.replace("vload4(0, (const __global float*)", "*((__global __mtl_float4_u*)", 1)
    with pytest.raises(runner.cl.RuntimeError):
        runner.cl.Program(runner.context, strict(bad)).build()


@pytest.mark.parametrize("run_k", RUNS)
def test_conditional_comma_and_cast_pointers_indexed_or_dereferenced(runner: KernelRunner, run_k: Run) -> None:
    msl = """kernel void k(device float* a, device float* o, uint t [[thread_position_in_grid]]) {
      device float4* p = (device float4*)(a + 1 + 32 * t);
      device float4* q = (device float4*)(a + 5 + 32 * t);
      *(t == 0 ? p : q) = float4(1.0f, 2.0f, 3.0f, 4.0f);
      *(t == 0 ? q : p) += float4(10.0f, 20.0f, 30.0f, 40.0f);
      (t == 0 ? p : q)[2] = float4(5.0f, 6.0f, 7.0f, 8.0f);
      (t == 0 ? q : p)[3].y = 9.0f;
      *(t, p + 4) *= 2.0f;
      device float4* u = p + 5;
      *++u += 1000.0f;
      device float4* w = &(t == 0 ? p : q)[6 - t];
      w->y = -5.0f;
      ++(t == 0 ? p : q)[1];
      (t != 0 ? p : q)->zw -= float2(0.5f, 0.25f);
      ((device float4*)(a + 1 + 32 * t))[5].x += 100.0f;
      o[2 * t] = (t == 0 ? p : q)[1].z + ((device float4*)(a + 1 + 32 * t))[5].w;
      float4 r = ((device float4*)(a + 2 + 32 * t))[0];
      o[2 * t + 1] = r.x - r.w;
    }"""
    for checks in (True, False):
        src = translate(HEAD + msl, bounds_checks=checks).source
        assert src.count("vstore4(") == 6
        assert_no_vector_dereference(runner, src)
    x = np.arange(64, dtype=np.float32)
    out, o = run_k(runner, msl, [x, np.zeros(4, np.float32)], threads=2)
    want, want_o = x.copy(), np.zeros(4, np.float32)
    for t in range(2):
        p, q = 1 + 32 * t, 5 + 32 * t
        c, d = (p, q) if t == 0 else (q, p)
        want[c:c + 4] = [1, 2, 3, 4]
        want[d:d + 4] += [10, 20, 30, 40]
        want[c + 8:c + 12] = [5, 6, 7, 8]
        want[d + 13] = 9
        want[p + 16:p + 20] *= 2
        want[p + 24:p + 28] += 1000
        want[p + 25] = -5
        want[c + 4:c + 8] += 1
        want[d + 2:d + 4] -= [0.5, 0.25]
        want[p + 20] += 100
        want_o[2 * t] = want[c + 6] + want[p + 23]
        want_o[2 * t + 1] = want[p + 1] - want[p + 4]
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(o, want_o)


@pytest.mark.parametrize("run_k", RUNS)
def test_elements_and_addresses_of_vectors_through_pointers_stay_lvalues(runner: KernelRunner, run_k: Run) -> None:
    msl = """kernel void k(device float* a, device half* h, uint t [[thread_position_in_grid]]) {
      device float4* p = (device float4*)(a + 1);
      (&p[1])->x = 7.0f;
      (&p[0])[2] = float4(1.0f, 2.0f, 3.0f, 4.0f);
      *(&p[3]) = p[2] + 1.0f;
      p[4][2] = 5.0f;
      p[4][t + 1] += 10.0f;
      (*p)[3] -= 1.0f;
      a[0] = p[2][1] + (*(p + 4))[2];
      device half4* hp = (device half4*)(h + 1);
      hp[1][2] = 5.0h;
      hp[0][3] += 1.0h;
      threadgroup float s[12];
      for (int j = 0; j < 12; j++) { s[j] = float(j); }
      threadgroup float4* u = (threadgroup float4*)(s + 1);
      (&u[1])->y = 70.0f;
      u[0][1] = 80.0f;
      a[21] = s[6] + s[2];
    }"""
    for checks in (True, False):
        src = translate(HEAD + msl, bounds_checks=checks).source
        assert "= (__global float*)(p + (4)) + (2);" in src  # p[4][2]: the element's own address
        assert_no_vector_dereference(runner, src)
    x = np.arange(22, dtype=np.float32)
    hx = np.arange(10, dtype=np.float16)
    out, hout = run_k(runner, msl, [x, hx])
    want = x.copy()
    want[5] = 7
    want[9:13] = [1, 2, 3, 4]
    want[13:17] = want[9:13] + 1
    want[19] = 5
    want[18] += 10
    want[4] -= 1
    want[0] = want[10] + want[19]
    want[21] = 70 + 80
    hwant = hx.copy()
    hwant[7] = 5
    hwant[4] += 1
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(hout, hwant)


@pytest.mark.parametrize("run_k", RUNS)
def test_vector_pointers_declared_in_for_loop_headers(runner: KernelRunner, run_k: Run) -> None:
    msl = """kernel void k(device float* a, uint t [[thread_position_in_grid]]) {
      device float4* p = (device float4*)(a + 1);
      for (device float4* r = p; r < p + 2; ++r) { *r += 1.0f; }
      int n = 0;
      for (device float4* r = (device float4*)(a + 9); r != (device float4*)(a + 17); r++, n++) { r->w = float(n); }
    }"""
    for checks in (True, False):
        assert_no_vector_dereference(runner, translate(HEAD + msl, bounds_checks=checks).source)
    x = np.arange(18, dtype=np.float32)
    out, = run_k(runner, msl, [x])
    want = x.copy()
    want[1:9] += 1
    want[12], want[16] = 0, 1
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("body,construct,why", [
    ("device float4* ps[2] = {(device float4*)(a + 1), (device float4*)(a + 5)}; *ps[1] = 1.0f;", "ps",
     "an array of pointers to vectors"),
    ("device float4* p = (device float4*)(a + 1); thread device float4** pp = &p; **pp = 1.0f;", "**",
     "a pointer to a pointer to vectors"),
    ("*(t == 0 ? (device float4*)(a + 1) : (device float4*)(b + 1)) = 1.0f;", "a, b", "mixes the buffer pointers a, b"),
    ("} device float4* at(device float* a) { return (device float4*)(a + 1); } void unused() {", "at()",
     "a function returning a pointer to vectors"),
    ("} struct S { thread float4* v; }; void unused() {", "thread T*", "pointers to vectors outside a function"),
    ("(t == 0 ? (device float4*)(a + 1) : (device float4*)(b + 1))[1] = 1.0f;", "a, b", "mixes the buffer pointers"),
    ("typedef device float4* F4P; F4P p = (F4P)(a + 1); *p += 1.0f;", "typedef F4P",
     "a typedef of a pointer to, a reference to or an array of a vector type"),
    ("threadgroup float s[12]; typedef threadgroup float4* TP; TP p = (TP)(s + 1); *p += 1.0f;", "typedef TP",
     "a typedef of a pointer to"),
    ("typedef half4 H; typedef H A[2]; thread A x;", "typedef A", "an array of a vector type"),
])
def test_vector_pointers_the_translator_cannot_follow_are_refused_with_and_without_checks(
        body: str, construct: str, why: str) -> None:
    from mtlir.errors import UnsupportedKernelError
    msl = f"kernel void k(device float* a, device float* b, uint t [[thread_position_in_grid]]) {{ {body} }}"
    for checks in (True, False):
        with pytest.raises(UnsupportedKernelError, match=why) as got:
            translate(HEAD + msl, bounds_checks=checks)
        assert got.value.construct == construct


@pytest.mark.parametrize("run_k", RUNS)
@pytest.mark.parametrize("alias", [
    pytest.param("typedef float4 V;\n", id="file-typedef"),
    pytest.param("#define V float4\n", id="define"),
    pytest.param("typedef float4 W;\ntypedef W V;\n", id="typedef-of-typedef"),
    pytest.param("typedef metal::float4 V;\n", id="typedef-metal-namespace"),
    pytest.param("#define V metal::float4\n", id="define-metal-namespace"),
    pytest.param("#define V metal::float4\n#undef V\n#define V float4\n", id="undef"),
    pytest.param("#define W float4\n#define V W\n", id="define-of-define"),
    pytest.param("#define U 1\n#define V vec<float, 4>\n", id="define-of-the-template-spelling"),
    pytest.param("", id="local-typedef"),
])
def test_vector_types_under_another_name_load_and_store_at_any_offset(runner: KernelRunner, run_k: Run,
                                                                       alias: str) -> None:
    local = "typedef float4 V;" if not alias else ""
    msl = alias + f"""kernel void k(device float* a, device half* h, uint t [[thread_position_in_grid]]) {{
      {local}
      device V* p = (device V*)(a + 1);
      *p += 1.0f;
      device metal::float4* q = (device metal::float4*)(a + 5);
      q->y = 7.0f;
      V x = V(2.0f);
      (p + 2)->w = x.z + float(h[1]);
    }}"""
    for checks in (True, False):
        src = translate(HEAD + msl, bounds_checks=checks).source
        assert_no_vector_dereference(runner, src)
    a = np.arange(13, dtype=np.float32)
    out, _ = run_k(runner, msl, [a, np.array([0, 0.5], np.float16)])
    want = a.copy()
    want[1:5] += 1
    want[6] = 7
    want[12] = 2.5
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("run_k", RUNS)
def test_a_half_vector_typedef_is_computed_in_software(runner: KernelRunner, run_k: Run) -> None:
    msl = """typedef half4 H;
    kernel void k(device half* h, uint t [[thread_position_in_grid]]) {
      device H* p = (device H*)(h + 1);
      H x = *p;
      *p = x * 2.0h;
      p->w = 9.0h;
    }"""
    h = (np.arange(6) * 0.5).astype(np.float16)
    out, = run_k(runner, msl, [h])
    np.testing.assert_array_equal(out, np.array([0, 1, 2, 3, 9, 2.5], np.float16))


@pytest.mark.parametrize("run_k", RUNS)
def test_a_typedef_name_is_resolved_only_in_its_scope_and_not_as_a_member(runner: KernelRunner, run_k: Run) -> None:
    msl = """struct S { float V; };
    kernel void k(device float* a, device S* s, uint t [[thread_position_in_grid]]) {
      { typedef float4 V; device V* p = (device V*)(a + 1); *p = V(s->V); { typedef float V; V x = 1.5f; a[5] = x; } }
      float V = 2.0f;
      a[0] = V;
    }"""
    out, _ = run_k(runner, msl, [np.zeros(6, np.float32), np.array([3.0], np.float32)])
    np.testing.assert_array_equal(out, [2, 3, 3, 3, 3, 1.5])


@pytest.mark.parametrize("run_k", RUNS)
@pytest.mark.parametrize("kind", ["half", "bfloat"])
def test_a_component_of_a_16_bit_float_vector_through_arrow(runner: KernelRunner, run_k: Run, kind: str) -> None:
    def c(x: str) -> str:  # a constant of the kind
        return f"{x}h" if kind == "half" else f"bfloat({x}f)"
    msl = f"""kernel void k(device float* o, device {kind}* h, uint t [[thread_position_in_grid]]) {{
      device {kind}4* v = (device {kind}4*)(h + 1);
      o[0] = v->x;
      o[1] = float(v->y);
      o[2] = v->xy.y + 0.25f;
      o[3] = (t == 0 ? v : v + 1)->w;
      v->z += {c('1.0')};
      threadgroup {kind} s[8];
      for (int j = 0; j < 8; j++) s[j] = h[j];
      threadgroup {kind}4* u = (threadgroup {kind}4*)(s + 1);
      o[4] = u->y;
      u->w = {c('3.0')};
      o[5] = s[4];
      v[1].y = {c('4.0')};
      (v + 1)->x = {c('0.5')};
    }}"""
    for checks in (True, False):
        assert_no_vector_dereference(runner, translate(HEAD + msl, bounds_checks=checks).source)
    vals = np.arange(10, dtype=np.float32) * 0.5
    if kind == "half":
        h = vals.astype(np.float16)
    else:
        h = (vals.view(np.uint32) >> 16).astype(np.uint16)  # exact in bfloat: the top 16 bits
    o, hh = run_k(runner, msl, [np.zeros(6, np.float32), h])
    np.testing.assert_array_equal(o, [0.5, 1.0, 1.25, 2.0, 1.0, 3.0])
    got = hh.astype(np.float32) if kind == "half" else (hh.astype(np.uint32) << 16).view(np.float32)
    want = vals.copy()
    want[3] += 1
    want[5], want[6] = 0.5, 4.0
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("run_k", RUNS)
def test_one_component_of_a_vector_straddling_the_buffer_end(runner: KernelRunner, run_k: Run) -> None:
    from mtlir.errors import KernelAccessError
    msl = """kernel void k(device float* a, uint t [[thread_position_in_grid]]) {
      device float4* p = (device float4*)(a + 6);
      p->x = 5.0f;
      p[0].z += p->y + 1.0f;
    }"""
    x = np.arange(9, dtype=np.float32)
    out, = run_k(runner, msl, [x])
    want = x.copy()
    want[6], want[8] = 5, 8 + 7 + 1
    np.testing.assert_array_equal(out, want)  # only a[6..8] are touched: in bounds on Metal
    if run_k is run:
        with pytest.raises(KernelAccessError, match="wrote 4 bytes out of bounds"):
            run(runner, msl.replace("p->x = 5.0f;", "p->w = 5.0f;"), [x])
