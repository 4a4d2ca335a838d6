"""half and bfloat in software (msl.softfloat): every operation rounded to nearest-even after it, bit for bit against
numpy's float16 over all 65,536 inputs of unary operations and a large sample of binary ones; conversions, chains,
memory in its 16 bits, tinygrad's forms; what cannot be typed is refused; libraries without them are untouched."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mtlir.errors import UnsupportedKernelError
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.msl.lex import tokenize
from mtlir.runtime.sim.msl.names import canonical_type_spellings
from mtlir.runtime.sim.msl.softfloat.lowering import lower_soft_floats
from mtlir.runtime.sim.msl.translate import translate

TRACES = Path(__file__).resolve().parents[4] / "examples" / "traces"
HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
ALL_HALVES = np.arange(65536, dtype=np.uint16).view(np.float16)


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


def run(runner: KernelRunner, msl: str, out: np.ndarray, *inputs: np.ndarray, threads: int) -> np.ndarray:
    """Run kernel ``k`` with ``out`` at buffer 0 and ``inputs`` at 1.., ``threads`` threads in groups of 256 (or
    fewer); returns ``out`` after the run."""
    storages = [np.frombuffer(a.tobytes(), np.uint8).copy() for a in (out, *inputs)]
    tg = min(256, threads)
    runner.compile(HEAD + msl, "k").run({i: (s, 0) for i, s in enumerate(storages)}, (threads // tg, 1, 1),
                                        (tg, 1, 1))
    return storages[0].view(out.dtype).reshape(out.shape)


def assert_same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal bit patterns, except that a NaN only has to be a NaN (its payload and sign are not specified), and
    that min and max of +0 and -0 may give either (IEEE 754 leaves it open)."""
    nan = np.isnan(want.astype(np.float32))
    assert (np.isnan(got.astype(np.float32)) == nan).all(), what
    bad = ~nan & (got.view(np.uint16) != want.view(np.uint16))
    if what in ("min", "max"):
        bad &= want != 0
    assert not bad.any(), f"{what}: {bad.sum()} differ, first at {np.argmax(bad)}: {got[bad][:4]} != {want[bad][:4]}"


UNARY = {  # MSL expression of v -> numpy float16 reference
    "-v": lambda v: -v,
    "abs(v)": np.abs,
    "sqrt(v)": np.sqrt,
    "floor(v)": np.floor,
    "ceil(v)": np.ceil,
    "rint(v)": np.rint,
    "trunc(v)": np.trunc,
    "v * v": lambda v: v * v,
    "v + 1.0h": lambda v: v + np.float16(1),
    "v / 3.0h": lambda v: v / np.float16(3),
    "1.0h / v": lambda v: np.float16(1) / v,
    "max(v, 0.5h)": lambda v: np.fmax(v, np.float16(0.5)),  # MSL's max is fmax: a NaN gives the other operand
    "min(v, -0.25h)": lambda v: np.fmin(v, np.float16(-0.25)),
    "(half)((float)v * 3.0f)": lambda v: (v.astype(np.float32) * np.float32(3)).astype(np.float16),
    "half(v * 0.1f)": lambda v: (v.astype(np.float32) * np.float32(0.1)).astype(np.float16),
    "(half)(int)v": lambda v: v.astype(np.float32).astype(np.int64).astype(np.float32).astype(np.float16),
    "v * 3": lambda v: v * np.float16(3),  # an int operand is converted to half first
}


def test_unary_half_operations_are_bit_exact_over_all_inputs(runner: KernelRunner) -> None:
    body = "\n".join(f"  o[{k} * 65536 + i] = {expr};" for k, expr in enumerate(UNARY))
    msl = f"kernel void k(device half* o, device const half* x, uint i [[thread_position_in_grid]]) {{\n" \
          f"  half v = x[i];\n{body}\n}}"
    with np.errstate(all="ignore"):
        got = run(runner, msl, np.zeros((len(UNARY), 65536), np.float16), ALL_HALVES, threads=65536)
        for k, (expr, ref) in enumerate(UNARY.items()):
            if "int" in expr:  # a float -> int conversion out of range is undefined in MSL: compare where it is not
                ok = np.abs(ALL_HALVES.astype(np.float32)) < 2**31
                assert_same_bits(got[k][ok], ref(ALL_HALVES[ok]).astype(np.float16), expr)
            else:
                assert_same_bits(got[k], ref(ALL_HALVES).astype(np.float16), expr)


