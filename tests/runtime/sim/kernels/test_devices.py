"""The OpenCL device the kernels run on: choosing it (select_device, list_devices, SimDevice(opencl_device=...)), views
of one arena buffer on every device present (PoCL, Oclgrind where installed, a GPU where there is one), and buffers
kept on the device between kernels until sync()."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mtlir.errors import ArgumentError, NoDeviceError
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.kernels.pyrunner import PyKernelRunner
from mtlir.runtime.sim.kernels.devices import list_devices, select_device
from mtlir.runtime.sim.kernels.runner import KEEP_SYNCS, KernelRunner

cl = pytest.importorskip("pyopencl")

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
ADD = HEAD + """kernel void add(device const float* a, device const float* b, device float* out,
                uint i [[thread_position_in_grid]]) {
  out[i] = a[i] + b[i];
}"""
# Oclgrind's ICD library (Debian's package oclgrind); the Makefile installs it for make test
OCLGRIND_ICD = Path("/usr/lib/oclgrind/liboclgrind-rt-icd.so")
DEVICES = list_devices()


def f32(storage: np.ndarray, offset: int, count: int) -> np.ndarray:
    return storage[offset:offset + 4 * count].view(np.float32)


def arena() -> np.ndarray:
    """The issue's arena (8704 bytes, as tinygrad's memory planner lays out one): inputs at 512 and 2560, 2048 bytes
    each, the output at 6656, and 0xAB everywhere else (old bytes a lost write would leave)."""
    storage = np.full(8704, 0xAB, np.uint8)
    f32(storage, 512, 512)[:] = np.arange(512, dtype=np.float32)
    f32(storage, 2560, 512)[:] = 1000 + 2 * np.arange(512, dtype=np.float32)
    return storage


@pytest.mark.parametrize("in_host_memory", [None, False], ids=["default", "copies"])
@pytest.mark.parametrize("index", range(len(DEVICES)), ids=[d.split(" (")[0] for d in DEVICES])
def test_views_of_one_arena_on_every_device(index: int, in_host_memory: bool | None) -> None:
    """A kernel whose inputs and output are views of one buffer at offsets that are multiples of every device's
    mem_base_addr_align (512 bytes on NVIDIA): the output lands in the arena and nothing else changes. Before the
    fix each view was an OpenCL sub-buffer reaching to the end of the buffer, so they overlapped, and NVIDIA's
    driver kept the arena's old bytes at 6656. Run as the device works (in host memory on PoCL) and with the
    device's own copies (as on a discrete GPU)."""
    runner = KernelRunner(index, in_host_memory=in_host_memory)
    ck = runner.compile(ADD, "add")
    storage = arena()
    before = storage.copy()
    bindings = {0: (storage, 512), 1: (storage, 2560), 2: (storage, 6656)}
    assert [v.how for v in ck.views(bindings)] == ["offset"] * 3
    ck.run(bindings, (4, 1, 1), (128, 1, 1))
    np.testing.assert_array_equal(f32(storage, 6656, 512), 1000 + 3 * np.arange(512, dtype=np.float32))
    rest = np.ones(storage.nbytes, bool)
    rest[6656:6656 + 2048] = False
    np.testing.assert_array_equal(storage[rest], before[rest])
    # chained through the arena on the device (keep): the second kernel reads what the first wrote
    ck.run({0: (storage, 6656), 1: (storage, 512), 2: (storage, 4608)}, (4, 1, 1), (128, 1, 1), keep=True)
    ck.run({0: (storage, 4608), 1: (storage, 4608), 2: (storage, 6656)}, (4, 1, 1), (128, 1, 1), keep=True)
    runner.sync()
    np.testing.assert_array_equal(f32(storage, 6656, 512), 2 * (1000 + 4 * np.arange(512, dtype=np.float32)))


@pytest.mark.skipif(not OCLGRIND_ICD.exists(), reason=f"Oclgrind is not installed ({OCLGRIND_ICD} is missing; "
                                                      "make test installs Debian's package oclgrind)")
