"""Per-dispatch overhead of the simulated device's kernel runner against raw pyopencl, and each trace's GPU kernel time.

    python benchmarks/bench_dispatch.py [--opencl-device NAME|INDEX] [--repeat 30] [--json FILE] [--skip A,B]

For every trace of examples/traces, on one OpenCL device (``--opencl-device``: an index or a name substring as
``mtlir run --list-devices`` lists them; default the first), in one run:

- ``mtlir``: every dispatch of the trace through ``CompiledKernel.run(..., keep=True)`` as the simulated GPU runs
  them between two sync points (bindings checked, buffers already on the device, the fault record read back, the
  kernel waited for): the per-dispatch cost. ``sync`` is measured apart, per submit: the runner's ``sync()`` and
  the copies in at the next submit's first uses (every buffer a submit touches, in and, where written, out: what
  a command buffer's start and end cost on a device with its own memory; nothing on PoCL, which works in place).
- ``raw``: the same translated OpenCL C (``CompiledKernel.opencl_source``, built here with the runner's options) on
  the same device, launched with plain pyopencl: device buffers made once, per dispatch ``set_args``,
  ``enqueue_nd_range_kernel`` and a wait for the kernel's event (the simulated GPU runs one kernel at a time,
  so the baseline waits too); its queue profiles, which gives the kernels' device time.
- ``sim``: the whole simulated Metal device end to end, for orientation: ``mtlir run --repeat N`` against
  ``--repeat 1`` (lowering and link cancel out), the extra wall time over the extra dispatches: what one dispatch
  of a submit costs with the Objective-C messages, the ICB and the waits.

Each of ``--repeat`` rounds runs the whole trace once per path; the table gives medians in µs per dispatch, the
ratio mtlir / raw (the issue's bar: at most 1.3), the sync per submit in µs and the median GPU time of all kernels
of one trace (the sum of the profiled kernels' end - start). Numbers are measured in this run only.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from mtlir.cli.main import main as mtlir_main
from mtlir.runtime.sim.kernels.compiled import CompiledKernel
from mtlir.runtime.sim.kernels.runner import BUILD_OPTIONS, KernelRunner
from mtlir.runtime.sim.msl.guard.bound import FAULT_WORDS, SCRATCH_BYTES
from mtlir.runtime.sim.msl.simd import scratch_bytes

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"
VAR_SLOT = 256


def storages_of(trace: dict[str, Any]) -> dict[int, np.ndarray]:
    """Each buffer's bytes: zeros, with the ``init`` bytes at their offset."""
    out = {}
    for key, buf in trace["buffers"].items():
        storage = np.zeros(buf["size"], np.uint8)
        if buf["init"] is not None:
            data = np.frombuffer(base64.b64decode(buf["init"]["b64"]), np.uint8)
            storage[buf["init"]["offset"]:buf["init"]["offset"] + data.size] = data
        out[int(key)] = storage
    return out


def dispatches(runner: KernelRunner, trace: dict[str, Any], storages: dict[int, np.ndarray]) -> list[Any]:
    """(kernel, bindings, grid, threadgroup) per dispatch, the variables at their recorded values."""
    values = {name: var["value"] for name, var in trace["variables"].items()}
    out = []
    for d in trace["dispatches"]:
        prog = trace["programs"][d["kernel"]]
        ck = runner.compile(prog["msl"], prog["function"])
        bindings = {i: (storages[a["buffer"]], a["offset"]) for i, a in enumerate(d["args"])}
        var_params = [(name, index) for name, index, *_ in prog["signature"] if name is not None]
        varbuf = np.zeros(VAR_SLOT * max(1, len(var_params)), np.uint8)
        for slot, (name, index) in enumerate(var_params):
            varbuf[slot * VAR_SLOT:slot * VAR_SLOT + 4] = np.frombuffer(np.int32(values[name]).tobytes(), np.uint8)
            bindings[index] = (varbuf, slot * VAR_SLOT)

        def size(field: str) -> tuple[int, ...]:
            expr = d.get(f"{field}_expr") or d[field]
            return tuple(values[v] if isinstance(v, str) else int(v) for v in expr)
        out.append((ck, bindings, size("grid"), size("threadgroup")))
    return out


