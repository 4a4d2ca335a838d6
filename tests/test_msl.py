"""mtlir.msl: reading a kernel's MSL signature, and the check a Kernel makes of its declared parameters against it
(issue 8: a `half` or `char` signature for a `device float*`, parameters listed in another order than the MSL's
`[[buffer(n)]]` indices, and `double` used to be accepted or refused with a misleading size error)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mtlir.frontend.nodes import QueueError, buffer, timeline_value
from mtlir.frontend.queue import Queue
from mtlir.frontend.trace import load_trace
from mtlir.ir.dtypes import dtypes
from mtlir.metal import DeviceSpec, Kernel, KernelParam
from mtlir.msl import KernelSignatureError, MslParam, check_kernel_params, kernel_signature, msl_dtype

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"

# two buffers whose [[buffer(n)]] indices run against their order, a variable, thread positions between them
SWAPPED = """#include <metal_stdlib>
using namespace metal;
kernel void scale(device float* out [[buffer(1)]], uint3 gid [[thread_position_in_grid]],
                  const device float* inp [[buffer(0)]], constant int& n [[buffer(2)]]) {
  if ((int)gid.x < n) out[gid.x] = inp[gid.x] * 2.0f;
}
"""


def _sig(msl: str, function: str = "k") -> list[tuple[str, int, str, bool, object, int]]:
    return [(m.name, m.index, m.space, m.reference, m.dtype, m.width) for m in kernel_signature(msl, function)]


# ---- reading the signature


def test_tinygrad_forms_are_read() -> None:
    """The forms tinygrad's Metal renderer emits: explicit indices, constant int& variables, half, uchar, vectors."""
    msl = ("kernel void k(device float* data0 [[buffer(0)]], device half* data1 [[buffer(1)]], "
           "device uchar* data2 [[buffer(2)]], constant int& start_pos [[buffer(3)]], "
           "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {}")
    assert _sig(msl) == [("data0", 0, "device", False, dtypes.float32, 1),
                         ("data1", 1, "device", False, dtypes.float16, 1),
                         ("data2", 2, "device", False, dtypes.uint8, 1),
                         ("start_pos", 3, "constant", True, dtypes.int32, 1)]
    sig = kernel_signature(msl, "k")
    assert [m.kind for m in sig] == ["buffer", "buffer", "buffer", "variable"]
    assert sig[0].text == "device float* data0 [[buffer(0)]]" and sig[3].text == "constant int& start_pos [[buffer(3)]]"


def test_indices_without_attributes_are_positions() -> None:
    msl = ("kernel void E_start_pos(device float* data0_32, device float* data1_32, device float* data2_1, "
           "device float* data3_1, constant int& data4_, uint3 gid [[threadgroup_position_in_grid]]) {}")
    assert [(m.name, m.index, m.kind) for m in kernel_signature(msl, "E_start_pos")] == [
        ("data0_32", 0, "buffer"), ("data1_32", 1, "buffer"), ("data2_1", 2, "buffer"), ("data3_1", 3, "buffer"),
        ("data4_", 4, "variable")]


@pytest.mark.parametrize("decl, dtype, width", [
    ("device float* p", dtypes.float32, 1), ("const device float* p", dtypes.float32, 1),
    ("device const float *p", dtypes.float32, 1), ("device float* __restrict p", dtypes.float32, 1),
    ("device unsigned char* p", dtypes.uint8, 1), ("device signed char* p", dtypes.int8, 1),
    ("device char* p", dtypes.int8, 1), ("device unsigned* p", dtypes.uint32, 1),
    ("device unsigned int* p", dtypes.uint32, 1), ("device unsigned long* p", dtypes.uint64, 1),
    ("device uint8_t* p", dtypes.uint8, 1), ("device int64_t* p", dtypes.int64, 1), ("device bool* p", dtypes.bool, 1),
    ("device short* p", dtypes.int16, 1), ("device ushort* p", dtypes.uint16, 1), ("device half* p", dtypes.float16, 1),
    ("device float4* p", dtypes.float32, 4), ("device half2* p", dtypes.float16, 2),
    ("device packed_float3* p", dtypes.float32, 3), ("device metal::float4* p", dtypes.float32, 4),
    ("device atomic_int* p", dtypes.int32, 1), ("constant float* p", dtypes.float32, 1),
    ("constant uint& p", dtypes.uint32, 1), ("constant int &p", dtypes.int32, 1),
])
def test_element_types(decl: str, dtype: object, width: int) -> None:
    (m,) = kernel_signature(f"kernel void k({decl}) {{}}", "k")
    assert (m.dtype, m.width) == (dtype, width)


