"""Metal's multi-word scalar type names (``unsigned char``, ``signed char``, ``unsigned short``, ``unsigned long``,
``unsigned int``) in vector forms (``vec<T, N>``, MSL spec §2.2) and inside ``as_type<...>``, as tinygrad's
MetalRenderer and hand-written kernels spell them (issue 11): translated to OpenCL C and run with the values
Metal gives."""
from __future__ import annotations

import numpy as np
import pytest

from mtlir.errors import UnsupportedKernelError
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.msl.lex import tokenize
from mtlir.runtime.sim.msl.names import canonical_type_spellings
from mtlir.runtime.sim.msl.translate import translate

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"

MSL = """kernel void k(device uint* packed, device const unsigned char* a, device unsigned short* halves,
                  device signed char* top, device unsigned long* wide, device vec<unsigned short, 2>* pairs,
                  uint i [[thread_position_in_grid]]) {
  vec<unsigned char, 4> v = vec<unsigned char, 4>(a[4*i], a[4*i+1], a[4*i+2], a[4*i+3]);
  unsigned int p = as_type<unsigned int>(v);
  packed[i] = p;
  vec<unsigned short, 2> h = as_type<vec<unsigned short, 2>>(p);
  halves[i] = h.x + h.y;
  vec<signed char, 4> s = as_type<vec<signed char,4>>(p);
  top[i] = s.w;
  wide[i] = as_type<unsigned long>(vec<unsigned int, 2>(p, p + 1u));
  pairs[i] = as_type<vec<unsigned short, 2>>(as_type<unsigned int>(vec<signed char, 4>(s.w, s.z, s.y, s.x)));
}"""


def test_multi_word_names_in_vector_forms_and_as_type_run_as_on_metal() -> None:
    t = translate(HEAD + MSL)
    assert [a.dtype for a in t.kernels["k"].args] == ["uint32", "uint8", "uint16", "int8", "uint64", "uint16x2"]
    assert "vec" not in t.source.split("__kernel")[1]
    a = np.arange(250, 218, -1, dtype=np.uint8)  # bytes above 127: signed and unsigned views differ
    n = len(a) // 4
    arrays = [np.zeros(n, np.uint32), a, np.zeros(n, np.uint16), np.zeros(n, np.int8), np.zeros(n, np.uint64),
              np.zeros(2 * n, np.uint16)]
    storages = [np.frombuffer(x.tobytes(), np.uint8).copy() for x in arrays]
    KernelRunner().compile(HEAD + MSL, "k").run({i: (s, 0) for i, s in enumerate(storages)}, (n, 1, 1), (1, 1, 1))
    packed, _, halves, top, wide, pairs = [s.view(x.dtype) for s, x in zip(storages, arrays)]
    p = a.view(np.uint32)  # little-endian, as on Apple GPUs
    np.testing.assert_array_equal(packed, p)
    h = p.view(np.uint16).reshape(n, 2)
    np.testing.assert_array_equal(halves, (h[:, 0].astype(np.uint32) + h[:, 1]).astype(np.uint16))
    np.testing.assert_array_equal(top, a.view(np.int8).reshape(n, 4)[:, 3])
    np.testing.assert_array_equal(wide.view(np.uint32).reshape(n, 2), np.stack([p, p + 1], axis=1))
    np.testing.assert_array_equal(pairs, a.reshape(n, 4)[:, ::-1].copy().view(np.uint16).reshape(2 * n))


@pytest.mark.parametrize("spelling, one", [("vec<unsigned char, 4>", "uchar4"), ("vec<signed char,2>", "char2"),
                                           ("vec<unsigned long, 3>", "ulong3"), ("vec<float, 4>", "float4"),
                                           ("vec<unsigned int, 2>", "uint2")])
def test_a_vector_template_is_one_type_token(spelling: str, one: str) -> None:
    texts = [t.text for t in canonical_type_spellings(tokenize(f"as_type<{spelling}>(x)"))][:-1]
    assert texts == ["as_type", "<", one, ">", "(", "x", ")"]


def test_vector_templates_msl_has_no_opencl_form_for_are_still_refused() -> None:
    with pytest.raises(UnsupportedKernelError, match="vec"):
        translate(HEAD + "kernel void k(device uint* x) { vec<bool, 4> b = vec<bool, 4>(true); x[0] = b.x; }")
    with pytest.raises(UnsupportedKernelError, match="vec"):
        translate(HEAD + "kernel void k(device uint* x) { vec<uint, 8> b; x[0] = b[0]; }")