def special_halves() -> np.ndarray:
    """Zeros, the subnormal and normal limits, infinities, NaN, 1 and its neighbours."""
    bits = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x3C00, 0x3BFF,
            0x3C01, 0xBC00, 0x5640, 0x1400]
    return np.array(bits, np.uint16).view(np.float16)


def test_binary_half_operations_are_bit_exact_on_a_large_sample(runner: KernelRunner) -> None:
    n = 1 << 18
    rng = np.random.default_rng(10)
    a, b, c = (rng.integers(0, 65536, n, dtype=np.uint16).view(np.float16) for _ in range(3))
    s = special_halves()
    a[:s.size ** 2], b[:s.size ** 2] = np.repeat(s, s.size), np.tile(s, s.size)  # every pair of special values
    msl = f"""kernel void k(device half* o, device const half* a, device const half* b, device const half* c,
                           uint i [[thread_position_in_grid]]) {{
      const uint n = {n};
      half x = a[i], y = b[i];
      o[i] = x + y; o[n + i] = x - y; o[2 * n + i] = x * y; o[3 * n + i] = x / y;
      o[4 * n + i] = min(x, y); o[5 * n + i] = max(x, y); o[6 * n + i] = (half)(x < y) + (half)(x == y);
      o[7 * n + i] = x * y + c[i];
      half z = x; z *= y; z -= c[i]; o[8 * n + i] = z;
    }}"""
    with np.errstate(all="ignore"):
        got = run(runner, msl, np.zeros((9, n), np.float16), a, b, c, threads=n)
        want = [a + b, a - b, a * b, a / b, np.fmin(a, b), np.fmax(a, b),
                (a < b).astype(np.float16) + (a == b).astype(np.float16), (a * b) + c, (a * b) - c]
    for k, (w, what) in enumerate(zip(want, ["+", "-", "*", "/", "min", "max", "< ==", "a * b + c", "*= -="])):
        assert_same_bits(got[k], w.astype(np.float16), what)


def test_conversions_to_and_from_half(runner: KernelRunner) -> None:
    rng = np.random.default_rng(11)
    random = rng.standard_normal(1 << 16).astype(np.float32) * np.float32(2.0) ** rng.integers(-30, 20, 1 << 16)
    edges = np.float32([65504, 65519.996, 65520, 65536, 1e9, -65520, 2.0**-24, 2.0**-25, 2.0**-25 * 3,
                        2.0**-14 - 2.0**-26, 6.1e-5, 0, -0.0, np.inf, -np.inf, np.nan])
    f = np.concatenate([random, edges]).astype(np.float32)
    f = np.resize(f, 1 << 17)
    i = rng.integers(-70000, 70000, f.size).astype(np.int32)
    msl = """kernel void k(device half* o, device const float* f, device const int* n, device half* p,
                          uint i [[thread_position_in_grid]]) {
      const uint m = 131072;
      o[i] = (half)f[i];
      o[m + i] = half(n[i]);
      o[2 * m + i] = static_cast<half>(f[i]) * 1.0h;
      o[3 * m + i] = as_type<half>((ushort)(n[i] & 0xffff));
      p[i] = f[i];
    }"""
    storage = [np.frombuffer(a.tobytes(), np.uint8).copy() for a in (np.zeros(4 << 17, np.float16), f, i,
                                                                     np.zeros(1 << 17, np.float16))]
    runner.compile(HEAD + msl, "k").run({k: (s, 0) for k, s in enumerate(storage)}, (512, 1, 1), (256, 1, 1))
    got = storage[0].view(np.float16).reshape(4, -1)
    with np.errstate(all="ignore"):
        assert_same_bits(got[0], f.astype(np.float16), "(half)float")
        assert_same_bits(got[1], i.astype(np.float16), "half(int)")
        assert_same_bits(got[2], f.astype(np.float16), "static_cast<half>")
        assert_same_bits(got[3], (i & 0xFFFF).astype(np.uint16).view(np.float16), "as_type<half>")
        assert_same_bits(storage[3].view(np.float16), f.astype(np.float16), "a float stored to half memory")