def test_attributes_in_any_order_and_place() -> None:
    """Indices against the declaration order, positions between buffers, two attributes in one [[...]], the
    attribute before the name, hex and unsigned literals."""
    assert _sig(SWAPPED, "scale") == [("out", 1, "device", False, dtypes.float32, 1),
                                      ("inp", 0, "device", False, dtypes.float32, 1),
                                      ("n", 2, "constant", True, dtypes.int32, 1)]
    msl = ("kernel void k(device float* a [[buffer(0x2), raster_order_group(0)]], "
           "device float* [[buffer(0u)]] b, ushort tid [[thread_index_in_threadgroup]]) {}")
    assert [(m.name, m.index) for m in kernel_signature(msl, "k")] == [("a", 2), ("b", 0)]


def test_other_argument_tables_are_left_out() -> None:
    msl = ("kernel void k(texture2d<float, access::write> t [[texture(0)]], device float* a, "
           "threadgroup float* scratch [[threadgroup(0)]], sampler s, constant int& n) {}")
    assert [(m.name, m.index) for m in kernel_signature(msl, "k")] == [("a", 0), ("n", 1)]


def test_the_kernel_is_found_past_comments_strings_and_other_functions() -> None:
    msl = """#include <metal_stdlib>
#define KERNEL(x) kernel void x(device int* a) {}
// kernel void k(device half* wrong) {}
/* kernel void k(device char* wrong) {} */
constant char* s = "kernel void k(device short* wrong) {}";
float helper(float x) { return x; }
kernel void other(device uchar* o) {}
[[max_total_threads_per_threadgroup(64)]] kernel void k(device float* right) {}
"""
    assert _sig(msl) == [("right", 0, "device", False, dtypes.float32, 1)]
    assert _sig("[[kernel]] void k(device half* h) {}") == [("h", 0, "device", False, dtypes.float16, 1)]
    assert kernel_signature("kernel void k(uint3 gid [[thread_position_in_grid]]) {}", "k") == ()


@pytest.mark.parametrize("msl, match", [
    ("kernel void other(device float* a) {}", "defines no kernel function 'k'"),
    ("void k(device float* a) {}", "defines no kernel function 'k'"),
    ("kernel void k(device double* a) {}", "double does not exist in Metal"),
    ("kernel void k(constant Params& p [[buffer(0)]]) {}", "Params has no mtlir dtype"),
    ("kernel void k(device float* a [[buffer(0)]], device float* b) {}",
     r"`device float\* b` has no \[\[buffer\(n\)\]\] while `device float\* a \[\[buffer\(0\)\]\]` has one"),
    ("kernel void k(device float* a [[buffer(1)]], device float* b [[buffer(1)]]) {}",
     r"both take \[\[buffer\(1\)\]\]"),
    ("kernel void k(device float* a [[buffer(N)]]) {}", r"\[\[buffer\(N\)\]\] is not an integer literal"),
])
def test_signatures_that_cannot_be_read_are_refused(msl: str, match: str) -> None:
    with pytest.raises(KernelSignatureError, match=match):
        kernel_signature(msl, "k")


def test_msl_dtype_refuses_double() -> None:
    assert msl_dtype("unsigned char") == (dtypes.uint8, 1) and msl_dtype("float4") == (dtypes.float32, 4)
    # Metal's bfloat (Apple7+; tinygrad's bfloat16 tensors): refused before mtlir had the dtype
    assert msl_dtype("bfloat") == (dtypes.bfloat16, 1) and msl_dtype("packed_bfloat4") == (dtypes.bfloat16, 4)
    assert _sig("kernel void k(device bfloat* b, constant bfloat& s) {}") == [
        ("b", 0, "device", False, dtypes.bfloat16, 1), ("s", 1, "constant", True, dtypes.bfloat16, 1)]
    with pytest.raises(ValueError, match="MSL has no 64-bit float"):
        msl_dtype("double")


def test_the_simulated_device_reads_the_same_signatures() -> None:
    """The core's reader and the simulated device's translator agree on every kernel of the traces and the forms
    above: name, buffer or variable, index, element type."""
    from mtlir.runtime.sim.msl.translate import translate
    sources = [(SWAPPED, "scale"), ("kernel void k(const device short4* a [[buffer(0)]], "
                                    "device uchar* b [[buffer(1)]], constant uint& n [[buffer(2)]]) {}", "k")]
    for path in sorted(TRACES.glob("*.apple7.json")):
        sources += [(k.msl, k.function) for k in load_trace(path).kernels.values()]
    for msl, function in sources:
        ours = [(m.name, m.kind, m.index, m.dtype.name if m.width == 1 else f"{m.dtype.name}x{m.width}")
                for m in kernel_signature(msl, function)]
        theirs = [(a.name, "buffer" if a.kind == "buffer" else "variable", a.index, a.dtype)
                  for a in translate(msl).kernels[function].args]
        assert ours == theirs, function