class Raw:
    """The same translated kernels launched with plain pyopencl on the runner's device (a profiling queue)."""

    def __init__(self, runner: KernelRunner, work: list[Any]) -> None:
        cl = self.cl = runner.cl
        self.context = cl.Context([runner.device])
        self.queue = cl.CommandQueue(self.context, runner.device,
                                     properties=cl.command_queue_properties.PROFILING_ENABLE)
        programs: dict[str, Any] = {}
        buffers: dict[int, Any] = {}
        fault = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size=FAULT_WORDS * 4 + SCRATCH_BYTES)
        cl.enqueue_fill_buffer(self.queue, fault, np.uint8(0), 0, FAULT_WORDS * 4 + SCRATCH_BYTES)
        self.launches = []
        for ck, bindings, grid, tg in work:
            ck_: CompiledKernel = ck
            if ck_.opencl_source not in programs:
                programs[ck_.opencl_source] = cl.Program(self.context, ck_.opencl_source).build(options=BUILD_OPTIONS)
            kernel = cl.Kernel(programs[ck_.opencl_source], ck_.function)
            block = np.zeros(3 * max(1, len(ck_.info.bindings)), np.uint64)
            args: list[Any] = []
            for b in ck_.info.bindings:
                storage, offset = bindings[b.arg.index]
                key = id(storage)
                if key not in buffers:
                    buffers[key] = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                                             hostbuf=storage)
                args.append(buffers[key])
                block[3 * b.slot], block[3 * b.slot + 2] = offset, storage.nbytes
            args += [cl.Buffer(self.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=block),
                     fault]
            threads = tg[0] * tg[1] * tg[2]
            if ck_.info.simd:
                args.append(cl.LocalMemory(scratch_bytes(threads)))
            glob = tuple(g * t for g, t in zip(grid, tg))
            self.launches.append((kernel, args, glob, tuple(tg)))
        self.queue.finish()

    def round(self) -> tuple[float, float]:
        """One pass over the trace: (host seconds, GPU seconds of the kernels)."""
        cl = self.cl
        events = []
        start = time.perf_counter()
        for kernel, args, glob, tg in self.launches:
            kernel.set_args(*args)
            ev = cl.enqueue_nd_range_kernel(self.queue, kernel, glob, tg)
            ev.wait()
            events.append(ev)
        host = time.perf_counter() - start
        gpu = sum(ev.profile.end - ev.profile.start for ev in events) * 1e-9
        return host, gpu


def sim_end_to_end(path: Path, device: str | None, repeat: int) -> float:
    """µs of wall time per dispatch of one more submit of ``mtlir run`` on the simulated device (``--repeat``
    against ``--repeat 1``)."""
    times, kernels = [], 0
    for n in (1, repeat):
        out, log = io.StringIO(), io.StringIO()
        argv = ["run", str(path), "--json", "--repeat", str(n)] + (["--opencl-device", device] if device else [])
        start = time.perf_counter()
        code = mtlir_main(argv, out=out, log=log)
        times.append(time.perf_counter() - start)
        doc = json.loads(out.getvalue())
        if code != 0:  # a mismatch or an error: no figure, the table says so
            return math.nan
        kernels = doc["kernels"]
    return (times[1] - times[0]) / ((repeat - 1) * kernels) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--opencl-device", default=None)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    ap.add_argument("--skip", default="", help="trace file names to leave out, comma-separated")
    args = ap.parse_args()
    runner = KernelRunner(args.opencl_device)
    print(f"OpenCL device: {runner.device_name}; {args.repeat} rounds per path, medians")
    print(f"{'trace':28} {'disp':>4} {'mtlir us/d':>10} {'raw us/d':>9} {'ratio':>6} {'sync us/sub':>11} "
          f"{'sim us/d':>9} {'GPU us/trace':>12}")
    rows = []
    for path in sorted(p for p in TRACES.glob("*.json") if p.name not in args.skip.split(",")):
        trace = json.loads(path.read_text())
        storages = storages_of(trace)
        work = dispatches(runner, trace, storages)
        raw = Raw(runner, work)
        n = len(work)
        ours, theirs, gpu, cold = [], [], [], []
        for r in range(2 * args.repeat + 2):  # two warm-up rounds, then alternate the paths
            start = time.perf_counter()
            if r % 2:  # every other round starts as a submit does: synced, its buffers to copy in at first use
                runner.sync()
            for ck, bindings, grid, tg in work:
                ck.run(bindings, grid, tg, keep=True)
            t_ours = time.perf_counter() - start
            t_raw, t_gpu = raw.round()
            if r >= 2:
                (cold if r % 2 else ours).append(t_ours * 1e6)
                theirs.append(t_raw / n * 1e6)
                gpu.append(t_gpu * 1e6)
        runner.sync()
        warm = statistics.median(ours)
        ours = [t / n for t in ours]
        sim = sim_end_to_end(path, args.opencl_device, max(5 * args.repeat, 2))
        row = {"trace": path.name, "dispatches": n, "mtlir_us": statistics.median(ours),
               "raw_us": statistics.median(theirs), "sync_us_per_submit": statistics.median(cold) - warm, "sim_us": sim,
               "gpu_us_per_trace": statistics.median(gpu)}
        row["ratio"] = row["mtlir_us"] / row["raw_us"]
        rows.append(row)
        print(f"{path.name:28} {n:4} {row['mtlir_us']:10.1f} {row['raw_us']:9.1f} {row['ratio']:6.2f} "
              f"{row['sync_us_per_submit']:11.1f} {sim:9.1f} {row['gpu_us_per_trace']:12.1f}")
    worst = max(r["ratio"] for r in rows)
    print(f"worst ratio mtlir / raw: {worst:.2f} (bar: 1.3)")
    if args.json is not None:
        args.json.write_text(json.dumps({"device": runner.device_name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