def test_views_of_one_arena_on_oclgrind(tmp_path: Path) -> None:
    """The arena test on Oclgrind, a second OpenCL device, in a process whose ICD loader sees only it (an ICD file
    in a folder that OCL_ICD_VENDORS names)."""
    (tmp_path / "oclgrind.icd").write_text(f"{OCLGRIND_ICD}\n")
    env = dict(os.environ, OCL_ICD_VENDORS=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                           f"{__file__}::test_views_of_one_arena_on_every_device"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "PASSED" in proc.stdout and "Oclgrind" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("in_host_memory", [None, False], ids=["default", "copies"])
def test_results_stay_on_the_device_until_sync(in_host_memory: bool | None) -> None:
    """keep=True leaves what a kernel wrote in the device's copy; sync() brings it home and forgets the copies, so
    the next run sees what the host wrote in between."""
    runner = KernelRunner(in_host_memory=in_host_memory)
    ck = runner.compile(ADD, "add")
    storage = arena()
    bindings = {0: (storage, 512), 1: (storage, 2560), 2: (storage, 6656)}
    ck.run(bindings, (4, 1, 1), (128, 1, 1), keep=True)
    assert runner.resident == 1
    if not runner.in_host_memory:  # a device with its own copies: the result is still there
        assert (storage[6656:6656 + 2048] == 0xAB).all()
    runner.sync()
    assert runner.resident == 0
    np.testing.assert_array_equal(f32(storage, 6656, 512), 1000 + 3 * np.arange(512, dtype=np.float32))
    f32(storage, 512, 512)[:] = 0  # the host writes between syncs
    ck.run(bindings, (4, 1, 1), (128, 1, 1))
    np.testing.assert_array_equal(f32(storage, 6656, 512), 1000 + 2 * np.arange(512, dtype=np.float32))
    assert runner.resident == 0  # a run without keep syncs at once


def test_select_device_by_index_and_name() -> None:
    first = select_device(cl)
    assert select_device(cl, 0) == first and select_device(cl, "0") == first
    name = DEVICES[0].split(": ", 1)[1]
    assert select_device(cl, name.split(" / ")[1][:6].upper()) == first  # a substring, any case
    assert DEVICES[0].startswith(f"0: {first.platform.name.strip()} / {first.name.strip()} (")
    with pytest.raises(NoDeviceError, match=r"no OpenCL device matches 'no such device': the devices present "
                                            r"are 0: "):
        select_device(cl, "no such device")
    with pytest.raises(NoDeviceError, match=f"no OpenCL device {len(DEVICES)}: "):
        select_device(cl, len(DEVICES))
    assert KernelRunner(str(len(DEVICES) - 1)).device == select_device(cl, len(DEVICES) - 1)


def test_sim_device_takes_an_opencl_device() -> None:
    dev = SimDevice("x86_64", opencl_device=0)
    assert dev.opencl_device_name is None  # no runner before the first kernel
    assert dev.kernel_runner.device_name == DEVICES[0].split(": ", 1)[1].split(" (")[0]
    assert dev.opencl_device_name == dev.kernel_runner.device_name
    with pytest.raises(ArgumentError, match="choose the OpenCL device before the first kernel"):
        dev.choose_opencl_device(0)
    with pytest.raises(ArgumentError, match="not both"):
        SimDevice("x86_64", kernel_runner=PyKernelRunner(), opencl_device=0)
    late = SimDevice("x86_64")
    late.choose_opencl_device("no such device")
    with pytest.raises(NoDeviceError, match="no such device"):
        late.kernel_runner


def test_a_device_with_its_own_copies_cannot_work_in_place() -> None:
    runner = KernelRunner(in_host_memory=False)
    assert not runner.in_host_memory
    if KernelRunner().in_host_memory:
        assert KernelRunner(in_host_memory=True).in_host_memory
    else:
        with pytest.raises(ValueError, match="keeps its own copy of buffers"):
            KernelRunner(in_host_memory=True)


def test_the_simd_scratch_argument_is_aligned_for_its_widest_slot() -> None:
    """NVIDIA's OpenCL places a __local kernel argument at its pointee type's alignment: declared `__local uchar*`,
    the SIMD-group scratch could start at an odd address, and every kernel exchanging values between lanes faulted
    there (error -9999, the Apple9 traces with SIMD-group matrices among them; docs/performance.md). Declared as
    32-byte words it is aligned for every slot type (long4 at most), and the kernel still runs here."""
    from mtlir.runtime.sim.msl.translate import translate
    msl = HEAD + """kernel void lane_sum(device float* out, uint i [[thread_position_in_grid]]) {
      out[i] = simd_sum(1.0f);
    }"""
    source = translate(msl).source
    signature = source[source.index("__kernel void lane_sum("):].split("{", 1)[0]
    assert "__local ulong4* __mtl_simd_words" in signature and "uchar" not in signature.split("__mtl_fault")[1]
    ck = KernelRunner().compile(msl, "lane_sum")
    data = np.zeros(4 * 64, np.uint8)
    ck.run({0: (data, 0)}, (1, 1, 1), (64, 1, 1))
    assert (data.view(np.float32) == 32).all()


@pytest.mark.parametrize("in_host_memory", [None, False], ids=["default", "copies"])
def test_a_buffer_unused_for_several_syncs_is_dropped_and_a_kept_launch_binds_it_again(
        in_host_memory: bool | None) -> None:
    """An OpenCL buffer no launch used for KEEP_SYNCS syncs goes at the next sweep; a kept launch still naming it
    makes a new one at its next run, and the results are right (the sync after it copies them home)."""
    runner = KernelRunner(in_host_memory=in_host_memory)
    ck = runner.compile(ADD, "add")
    storage = arena()
    launch = ck.prepare({0: (storage, 512), 1: (storage, 2560), 2: (storage, 6656)}, (4, 1, 1), (128, 1, 1),
                        keep=True)
    assert launch is not None
    assert runner.run_batch([launch], 30.0, keep=True) is None
    runner.sync()
    assert len(runner._buffers) == 1
    for _ in range(2 * KEEP_SYNCS):
        runner.sync()
    assert not runner._buffers  # dropped
    f32(storage, 512, 512)[:] = 0  # the host writes while no device copy exists
    assert runner.run_batch([launch], 30.0, keep=True) is None
    runner.sync()
    assert len(runner._buffers) == 1
    np.testing.assert_array_equal(f32(storage, 6656, 512), 1000 + 2 * np.arange(512, dtype=np.float32))