# ---- the check a Kernel makes


def test_every_trace_and_the_example_pass_the_check_unchanged() -> None:
    for path in sorted(TRACES.glob("*.json")):
        for k in load_trace(path).kernels.values():
            sig = kernel_signature(k.msl, k.function)
            assert [(p.index, p.element) for p in k.params] == [(m.index, m.dtype) for m in sig], (path.name, k.key)
    import runpy
    example = runpy.run_path(str(TRACES.parent / "saxpy_reduce.py"))
    assert {example["SAXPY"].key, example["BLOCK_SUM"].key} == {"saxpy", "block_sum"}


@pytest.mark.parametrize("dtype, declared", [("half", "float16"), ("char", "int8"), ("int32", "int32"),
                                             ("dtypes.uchar", "uint8")])
def test_a_wrong_element_type_is_refused_naming_kernel_parameter_and_both_types(dtype: str, declared: str) -> None:
    msl = "kernel void k(device float* out, device float* inp) {}"
    with pytest.raises(KernelSignatureError) as e:
        Kernel("E_1", "k", msl, (KernelParam(None, 0), KernelParam(None, 1, dtype, 4)))
    assert str(e.value) == (f"Kernel 'E_1' (function 'k'): parameter 1 (buffer at index 1) is declared {declared}, but "
                            "the MSL's `device float* inp` takes float (float32)")
    assert e.value.param == 1 and isinstance(e.value, ValueError)


def test_a_vector_buffer_takes_its_element_type() -> None:
    msl = "kernel void k(device float4* v [[buffer(0)]]) {}"
    assert Kernel("k", "k", msl, (KernelParam(None, 0, "float32"),)).params[0].element is dtypes.float32
    with pytest.raises(KernelSignatureError, match=r"declared float16, but the MSL's `device float4\* v \[\[buffer"
                                                   r"\(0\)\]\]` takes float4, whose element is float32"):
        Kernel("k", "k", msl, (KernelParam(None, 0, "half"),))


def test_parameters_listed_in_another_order_than_the_msl_are_refused() -> None:
    """SWAPPED's `out` is declared first at [[buffer(1)]]: parameters listed by index (0, 1) make Queue.exec bind
    the first buffer given to `inp`, which used to compute the wrong thing without a word."""
    with pytest.raises(KernelSignatureError) as e:
        Kernel("scale", "scale", SWAPPED, (KernelParam(None, 0), KernelParam(None, 1), KernelParam("n", 2, "int32")))
    assert str(e.value) == ("Kernel 'scale': parameter 0 (buffer at index 0): listed as buffer 0, but the MSL's buffer "
                            "0 is `device float* out [[buffer(1)]]`: list the buffer parameters in the MSL's order "
                            "(indices 1, 0), each at its [[buffer(n)]], and pass the buffers to Queue.exec in that "
                            "order")
    # listed as the MSL declares them (each at its index), the kernel doubles what the queue passes second
    k = Kernel("scale", "scale", SWAPPED, (KernelParam(None, 1), KernelParam(None, 0), KernelParam("n", 2, "int32")))
    assert [p.index for p in k.buffer_params] == [1, 0]


def test_indices_taken_as_positions_against_explicit_indices_are_refused() -> None:
    msl = "kernel void k(device float* a [[buffer(1)]], device int* b [[buffer(0)]]) {}"
    with pytest.raises(KernelSignatureError, match=r"parameter 0 \(buffer at index 0\) is declared float32, but the "
                                                   r"MSL's `device int\* b \[\[buffer\(0\)\]\]` takes int \(int32\)"):
        Kernel("k", "k", msl, (KernelParam(None, 0, "float32"), KernelParam(None, 1, "int32")))