def test_values_read_from_half_memory_and_mixed_types(runner: KernelRunner) -> None:
    msl = """kernel void k(device float* o, device const half4* v, device const half* s, constant half& c,
                          uint i [[thread_position_in_grid]]) {
      half4 q = v[i];
      float f = q.x * 0.1f;            // half * float is a float: not rounded to half
      o[4 * i] = f;
      o[4 * i + 1] = q.y * s[i] + c;   // half * half + half: two roundings
      o[4 * i + 2] = float(dot(q, q)); // dot of half4: a half
      o[4 * i + 3] = as_type<float>(half2(q.z, q.w));
    }"""
    rng = np.random.default_rng(12)
    v = rng.standard_normal((64, 4)).astype(np.float16)
    s = rng.standard_normal(64).astype(np.float16)
    c = np.float16(0.3)
    storages = [np.frombuffer(a.tobytes(), np.uint8).copy() for a in (np.zeros((64, 4), np.float32), v, s,
                                                                      np.array([c]))]
    runner.compile(HEAD + msl, "k").run({k: (x, 0) for k, x in enumerate(storages)}, (1, 1, 1), (64, 1, 1))
    got = storages[0].view(np.float32).reshape(64, 4)
    np.testing.assert_array_equal(got[:, 0], v[:, 0].astype(np.float32) * np.float32(0.1))
    np.testing.assert_array_equal(got[:, 1], ((v[:, 1] * s) + c).astype(np.float32))
    dots = [(((v[k, 0] * v[k, 0]) + v[k, 1] * v[k, 1]) + v[k, 2] * v[k, 2]) + v[k, 3] * v[k, 3] for k in range(64)]
    np.testing.assert_allclose(got[:, 2], np.float32(dots), rtol=2e-3)  # a dot product's order is Metal's choice
    np.testing.assert_array_equal(got[:, 3].view(np.uint32), v[:, 2:].copy().view(np.uint32).ravel())


def test_tinygrad_half_kernel_forms(runner: KernelRunner) -> None:
    """Vector loads and stores through casts, a threadgroup half array, a float accumulator, a WMMA-style helper
    taking and returning half vectors, program-scope half constants."""
    msl = """constant half lut[4] = {1.0h, -0.5, 3, 0.1};
    half2 twice(half2 a) { return a + a; }
    kernel void k(device half* data0, device half* data1, uint3 lid [[thread_position_in_threadgroup]]) {
      threadgroup half temp0[16];
      float acc0[1];
      int lidx0 = lid.x;
      half4 val0 = (*((device half4*)((data1+(lidx0<<2)))));
      *(acc0+0) = 0.0f;
      *(acc0+0) = ((*(acc0+0))+((float)(val0.x+val0.y)));
      *(temp0+lidx0) = ((half)((*(acc0+0)))) * lut[lidx0 & 3];
      threadgroup_barrier(mem_flags::mem_threadgroup);
      half2 t = twice(half2(*(temp0+lidx0), val0.z));
      *((device half4*)((data0+(lidx0<<2)))) = half4(t.x, t.y, (val0.w*((half)(1.4426950408889634f))), exp2(val0.w));
    }"""
    rng = np.random.default_rng(13)
    x = rng.standard_normal(64).astype(np.float16)
    got = run(runner, msl, np.zeros(64, np.float16), x, threads=16).reshape(16, 4)
    x4 = x.reshape(16, 4)
    lut = np.float16([1.0, -0.5, 3, 0.1])
    temp = (x4[:, 0] + x4[:, 1]).astype(np.float32).astype(np.float16) * lut[np.arange(16) & 3]
    np.testing.assert_array_equal(got[:, 0], temp + temp)
    np.testing.assert_array_equal(got[:, 1], x4[:, 2] + x4[:, 2])
    np.testing.assert_array_equal(got[:, 2], x4[:, 3] * np.float16(1.4426950408889634))
    np.testing.assert_allclose(got[:, 3], np.exp2(x4[:, 3].astype(np.float32)).astype(np.float16), rtol=1e-3)
    src = translate(HEAD + msl).source
    assert "__local ushort temp0[16]" in src  # threadgroup memory holds 16 bits per half, as on Metal
    assert "__constant ushort lut[4] = {0x3c00, 0xb800, 0x4200, 0x2e66};" in src
    assert "float2 twice(float2 a) { return __mtl_rh(a + a); }" in src
    assert translate(HEAD + msl).kernels["k"].args[0].dtype == "float16"


