"""Vector loads and stores through device pointers at any element offset: every form the translator accepts is a
``vloadN``/``vstoreN`` (OpenCL C §6.15.10: they need only the element's alignment), so a ``float4`` at a 4-byte
offset runs on any OpenCL device (NVIDIA's faults on a misaligned ``float4`` dereference; docs/kernels.md)."""
from __future__ import annotations

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
    assert src.count("(*({") == 1  # out[17]; q->y, q[1].w, q->x = e, q[4].z += e: the element, a float pointer
    assert src.count("(*((__global float*)({ __auto_type") == 4
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
