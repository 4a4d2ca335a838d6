"""The simulated device on a GPU's OpenCL (marked ``gpu``; ``make test-gpu`` runs only these): every recorded trace
matches there as on PoCL, and a threadgroup whose SIMD-group scratch does not fit the GPU's local memory is refused
with an error that says so. Skipped, naming the devices present, where no OpenCL device is a GPU."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from mtlir.cli.main import main
from mtlir.runtime.sim.kernels.devices import device_kind, list_devices, select_device
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.msl.simd import scratch_bytes

cl = pytest.importorskip("pyopencl")
pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[4]
TRACES = sorted({p.name: p for d in (ROOT / "examples" / "traces", ROOT.parent / "shared" / "traces")
                 for p in d.glob("*.json")}.values(), key=lambda p: str(p))


def gpu_index() -> int:
    """The index (``list_devices``) of the first OpenCL device that is a GPU; skips the test, naming the devices
    present, where there is none."""
    devices = list_devices()
    for i in range(len(devices)):
        if device_kind(cl, select_device(cl, i)) == "GPU":
            return i
    pytest.skip(f"no OpenCL device is a GPU (present: {'; '.join(devices) or 'none'}); run make test-gpu on a "
                "machine with one (docs/performance.md says how it ran on an NVIDIA H200)")


@pytest.mark.parametrize("trace", TRACES, ids=[p.name for p in TRACES])
def test_every_trace_matches_on_the_gpu(trace: Path) -> None:
    index = gpu_index()
    out, log = io.StringIO(), io.StringIO()
    code = main(["run", str(trace), "--opencl-device", str(index), "--json"], out=out, log=log)
    doc = json.loads(out.getvalue())
    assert code == 0 and doc["match"], (doc, log.getvalue()[-2000:])
    assert doc["opencl_device"] == list_devices()[index].split(": ", 1)[1].split(" (")[0]


SIMD = """#include <metal_stdlib>
using namespace metal;
kernel void lane_sum(device float* out, uint i [[thread_position_in_grid]]) {
  out[i] = simd_sum(1.0f);
}"""


def test_simd_scratch_beyond_local_memory_is_refused() -> None:
    """A SIMD-group kernel needs 68 bytes of local memory per thread: 1024 threads need 68 KiB, NVIDIA's OpenCL has
    48 KiB. Such a threadgroup is refused naming the sizes; the largest that fits runs."""
    runner = KernelRunner(gpu_index())
    ck = runner.compile(SIMD, "lane_sum")
    local = runner.device.local_mem_size
    threads = min(1024, ck.max_threads_per_threadgroup)
    data = np.zeros(4 * 1024, np.uint8)
    if scratch_bytes(threads) + ck.local_mem_bytes > local:
        with pytest.raises(ValueError, match=f"needs {scratch_bytes(threads) + ck.local_mem_bytes} bytes of local "
                                             f"memory .* more than the {local} bytes"):
            ck.run({0: (data, 0)}, (1, 1, 1), (threads, 1, 1))
    fits = min(ck.max_simd_threads, threads)
    ck.run({0: (data, 0)}, (1, 1, 1), (fits, 1, 1))
    assert (data.view(np.float32)[:fits] == 32).all()