@pytest.mark.parametrize("body, construct, why", [
    ("half h = x[0]; h++; x[0] = h;", "++ on half", "increment and decrement of a 16-bit float"),
    ("half h = x[0] * MYSTERY; x[0] = h;", "x", "cannot tell the type of this operation"),
    ("x[i(0)] += 1.0h;", "x", "whose target has side effects"),
])
def test_what_the_rewrite_cannot_type_is_refused(body: str, construct: str, why: str) -> None:
    msl = f"int i(int k) {{ return k; }}\nkernel void k(device half* x) {{ {body} }}"
    with pytest.raises(UnsupportedKernelError) as info:
        translate(HEAD + msl)
    assert info.value.construct == construct and why in str(info.value)


def test_half_in_structs_and_macros_is_refused() -> None:
    with pytest.raises(UnsupportedKernelError, match="a struct member of a 16-bit float type"):
        translate(HEAD + "struct S { half a; };\nkernel void k(device float* x, constant S& s) { x[0] = s.a; }")
    with pytest.raises(UnsupportedKernelError, match="this use of them .in a macro"):
        translate(HEAD + "#define TWICE(v) ((half)(v) * 2.0h)\nkernel void k(device half* x) { x[0] = TWICE(x[1]); }")


def test_libraries_without_half_or_bfloat_are_left_as_they_are() -> None:
    for path in sorted(TRACES.glob("*.json")):
        for prog in json.loads(path.read_text())["programs"].values():
            ts = canonical_type_spellings(tokenize(prog["msl"]))
            assert lower_soft_floats(ts, [], set()) is ts


# --- bfloat: the top 16 bits of a float, rounded to nearest even (MSL 3.1); numpy has no bfloat16, so the model
# computes in float32 (correctly rounded) and rounds the same way: float's 24 bits make that the correctly rounded
# bfloat result (8 bits) too ---

def to_bfloat(f: np.ndarray) -> np.ndarray:
    """float32 -> bfloat bits, to nearest even; a NaN stays a quiet NaN."""
    u = f.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    bits[nan] = (u[nan] >> 16) | 0x40
    return bits.astype(np.uint16)