@pytest.mark.parametrize("params, match", [
    ((KernelParam(None, 0), KernelParam(None, 1)),
     r"parameter 1 \(buffer at index 1\), declared float32, is a buffer, but the MSL's `constant int& n` at "
     r"\[\[buffer\(1\)\]\] is a value \(a `constant T&` variable\): declare it KernelParam\('n', 1, 'int32'\)"),
    ((KernelParam("a", 0, "float32"), KernelParam("n", 1, "int32")),
     r"parameter 0 \(variable 'a' at index 0\), declared float32, is a variable, but the MSL's `device float\* a` at "
     r"\[\[buffer\(0\)\]\] is a pointer \(a buffer\)"),
    ((KernelParam(None, 0), KernelParam("n", 1, "int32"), KernelParam(None, 2)),
     r"parameter 2 \(buffer at index 2\), declared float32: the MSL has no parameter at \[\[buffer\(2\)\]\] \(its "
     r"buffer parameters: `device float\* a`, `constant int& n`\)"),
    ((KernelParam(None, 0),),
     r"the MSL's `constant int& n` at \[\[buffer\(1\)\]\] has no KernelParam: nothing would be bound there "
     r"\(declare KernelParam\('n', 1, 'int32'\)\)"),
])
def test_scalar_against_buffer_and_missing_parameters_are_refused(params: tuple[KernelParam, ...], match: str) -> None:
    with pytest.raises(KernelSignatureError, match=match):
        Kernel("k", "k", "kernel void k(device float* a, constant int& n) {}", params)


def test_double_is_refused_as_what_it_is() -> None:
    """A double parameter used to be refused by the queue with a size error (8 bytes per element), or accepted."""
    for name in ("double", "float64", "dtypes.double"):
        with pytest.raises(ValueError, match="64-bit float, which Metal does not have"):
            KernelParam(None, 0, name, 4)
    with pytest.raises(KernelSignatureError, match="double does not exist in Metal"):
        Kernel("k", "k", "kernel void k(device double* a) {}", ())


def test_an_empty_msl_is_a_kernel_for_lowering_only() -> None:
    assert Kernel("k", "k", "", (KernelParam(None, 0, "half"),)).params[0].element is dtypes.float16


def test_check_kernel_params_names_the_kernel_for_an_msl_problem() -> None:
    with pytest.raises(KernelSignatureError, match=r"^Kernel 'E_1' \(function 'k'\): the MSL defines no kernel "
                                                   r"function 'k'") as e:
        check_kernel_params("E_1", "k", "kernel void j() {}", ())
    assert e.value.param is None


def test_check_kernel_params_names_the_kernel_once() -> None:
    """kernel_signature's own ``kernel 'f':`` prefix is not repeated after ``Kernel 'f':`` (user test 12a)."""
    with pytest.raises(KernelSignatureError) as e:
        check_kernel_params("r_8_10", "r_8_10", "kernel void r_8_10(device double* data0_8) {}", ())
    assert str(e.value).startswith("Kernel 'r_8_10': `device double* data0_8`: double does not exist in Metal")


def test_a_checked_kernel_runs_right_on_the_simulated_device() -> None:
    """The kernel whose parameters are listed as the MSL declares them computes out = 2 * inp on the buffers
    given in that order."""
    from mtlir.passes import lower
    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    k = Kernel("scale", "scale", SWAPPED, (KernelParam(None, 1, "float32", 4), KernelParam(None, 0, "float32", 4),
                                           KernelParam("n", 2, "int32")))
    out, inp = buffer("out", 16), buffer("inp", 16)
    q = Queue(DeviceSpec("Apple7"))
    q.exec(k, [out, inp], [4], grid=(4,), threadgroup=(1,)).signal(q.timeline, timeline_value())
    program = lower(q.submit(), target="x86_64", keep_stages=False).program
    x = np.arange(4, dtype=np.float32)
    with SimDevice("x86_64", family="Apple7") as dev, Session(program, dev, initial={"buffer:inp": x.tobytes()}) as s:
        s.submit(timeline=1)
        s.wait(timeout_s=60)
        np.testing.assert_array_equal(np.frombuffer(s.read("buffer:out"), np.float32), x * 2)


def test_the_queue_keeps_refusing_sizes_after_the_check() -> None:
    k = Kernel("k", "k", "kernel void k(device half* a) {}", (KernelParam(None, 0, "dtypes.half", 8),))
    with pytest.raises(QueueError, match=r"takes 8 elements of dtypes.half \(16 bytes\)"):
        Queue(DeviceSpec()).exec(k, [buffer("a", 8)])


def test_msl_param_is_a_record() -> None:
    m = MslParam("a", 0, "device", False, "float", dtypes.float32, 1, "device float* a")
    assert m.kind == "buffer" and m == kernel_signature("kernel void k(device float* a) {}", "k")[0]
