"""KernelRunner: bindings, views at byte offsets (the offset argument), aliasing, sizes, errors."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mtlir.errors import (InvalidMslError, KernelAccessError, KernelBuildError, KernelCompileError,
                          UnsupportedKernelError)
from mtlir.runtime.sim.kernels.runner import KernelRunner

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
SCALE = HEAD + """kernel void scale(device float* out, device const float* in, constant int& n, constant float& s,
                  uint i [[thread_position_in_grid]]) {
  if ((int)i < n) { out[i] = in[i] * s; }
}"""
GROUP_SUM = HEAD + """kernel void group_sum(device float* out, device const float* in,
                      uint g [[threadgroup_position_in_grid]], uint l [[thread_position_in_threadgroup]],
                      uint n [[threads_per_threadgroup]]) {
  threadgroup float part[4096];
  part[l] = in[g * n + l];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint stride = n / 2; stride > 0; stride /= 2) {
    if (l < stride) { part[l] += part[l + stride]; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (l == 0) { out[g] = part[0]; }
}"""


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


def f32(storage: np.ndarray, offset: int, count: int) -> np.ndarray:
    return storage[offset:offset + 4 * count].view(np.float32)


def put(storage: np.ndarray, offset: int, values: np.ndarray) -> None:
    storage[offset:offset + values.nbytes] = values.view(np.uint8)


def scale_bindings(out: tuple[np.ndarray, int], inp: tuple[np.ndarray, int], n: int, s: float) -> dict:
    var = np.zeros(512, np.uint8)
    put(var, 0, np.int32([n]))
    put(var, 256, np.float32([s]))
    return {0: out, 1: inp, 2: (var, 0), 3: (var, 256)}


def test_device_facts(runner: KernelRunner) -> None:
    assert runner.base_align == runner.device.mem_base_addr_align // 8
    assert "base_align" in repr(runner) and runner.device_name in repr(runner)


def test_compile_is_cached_and_describes_the_kernel(runner: KernelRunner) -> None:
    ck = runner.compile(SCALE, "scale")
    assert runner.compile(SCALE, "scale") is ck
    assert ck.function == "scale"
    assert [(a.name, a.kind, a.index, a.dtype) for a in ck.params] == [
        ("out", "buffer", 0, "float32"), ("in", "buffer", 1, "float32"), ("n", "constant", 2, "int32"),
        ("s", "constant", 3, "float32")]
    assert "__kernel void scale(" in ck.opencl_source


@pytest.mark.parametrize("offset, how", [(0, "buffer"), (128, "offset"), (256, "offset"), (4, "offset"),
                                         (132, "offset"), (1000, "offset")])
def test_views_at_byte_offsets(runner: KernelRunner, offset: int, how: str) -> None:
    """Every view at a byte offset is the whole buffer and the offset argument, also where the offset is a multiple
    of mem_base_addr_align (128 here, 512 on NVIDIA): never an OpenCL sub-buffer (kernels.runner says why)."""
    ck = runner.compile(SCALE, "scale")
    storage = np.zeros(2048, np.uint8)
    x = np.arange(1, 17, dtype=np.float32)
    put(storage, 1536, x)
    bindings = scale_bindings((storage, offset), (storage, 1536), 12, 3.0)
    views = ck.views(bindings)
    assert [(v.arg.name, v.how, v.offset) for v in views[:2]] == [("out", how, offset), ("in", "offset", 1536)]
    ck.run(bindings, (4, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(f32(storage, offset, 16), np.concatenate([3 * x[:12], np.zeros(4)]))
    np.testing.assert_array_equal(f32(storage, 1536, 16), x)  # the input view is untouched
    assert not storage[:offset].any()  # nothing written before the view


def test_views_of_one_buffer_alias(runner: KernelRunner) -> None:
    inc = HEAD + """kernel void inc(device float* a, device float* b, uint i [[thread_position_in_grid]]) {
      b[i] = a[i] + 1.0f;
    }"""
    ck = runner.compile(inc, "inc")
    storage = np.zeros(256, np.uint8)
    put(storage, 0, np.float32([10.0]))
    put(storage, 128, np.float32([50.0]))
    ck.run({0: (storage, 0), 1: (storage, 4)}, (1, 1, 1), (1, 1, 1))  # float[1] = float[0] + 1
    ck.run({0: (storage, 4), 1: (storage, 8)}, (1, 1, 1), (1, 1, 1))  # float[2] = float[1] + 1: the last result
    assert [v.how for v in ck.views({0: (storage, 128), 1: (storage, 132)})] == ["offset", "offset"]
    ck.run({0: (storage, 128), 1: (storage, 132)}, (1, 1, 1), (1, 1, 1))  # two offset views
    np.testing.assert_array_equal(f32(storage, 0, 4), [10, 11, 12, 0])
    np.testing.assert_array_equal(f32(storage, 128, 3), [50, 51, 0])


def test_host_writes_between_runs_are_seen(runner: KernelRunner) -> None:
    ck = runner.compile(SCALE, "scale")
    out, inp = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    for value in (1.0, 2.0, 5.0):
        put(inp, 0, np.full(16, value, np.float32))
        ck.run(scale_bindings((out, 0), (inp, 0), 16, 2.0), (1, 1, 1), (16, 1, 1))
        np.testing.assert_array_equal(f32(out, 0, 16), np.full(16, 2 * value))


def test_read_only_storage_for_inputs(runner: KernelRunner) -> None:
    ck = runner.compile(SCALE, "scale")
    out = np.zeros(64, np.uint8)
    inp = np.frombuffer(np.arange(16, dtype=np.float32).tobytes(), np.uint8)  # read-only array
    assert not inp.flags.writeable
    ck.run(scale_bindings((out, 0), (inp, 0), 16, 0.5), (1, 1, 1), (16, 1, 1))
    np.testing.assert_array_equal(f32(out, 0, 16), np.arange(16) * 0.5)
    with pytest.raises(ValueError, match="may write this buffer but the storage array is read-only"):
        ck.run(scale_bindings((inp, 0), (out, 0), 16, 0.5), (1, 1, 1), (16, 1, 1))


def test_zero_size_dispatch_runs_nothing(runner: KernelRunner) -> None:
    ck = runner.compile(SCALE, "scale")
    out, inp = np.zeros(64, np.uint8), np.full(64, 7, np.uint8)
    for grid, tg in (((0, 1, 1), (16, 1, 1)), ((4, 1, 1), (4, 0, 1))):
        ck.run(scale_bindings((out, 0), (inp, 0), 16, 1.0), grid, tg)
    assert not out.any()


def test_missing_and_bad_bindings_name_the_parameter(runner: KernelRunner) -> None:
    ck = runner.compile(SCALE, "scale")
    out, inp = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    good = scale_bindings((out, 0), (inp, 0), 16, 1.0)
    with pytest.raises(ValueError, match=r"kernel 'scale', parameter 's' \(buffer index 3\): no binding"):
        ck.run({k: v for k, v in good.items() if k != 3}, (1, 1, 1), (1, 1, 1))
    bad = [({0: (out.view(np.float32), 0)}, "must be a 1-D numpy.uint8 array"),
           ({0: (out, 2)}, "offset 2 is not a multiple of the element size 4"),
           ({0: (out, 64)}, "outside the 64-byte buffer"),
           ({0: (out, -4)}, "outside"),
           ({0: (out, 4.0)}, "must be an int"),
           ({2: (good[2][0], 510)}, r"offset 510 \(\+4 bytes read\) is outside the 512-byte buffer"),
           ({0: (np.zeros((4, 16), np.uint8), 0)}, "1-D"),
           ({0: (np.zeros(128, np.uint8)[::2], 0)}, "not contiguous")]
    for change, message in bad:
        with pytest.raises(ValueError, match=message):
            ck.run({**good, **change}, (1, 1, 1), (1, 1, 1))
    with pytest.raises(ValueError, match="overlap without being the same array"):
        ck.run({**good, 1: (out[4:], 0)}, (1, 1, 1), (1, 1, 1))
    for size in ((1, 1), (1, -1, 1), "abc"):
        with pytest.raises(ValueError, match="three ints"):
            ck.run(good, size, (1, 1, 1))  # type: ignore[arg-type]


def test_threadgroups_up_to_the_device_limit_run_with_barriers(runner: KernelRunner) -> None:
    ck = runner.compile(GROUP_SUM, "group_sum")
    import pyopencl as cl
    limit = ck.max_threads_per_threadgroup  # the kernel's own limit (CL_KERNEL_WORK_GROUP_SIZE: 4096 on PoCL here,
    # 256 for this kernel on NVIDIA's H200), as Metal's maxTotalThreadsPerThreadgroup is the pipeline's, not the GPU's
    assert limit == min(ck._kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, runner.device),
                        runner.device.max_work_group_size)
    tg = 1 << (min(limit, 4096).bit_length() - 1)  # the largest power of two the kernel runs in one threadgroup
    assert tg >= 2
    x = np.random.default_rng(1).standard_normal(2 * tg).astype(np.float32)
    out, inp = np.zeros(8, np.uint8), np.frombuffer(x.tobytes(), np.uint8).copy()
    ck.run({0: (out, 0), 1: (inp, 0)}, (2, 1, 1), (tg, 1, 1))
    np.testing.assert_allclose(f32(out, 0, 2), x.reshape(2, tg).sum(1, dtype=np.float64), rtol=1e-4)
    with pytest.raises(ValueError, match="more than the OpenCL device .* runs in one work-group"):
        ck.run({0: (out, 0), 1: (inp, 0)}, (1, 1, 1), (limit + 1, 1, 1))


def test_absurd_global_sizes_are_refused_before_opencl(runner: KernelRunner) -> None:
    """A grid that wrapped (2**64 - 4 threadgroups from an expression that went below 1) never reaches PoCL, which
    would abort the whole process; nor does a global size beyond Metal's 2**32 threads per axis."""
    ck = runner.compile(SCALE, "scale")
    out, inp = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    good = scale_bindings((out, 0), (inp, 0), 16, 1.0)
    for grid, tg in (((2**64 - 4, 1, 1), (4, 1, 1)), ((1, 2**31, 1), (1, 2, 1)), ((2**21, 2**20, 1), (1, 1, 1))):
        with pytest.raises(ValueError, match=r"kernel 'scale': grid .* global size .* is more than the simulated "
                                             r"device runs \(below 2\*\*32 threads per axis"):
            ck.run(good, grid, tg)
    put(inp, 0, np.arange(16, dtype=np.float32))
    ck.run(good, (4, 1, 1), (4, 1, 1))  # the runner still works
    np.testing.assert_array_equal(f32(out, 0, 16), np.arange(16, dtype=np.float32))


def test_compile_errors(runner: KernelRunner, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KernelCompileError, match="no kernel function 'nope' in the MSL \\(its kernels: scale\\)"):
        runner.compile(SCALE, "nope")
    bad = HEAD + "kernel void k(device float* x) { x[0] = undefined_name + 1.0f +; }"
    capfd.readouterr()
    with pytest.raises(InvalidMslError) as e:  # every error is at a place of the MSL: invalid MSL (issue 9)
        runner.compile(bad, "k")
    assert "error generated" not in capfd.readouterr().err  # PoCL's compiler prints it on fd 2 itself
    err = e.value
    assert isinstance(err, KernelCompileError) and not isinstance(err, KernelBuildError)
    assert err.kernels == ("k",) and "undefined_name" in err.log
    line = HEAD.count("\n") + 1
    # MSL lines and columns, not the translation's; in the order the OpenCL compiler gave them (PoCL: by column,
    # NVIDIA's: the undeclared name first), the first one summarised and quoted
    assert sorted(err.errors) == [(line, 41, "use of undeclared identifier 'undefined_name'"),
                                  (line, 64, "expected expression")]
    (_, col, what), (_, col2, what2) = err.errors
    assert err.summary == f"invalid MSL in kernel(s) k: MSL line {line}, column {col}: {what} (and 1 more error)"
    lines = str(err).splitlines()  # the summary, the MSL line quoted with a caret, the next error quoted
    assert lines[0] == err.summary and "of the translation" not in str(err)
    assert lines[1:3] == [f"{line:5d} | kernel void k(device float* x) {{ x[0] = undefined_name + 1.0f +; }}",
                          "      | " + " " * (col - 1) + "^"] and err.quote == "\n".join(lines[1:3])
    assert lines[3] == f"  MSL line {line}, column {col2}: {what2}"
    with pytest.raises(UnsupportedKernelError, match="simd_shuffle_and_fill_down"):
        runner.compile(HEAD + "kernel void k(device float* x) { x[0] = simd_shuffle_and_fill_down(x[0], 0.0f, 1u); }",
                       "k")


def test_a_kernel_past_its_timeout_is_reported_not_waited_for() -> None:
    # a chain of n loads, each waiting for the one before (no compiler shortens it): ~17 ms on PoCL here, more on a
    # GPU (a load's latency there is tens of cycles), far past the 1 ms timeout everywhere
    spin = HEAD + """kernel void spin(device uint* x, constant int& n) {
      uint j = x[0];
      for (int k = 0; k < n; k++) { j = x[j & 3u]; }
      x[4] = j;
    }"""
    own = KernelRunner()
    ck = own.compile(spin, "spin")
    data, var = np.zeros(32, np.uint8), np.zeros(4, np.uint8)
    put(var, 0, np.int32([10_000_000]))
    with pytest.raises(TimeoutError, match="kernel 'spin'.*did not finish within 0.001 s"):
        ck.run({0: (data, 0), 1: (var, 0)}, (1, 1, 1), (1, 1, 1), timeout_s=0.001)
    with pytest.raises(RuntimeError, match="blocked by an earlier kernel that never finished"):
        ck.run({0: (data, 0), 1: (var, 0)}, (1, 1, 1), (1, 1, 1))
    own.queue.finish()  # let the spinning kernel end before the test does


def test_no_opencl_device_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyopencl as cl

    class NoPlatform:  # an OpenCL API whose platform query fails, as with no ICD installed
        Error = cl.Error

        @staticmethod
        def get_platforms() -> list:
            raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    with pytest.raises(RuntimeError, match="no OpenCL platform found .*pocl-opencl-icd ocl-icd-libopencl1"):
        KernelRunner(cl=NoPlatform)
    monkeypatch.setitem(sys.modules, "pyopencl", None)  # what `import pyopencl` meets when it is not installed
    with pytest.raises(RuntimeError, match="pyopencl is not installed"):
        KernelRunner()


def test_the_runner_calls_the_opencl_api_it_is_given() -> None:
    import pyopencl as cl
    calls: list[str] = []

    class Recording:
        def __getattr__(self, name: str) -> object:
            calls.append(name)
            return getattr(cl, name)

    runner = KernelRunner(cl=Recording())
    ck = runner.compile("kernel void k(device float* a, uint3 gid [[thread_position_in_grid]]) { a[gid.x] = 2.0f; }",
                        "k")
    data = np.zeros(16, np.uint8)
    ck.run({0: (data, 0)}, (1, 1, 1), (4, 1, 1))
    assert data.view(np.float32).tolist() == [2.0] * 4
    assert {"get_platforms", "Context", "Program", "Kernel", "kernel_work_group_info",
            "enqueue_nd_range_kernel"} <= set(calls)
    maps = calls.count("enqueue_map_buffer")  # the probe, and on a GPU the page-locked staging areas made once
    assert maps <= 3
    for offset in (4, 0, 8):  # views at offsets: no sub-buffer, and no map per dispatch (results come by copies)
        ck.run({0: (data, offset)}, (1, 1, 1), (2, 1, 1))
    assert calls.count("enqueue_map_buffer") == maps and data.view(np.float32).tolist() == [2.0] * 4


# --- bounds checks: an access outside the MTLBuffer is skipped and reported (KernelAccessError), never a crash ---

def oob(runner: KernelRunner, body: str, bindings: dict, params: str = "device float* data0_1, "
        "device const float* data1_32", grid: tuple[int, int, int] = (1, 1, 1),
        threadgroup: tuple[int, int, int] = (1, 1, 1)) -> KernelAccessError:
    msl = HEAD + f"kernel void k({params}, uint i [[thread_position_in_grid]]) {{\n  {body}\n}}"
    with pytest.raises(KernelAccessError) as info:
        runner.compile(msl, "k").run(bindings, grid, threadgroup)
    return info.value


def test_a_write_loop_far_past_its_buffer_is_stopped_at_the_first_element(runner: KernelRunner) -> None:
    a, b = np.zeros(4, np.uint8), np.zeros(128, np.uint8)
    e = oob(runner, "for (int i = 0; i < 100000000; i++) *(data0_1+i) = 1.0f;", {0: (a, 0), 1: (b, 0)})
    assert (e.function, e.param, e.index, e.write, e.element, e.offset, e.size, e.buffer_bytes) == \
        ("k", "data0_1", 0, True, 1, 4, 4, 4)
    assert str(e).startswith("kernel 'k' wrote 4 bytes out of bounds through parameter 'data0_1' (buffer index 0) "
                             "at element 1 (byte offset 4) of its view at offset 0 of a 4-byte buffer")
    assert a.view(np.float32)[0] == 1.0  # the access in bounds happened


def test_a_small_overrun_does_not_touch_the_memory_after_the_buffer(runner: KernelRunner) -> None:
    memory = np.zeros(4 + 256, np.uint8)
    a, after = memory[:4], memory[4:]  # the 256 bytes after the 4-byte buffer stand for the process's heap
    e = oob(runner, "for (int i = 0; i < 64; i++) data0_1[i] = 7.0f;", {0: (a, 0), 1: (np.zeros(128, np.uint8), 0)})
    assert e.write and e.element == 1
    assert not after.any()


def test_a_far_read_is_reported_with_its_element(runner: KernelRunner) -> None:
    e = oob(runner, "data0_1[0] = *(data1_32 + 100000000);", {0: (np.zeros(4, np.uint8), 0),
                                                                  1: (np.zeros(128, np.uint8), 0)})
    assert (e.param, e.index, e.write, e.element) == ("data1_32", 1, False, 100000000)
    assert "kernel 'k' read 4 bytes" in str(e)


def test_vector_accesses_are_checked_with_their_own_size(runner: KernelRunner) -> None:
    body = "if (i == 0) { float4 v = *((device const float4*)(data1_32 + 4)); *((device float4*)(data0_1 + 4)) = v; }"
    out, inp = np.zeros(32, np.uint8), np.arange(32, dtype=np.uint8)
    runner.compile(HEAD + f"kernel void k(device float* data0_1, device const float* data1_32, uint i "
                   f"[[thread_position_in_grid]]) {{ {body} }}", "k").run({0: (out, 0), 1: (inp, 0)}, (1, 1, 1),
                                                                          (1, 1, 1))
    assert out[16:].tolist() == list(range(16, 32))  # the last 16 bytes exactly: in bounds
    e = oob(runner, body.replace("data1_32 + 4", "data1_32 + 5"), {0: (out, 0), 1: (inp, 0)})
    assert (e.param, e.size, e.element, e.write) == ("data1_32", 16, 5, False)


@pytest.mark.parametrize("offset", [128, 4])  # a sub-buffer, the offset argument
def test_views_may_reach_the_whole_buffer_but_not_past_it(runner: KernelRunner, offset: int) -> None:
    storage = np.zeros(512, np.uint8)
    msl = HEAD + """kernel void k(device float* p, constant int& j, uint i [[thread_position_in_grid]]) {
      p[j] = 5.0f;
    }"""
    kernel = runner.compile(msl, "k")
    var = np.zeros(4, np.uint8)
    put(var, 0, np.int32([-offset // 4]))  # the first float of the MTLBuffer, before the view: Metal allows it
    kernel.run({0: (storage, offset), 1: (var, 0)}, (1, 1, 1), (1, 1, 1))
    assert f32(storage, 0, 1)[0] == 5.0
    put(var, 0, np.int32([-offset // 4 - 1]))
    with pytest.raises(KernelAccessError) as info:
        kernel.run({0: (storage, offset), 1: (var, 0)}, (1, 1, 1), (1, 1, 1))
    assert (info.value.element, info.value.offset, info.value.view_offset) == (-offset // 4 - 1, -offset - 4, offset)
    put(var, 0, np.int32([(512 - offset) // 4]))
    with pytest.raises(KernelAccessError, match=f"at element {(512 - offset) // 4} "):
        kernel.run({0: (storage, offset), 1: (var, 0)}, (1, 1, 1), (1, 1, 1))


def test_pointer_variables_and_helpers_are_checked_against_their_buffer(runner: KernelRunner) -> None:
    msl = HEAD + """static void put(device float* q, int k, float v) { q[k] = v; }
    kernel void k(device float* data0_1, device float* data1_32, constant int& j, uint i [[thread_position_in_grid]]) {
      device float* q = data1_32 + 2;
      q[1] = 1.0f;
      q += j;
      *q = 2.0f;
      put(data1_32 + 1, j, 3.0f);
    }"""
    kernel = runner.compile(msl, "k")
    a, b, var = np.zeros(4, np.uint8), np.zeros(128, np.uint8), np.zeros(4, np.uint8)
    put(var, 0, np.int32([4]))
    kernel.run({0: (a, 0), 1: (b, 0), 2: (var, 0)}, (1, 1, 1), (1, 1, 1))
    assert b.view(np.float32)[[3, 5, 6]].tolist() == [1.0, 3.0, 2.0]
    put(var, 0, np.int32([30]))  # q = data1_32 + 32: one past the end; the helper's store too
    with pytest.raises(KernelAccessError) as info:
        kernel.run({0: (a, 0), 1: (b, 0), 2: (var, 0)}, (1, 1, 1), (1, 1, 1))
    assert (info.value.param, info.value.element) == ("data1_32", 32)


def test_a_struct_read_past_its_buffer_is_checked(runner: KernelRunner) -> None:
    msl = HEAD + """struct P { int n; float s; };
    kernel void k(device float* out, constant P& p, uint i [[thread_position_in_grid]]) { out[0] = p.s * p.n; }"""
    kernel = runner.compile(msl, "k")
    out, var = np.zeros(4, np.uint8), np.zeros(8, np.uint8)
    put(var, 0, np.int32([3]))
    put(var, 4, np.float32([2.0]))
    kernel.run({0: (out, 0), 1: (var, 0)}, (1, 1, 1), (1, 1, 1))
    assert f32(out, 0, 1)[0] == 6.0
    with pytest.raises(KernelAccessError, match="parameter 'p' \\(buffer index 1\\) at byte offset 0 of its view at "
                                                "offset 4 of a 8-byte buffer"):
        kernel.run({0: (out, 0), 1: (var, 4)}, (1, 1, 1), (1, 1, 1))


@pytest.mark.parametrize("in_host_memory", [None, False], ids=["default", "copies"])
def test_after_a_fault_the_runner_goes_on_and_the_fault_record_is_clear(in_host_memory: bool | None) -> None:
    """Where the fault record is in host memory (PoCL) and where it is copied back (a device with its own copies)."""
    runner = KernelRunner(in_host_memory=in_host_memory)
    msl = HEAD + """kernel void k(device float* p, constant int& j, uint i [[thread_position_in_grid]]) {
      p[j] = 1.0f;
    }"""
    kernel = runner.compile(msl, "k")
    p, var = np.zeros(16, np.uint8), np.zeros(4, np.uint8)
    put(var, 0, np.int32([4]))
    with pytest.raises(KernelAccessError):
        kernel.run({0: (p, 0), 1: (var, 0)}, (1, 1, 1), (1, 1, 1))
    put(var, 0, np.int32([3]))
    kernel.run({0: (p, 0), 1: (var, 0)}, (1, 1, 1), (1, 1, 1))  # no stale fault
    assert f32(p, 12, 1)[0] == 1.0


def test_the_process_survives_what_used_to_crash_it(tmp_path: Path) -> None:
    """The newcomer's kernels, in a child process: before the bounds checks each one killed it (SIGSEGV, 139)."""
    script = tmp_path / "crash.py"
    script.write_text(f"""import numpy as np
from mtlir.errors import KernelAccessError
from mtlir.runtime.sim.kernels.runner import KernelRunner
r = KernelRunner()
for body in ["for (int i = 0; i < 100000000; i++) *(data0_1+i) = 1.0f;", "data0_1[0] = *(data1_32 + 100000000);",
             "for (int i = 0; i < 64; i++) *(data0_1+i) = 1.0f;"]:
    k = r.compile({HEAD!r} + "kernel void k(device float* data0_1, device float* data1_32) {{" + body + "}}", "k")
    try:
        k.run({{0: (np.zeros(4, np.uint8), 0), 1: (np.zeros(128, np.uint8), 0)}}, (1, 1, 1), (1, 1, 1))
    except KernelAccessError as e:
        print(e.param, e.element)
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["data0_1 1", "data1_32 100000000", "data0_1 1"]


def test_after_a_fault_loops_stop_so_a_runaway_kernel_ends(runner: KernelRunner) -> None:
    """1024 threads each storing 10**8 floats into a 4-byte buffer: every loop also ends once an access has been
    skipped (the command buffer fails anyway), so the dispatch ends instead of running 10**11 checks."""
    a, b = np.zeros(4, np.uint8), np.zeros(128, np.uint8)
    e = oob(runner, "for (int j = 0; j < 100000000; j++) *(data0_1 + j) = 1.0f;", {0: (a, 0), 1: (b, 0)},
            grid=(4, 1, 1), threadgroup=(256, 1, 1))
    assert e.param == "data0_1" and e.write


def test_threadgroup_and_thread_arrays_are_checked_too(runner: KernelRunner) -> None:
    """tinygrad's kernels keep partial sums in `float buf0[1]` and `threadgroup float buf1[16]`: an index gone wrong
    there reached the stack or PoCL's local memory (a crash) as surely as one past a buffer."""
    msl = HEAD + """kernel void k(device float* out, constant int& j, uint l [[thread_position_in_threadgroup]]) {
      float acc[4];
      threadgroup float part[16];
      part[l] = (float)l;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      acc[0] = *(part + (j & 15));
      out[l] = acc[0] + part[j >> 4];
    }"""
    kernel = runner.compile(msl, "k")
    out, var = np.zeros(64, np.uint8), np.zeros(4, np.uint8)
    put(var, 0, np.int32([3]))
    kernel.run({0: (out, 0), 1: (var, 0)}, (1, 1, 1), (16, 1, 1))
    np.testing.assert_array_equal(f32(out, 0, 16), np.full(16, 3.0))
    put(var, 0, np.int32([16 * 100000000]))
    with pytest.raises(KernelAccessError) as info:
        kernel.run({0: (out, 0), 1: (var, 0)}, (1, 1, 1), (16, 1, 1))
    e = info.value
    assert (e.memory, e.param, e.index, e.write, e.element) == ("threadgroup", "part", -1, False, 100000000)
    assert "kernel 'k' read 4 bytes out of bounds of its threadgroup array 'part' at element 100000000" in str(e)
    private = HEAD + """kernel void k(device float* out, constant int& j, uint l [[thread_position_in_grid]]) {
      float acc[4];
      for (int k = 0; k < 4; k++) acc[k] = (float)k;
      acc[j] = 1.0f;
      out[l] = acc[3];
    }"""
    put(var, 0, np.int32([-100000000]))
    with pytest.raises(KernelAccessError) as info:
        runner.compile(private, "k").run({0: (out, 0), 1: (var, 0)}, (1, 1, 1), (1, 1, 1))
    assert (info.value.memory, info.value.param, info.value.write, info.value.element) == ("thread", "acc", True,
                                                                                             -100000000)


def test_more_threadgroup_memory_than_metal_gives_is_a_compile_error(runner: KernelRunner) -> None:
    """PoCL aborts the whole process when a kernel's __local arrays exceed its limit; Metal refuses the pipeline."""
    msl = HEAD + """kernel void k(device float* out, uint l [[thread_position_in_threadgroup]]) {
      threadgroup float big[16384];
      big[l] = 1.0f;
      out[l] = big[l];
    }"""
    with pytest.raises(KernelCompileError, match=r"kernel 'k' declares 65536 bytes of threadgroup memory, more than "
                                                 r"the 32768 bytes Metal gives a threadgroup"):
        runner.compile(msl, "k")


@pytest.mark.parametrize("name", ["step", "max", "barrier", "get_global_id", "native_sin", "local", "mad24"])
def test_a_kernel_named_like_an_opencl_builtin_runs(runner: KernelRunner, name: str) -> None:
    """Valid MSL (metal::step is in another namespace), but OpenCL's built-ins are overloaded: `__kernel void step`
    built and clCreateKernel refused it (INVALID_KERNEL_NAME, an internal error, exit 5, from `mtlir run`); such a
    kernel is `__mtl_kernel_<name>` in OpenCL, its MSL name everywhere else."""
    msl = HEAD + f"kernel void {name}(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {{\n" \
                 "  out[i] = float(i) + 0.5f;\n}\n"
    ck = runner.compile(msl, name)
    assert ck.function == name and ck.info.opencl_function == f"__mtl_kernel_{name}"
    assert f"__kernel void __mtl_kernel_{name}(" in ck.opencl_source
    out = np.zeros(64, np.uint8)
    ck.run({0: (out, 0)}, (2, 1, 1), (8, 1, 1))
    assert out.view(np.float32).tolist() == [k + 0.5 for k in range(16)]


def test_a_kernel_with_an_ordinary_name_keeps_it_in_opencl(runner: KernelRunner) -> None:
    msl = HEAD + "kernel void stepper(device float* out [[buffer(0)]]) { out[0] = 1; }\n"
    ck = runner.compile(msl, "stepper")
    assert ck.info.opencl_function == "stepper" and "__kernel void stepper(" in ck.opencl_source