def from_bfloat(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def assert_same_bfloat(got: np.ndarray, want: np.ndarray, what: str) -> None:
    nan = np.isnan(from_bfloat(want))
    assert (np.isnan(from_bfloat(got)) == nan).all(), what
    bad = ~nan & (got != want)
    assert not bad.any(), f"{what}: {bad.sum()} differ, first at {np.argmax(bad)}: {got[bad][:4]} != {want[bad][:4]}"


BFLOAT_UNARY = {
    "-v": lambda v: -v,
    "abs(v)": np.abs,
    "sqrt(v)": np.sqrt,
    "v * v": lambda v: v * v,
    "v + (bfloat)1.0f": lambda v: v + np.float32(1),
    "v / (bfloat)3.0f": lambda v: v / from_bfloat(to_bfloat(np.float32([3])))[0],
    "(bfloat)((float)v * 0.1f)": lambda v: v * np.float32(0.1),
    "bfloat(v * 0.1f) * 3": lambda v: from_bfloat(to_bfloat(v * np.float32(0.1))) * np.float32(3),
}


def test_bfloat_unary_operations_are_bit_exact_over_all_inputs(runner: KernelRunner) -> None:
    body = "\n".join(f"  o[{k} * 65536 + i] = as_type<ushort>((bfloat)({expr}));"
                     for k, expr in enumerate(BFLOAT_UNARY))
    msl = f"kernel void k(device ushort* o, device const bfloat* x, uint i [[thread_position_in_grid]]) {{\n" \
          f"  bfloat v = x[i];\n{body}\n}}"
    every = np.arange(65536, dtype=np.uint16)
    got = run(runner, msl, np.zeros((len(BFLOAT_UNARY), 65536), np.uint16), every, threads=65536)
    with np.errstate(all="ignore"):
        for k, (expr, ref) in enumerate(BFLOAT_UNARY.items()):
            assert_same_bfloat(got[k], to_bfloat(ref(from_bfloat(every))), expr)


def test_bfloat_binary_operations_conversions_and_matrices(runner: KernelRunner) -> None:
    n = 1 << 18
    rng = np.random.default_rng(14)
    a, b = (rng.integers(0, 65536, n, dtype=np.uint16) for _ in range(2))
    f = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    msl = f"""kernel void k(device bfloat* o, device const bfloat* a, device const bfloat* b, device const float* f,
                           uint i [[thread_position_in_grid]]) {{
      const uint n = {n};
      bfloat x = a[i], y = b[i];
      o[i] = x + y; o[n + i] = x - y; o[2 * n + i] = x * y; o[3 * n + i] = x / y; o[4 * n + i] = f[i];
      o[5 * n + i] = x * y + x;
    }}"""
    got = run(runner, msl, np.zeros((6, n), np.uint16), a, b, f, threads=n)
    x, y = from_bfloat(a), from_bfloat(b)
    with np.errstate(all="ignore"):
        want = [x + y, x - y, x * y, x / y, f, from_bfloat(to_bfloat(x * y)) + x]
    for k, (w, what) in enumerate(zip(want, ["+", "-", "*", "/", "(bfloat)float", "x * y + x"])):
        assert_same_bfloat(got[k], to_bfloat(w), what)
    msl = """kernel void k(device float* d, device const bfloat* a, device const bfloat* b) {
      simdgroup_bfloat8x8 ma, mb;
      simdgroup_float8x8 md;
      simdgroup_load(ma, a);
      simdgroup_load(mb, b);
      simdgroup_multiply(md, ma, mb);
      simdgroup_store(md, d);
    }"""
    ma, mb = (to_bfloat(rng.integers(-8, 9, 64).astype(np.float32)) for _ in range(2))
    d = run(runner, msl, np.zeros(64, np.float32), ma, mb, threads=32)
    np.testing.assert_array_equal(d.reshape(8, 8), from_bfloat(ma).reshape(8, 8) @ from_bfloat(mb).reshape(8, 8))


@pytest.mark.parametrize("elem", ["half", "bfloat"])
def test_a_moved_16_bit_float_keeps_its_bits_signaling_nans_too(runner: KernelRunner, elem: str) -> None:
    # a load then a store is a move on a GPU: every one of the 65,536 patterns comes out as it went in; the float in
    # between used to make each NaN quiet (0x7d01 -> 0x7f01, 0x7c01 -> 0x7e01: tinygrad's slice copies of half)
    msl = (f"kernel void k(device {elem}* out, device const {elem}* in, uint i [[thread_position_in_grid]]) {{\n"
           f"  {elem} v = in[i];\n  out[i] = v;\n}}\n")
    bits = np.arange(65536, dtype=np.uint16)
    got = run(runner, msl, np.zeros(65536, np.uint16), bits, threads=65536)
    diff = got != bits
    assert not diff.any(), f"{diff.sum()} patterns changed, first {bits[diff][:4]} -> {got[diff][:4]}"


def test_a_nan_from_float_stays_a_nan_in_half_and_bfloat(runner: KernelRunner) -> None:
    # a float NaN whose payload lies below the 16-bit type's bits must not become infinity: it gets the quiet bit
    msl = ("kernel void k(device half* h, device bfloat* b, device const uint* in, uint i [[thread_position_in_grid]])"
           " {\n  float f = as_type<float>(in[i]);\n  h[i] = half(f);\n  b[i] = bfloat(f);\n}\n")
    nans = np.array([0x7f800001, 0xff800001, 0x7fc00000, 0x7fa00000, 0x7f801fff], np.uint32)
    storages = [np.zeros(5 * 2, np.uint8), np.zeros(5 * 2, np.uint8), np.frombuffer(nans.tobytes(), np.uint8).copy()]
    runner.compile(HEAD + msl, "k").run({i: (s, 0) for i, s in enumerate(storages)}, (1, 1, 1), (5, 1, 1))
    h, b = storages[0].view(np.uint16), storages[1].view(np.uint16)
    assert np.isnan(h.view(np.float16)).all(), [hex(x) for x in h]
    assert ((b & 0x7f80) == 0x7f80).all() and ((b & 0x7f) != 0).all(), [hex(x) for x in b]
    assert h[3] == 0x7d00 and b[3] == 0x7fa0  # a signaling payload in the top bits is kept
