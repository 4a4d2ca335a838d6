"""The simulated device's kernel path against raw pyopencl: whole trace runs, and the overhead per dispatch.

    python benchmarks/bench_dispatch.py [--opencl-device NAME|INDEX] [--rounds 15] [--json FILE] [--skip A,B]

``measure()`` is what ``python -m benchmarks`` calls; it returns the figures as a dict (``sim_run_over_pyopencl``,
``sim_overhead_us_per_dispatch``, the rows). For every trace of examples/traces, on one OpenCL device
(``--opencl-device``: an index or a name substring as ``mtlir run --list-devices`` lists them; default the first),
in one process, the two paths alternating round by round:

- ``sim``: the whole simulated Metal device running the trace, as ``mtlir run`` does: lowered once (ICB path,
  strict mode, the trace's GPU family), linked once into a ``Session`` on a ``SimDevice``, then per round one
  ``submit`` and one ``wait`` (the Objective-C messages, the command buffer, the simulated GPU, the kernels, the
  copies in and out where the device keeps its own memory, the completion the host waits for).
- ``raw``: the same translated OpenCL C (the runner's own translation, built with the runner's options) on the
  same device with plain pyopencl: device buffers and argument blocks made once; per round, per dispatch
  ``set_args`` and ``enqueue_nd_range_kernel``, then ``clFlush`` and one ``clWaitForEvents`` on the last kernel's
  event on the calling thread (the simulated GPU also waits once per batch of dispatches; raw waits the cheapest way there is).

Per round the time of each path: CPU time of the whole process (``time.process_time``: every thread, PoCL's
worker threads included) where the OpenCL device is a CPU, wall time on a GPU (its work is not CPU time). The
ratio is median(sim) / median(raw) over ``rounds`` rounds after two warm-up rounds. ``sim_overhead_us_per_dispatch``
is the same pair on one trace made long (mlp.apple7's five dispatches repeated ``long_repeat`` times into one
command buffer): (median sim - median raw) / dispatches, the simulator's own cost per dispatch of a batch.
``kernel_path_over_pyopencl``: the kernel path alone against the same raw rounds, what the simulated GPU's thread
does for one ICB range (the trace's dispatches prepared once as ``Launch``es, then per round one
``KernelRunner.run_batch``: buffers made current, one enqueue per launch, one wait, the fault records read), without
the Objective-C messages, the Session and the command buffer around it.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mtlir.cli.compare import compare_output
from mtlir.cli.main import positive_int
from mtlir.cli.lower import lower_trace, program_values
from mtlir.frontend.trace import load_trace
from mtlir.metal import DeviceSpec
from mtlir.runtime import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.kernels.devices import device_kind
from mtlir.runtime.sim.kernels.runner import BUILD_OPTIONS, KernelRunner
from mtlir.runtime.sim.msl.guard.bound import FAULT_WORDS, SCRATCH_BYTES
from mtlir.runtime.sim.msl.simd import scratch_bytes

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"
VAR_SLOT = 256
LONG_TRACE = "mlp.apple7.json"
TARGET = "x86_64"


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
    """The same translated kernels launched with plain pyopencl on the runner's device: the runner's context, an
    in-order queue of its own, device buffers and argument blocks made once (``COPY_HOST_PTR``), one wait per
    round."""

    def __init__(self, runner: KernelRunner, work: list[Any]) -> None:
        cl = self.cl = runner.cl
        # the runner's context (two contexts on one GPU make NVIDIA's driver switch between them at every round),
        # a queue of its own
        self.context = runner.context
        self.queue = cl.CommandQueue(self.context, runner.device)
        programs: dict[str, Any] = {}
        buffers: dict[int, Any] = {}
        fault = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size=FAULT_WORDS * 4 + SCRATCH_BYTES)
        cl.enqueue_fill_buffer(self.queue, fault, np.uint8(0), 0, FAULT_WORDS * 4 + SCRATCH_BYTES)
        self.launches = []
        for ck, bindings, grid, tg in work:
            if ck.opencl_source not in programs:
                programs[ck.opencl_source] = cl.Program(self.context, ck.opencl_source).build(options=BUILD_OPTIONS)
            kernel = cl.Kernel(programs[ck.opencl_source], ck.info.opencl_function)
            block = np.zeros(3 * max(1, len(ck.info.bindings)), np.uint64)
            args: list[Any] = []
            for b in ck.info.bindings:
                storage, offset = bindings[b.arg.index]
                key = id(storage)
                if key not in buffers:
                    buffers[key] = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                                             hostbuf=storage)
                args.append(buffers[key])
                block[3 * b.slot], block[3 * b.slot + 2] = offset, storage.nbytes
            args += [cl.Buffer(self.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=block),
                     fault]
            if ck.info.simd:
                args.append(cl.LocalMemory(scratch_bytes(tg[0] * tg[1] * tg[2])))
            glob = tuple(g * t for g, t in zip(grid, tg))
            self.launches.append((kernel, args, glob, tuple(tg)))
        self.queue.finish()

    def round(self) -> None:
        """One pass over the trace: per dispatch set_args + enqueue, then one wait for the last kernel."""
        cl, queue = self.cl, self.queue
        ev = None
        for kernel, args, glob, tg in self.launches:
            kernel.set_args(*args)
            ev = cl.enqueue_nd_range_kernel(queue, kernel, glob, tg)
        if ev is not None:
            queue.flush()  # NVIDIA's driver: a wait without it costs ~130 µs more, and slows the next round too
            ev.wait()


class SimRun:
    """One trace on the simulated device: lowered and linked once; ``round()`` submits once and waits."""

    def __init__(self, path: Path, opencl_device: str | int | None) -> None:
        self.trace = load_trace(path)
        device = DeviceSpec(self.trace.arch, residency_set=True, icb=True)
        self.program = lower_trace(self.trace, device, TARGET, keep_stages=False).program
        self.values = program_values(self.program, self.trace, io.StringIO())
        dev = self.program.device
        self.bridge = SimDevice(TARGET, strict=True, family=dev.family, residency_sets=dev.residency_set, icb=dev.icb)
        if opencl_device is not None:
            self.bridge.choose_opencl_device(opencl_device)
        self.session = Session(self.program, self.bridge, initial=self.trace.initial_data(full=False))

    def round(self) -> None:
        self.session.submit(**self.values)
        self.session.wait(timeout_s=120)

    def output_matches(self) -> bool:
        o = self.trace.output
        got = np.frombuffer(self.session.read(o.placeholder, o.offset, o.nbytes), dtype=np.dtype(o.dtype.fmt))
        return compare_output(got.reshape(o.shape), o.expected_array()).match  # mtlir run's tolerance

    def close(self) -> None:
        self.session.close()
        self.bridge.close()


def _interleaved(a: Callable[[], None], b: Callable[[], None], rounds: int,
                 clock: Callable[[], float]) -> tuple[float, float]:
    """Medians of ``clock`` time in seconds of ``a()`` and ``b()`` run alternately, after two warm-up rounds."""
    ta: list[float] = []
    tb: list[float] = []
    for r in range(rounds + 2):
        for f, out in ((a, ta), (b, tb)) if r % 2 else ((b, tb), (a, ta)):
            start = clock()
            f()
            if r >= 2:
                out.append(clock() - start)
    return statistics.median(ta), statistics.median(tb)


def _long_trace(src: Path, repeat: int, folder: Path) -> Path:
    """``src`` with its dispatches repeated ``repeat`` times (a pure feed-forward trace: the output stays)."""
    doc = json.loads(src.read_text())
    doc["dispatches"] = doc["dispatches"] * repeat
    out = folder / f"long{repeat}.{src.name}"
    out.write_text(json.dumps(doc))
    return out


def _pair(path: Path, opencl_device: str | int | None, rounds: int) -> dict[str, Any]:
    """One trace: sim and raw rounds interleaved; the figures in µs per round and per dispatch."""
    sim = SimRun(path, opencl_device)
    try:
        runner = sim.bridge.kernel_runner
        doc = json.loads(path.read_text())
        work = dispatches(runner, doc, storages_of(doc))
        raw = Raw(runner, work)
        on_cpu = device_kind(runner.cl, runner.device) == "CPU"
        clock = time.process_time if on_cpu else time.perf_counter
        sim_s, raw_s = _interleaved(sim.round, raw.round, rounds, clock)
        sim_wall, raw_wall = _interleaved(sim.round, raw.round, max(3, rounds // 2), time.perf_counter)
        launches = [ck.prepare(b, g, t, keep=True) for ck, b, g, t in work]
        batch = [la for la in launches if la is not None]

        def kernel_path() -> None:  # what the simulated GPU's thread does for one ICB range: one batch, one wait
            runner.run_batch(batch, 120, keep=True)
        batch_s, raw_b = _interleaved(kernel_path, raw.round, rounds, clock)
        runner.sync()
        n = len(work)
        return {"trace": path.name, "dispatches": n, "clock": "cpu" if on_cpu else "wall",
                "sim_us": sim_s * 1e6, "raw_us": raw_s * 1e6, "ratio": sim_s / raw_s,
                "kernel_path_us": batch_s * 1e6, "kernel_path_raw_us": raw_b * 1e6,
                "kernel_path_ratio": batch_s / raw_b,
                "sim_wall_us": sim_wall * 1e6, "raw_wall_us": raw_wall * 1e6, "wall_ratio": sim_wall / raw_wall,
                "overhead_us_per_dispatch": (sim_s - raw_s) / n * 1e6, "match": sim.output_matches(),
                "device": runner.device_name}
    finally:
        sim.close()


def measure(opencl_device: str | int | None = None, rounds: int = 15, skip: tuple[str, ...] = (),
            long_repeat: int = 40, out: Any = None, long_traces: tuple[str, ...] = (LONG_TRACE,)) -> dict[str, Any]:
    """The simulator's figures: ``sim_run_over_pyopencl`` (``worst`` over the traces and ``traces``: name ->
    ratio), ``sim_overhead_us_per_dispatch`` (the first of ``long_traces`` made long, one command buffer),
    ``long_over_pyopencl`` (each of ``long_traces`` made long: name -> ratio, and the ``worst``), ``device`` (the
    OpenCL device), ``rows`` (everything measured, µs). Prints a row per trace to ``out`` (a text file; None:
    nothing)."""
    rows = []
    for path in sorted(p for p in TRACES.glob("*.json") if p.name not in skip):
        row = _pair(path, opencl_device, rounds)
        rows.append(row)
        if out is not None:
            _print_row(row, out)
    longs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in long_traces:
            longs.append(_pair(_long_trace(TRACES / name, long_repeat, Path(tmp)), opencl_device, rounds))
            if out is not None:
                _print_row(longs[-1], out)
    long = longs[0]
    return {"device": rows[0]["device"] if rows else long["device"],
            "sim_run_over_pyopencl": {"worst": max(r["ratio"] for r in rows),
                                      "traces": {r["trace"]: r["ratio"] for r in rows}},
            "kernel_path_over_pyopencl": {"worst": max(r["kernel_path_ratio"] for r in rows),
                                          "traces": {r["trace"]: r["kernel_path_ratio"] for r in rows}},
            "sim_overhead_us_per_dispatch": long["overhead_us_per_dispatch"],
            "long_over_pyopencl": {"worst": max(r["ratio"] for r in longs),
                                   "traces": {r["trace"]: r["ratio"] for r in longs}},
            "rows": rows + longs}


def _print_row(row: dict[str, Any], out: Any) -> None:
    print(f"{row['trace']:30} {row['dispatches']:4} {row['sim_us']:9.1f} {row['raw_us']:9.1f} {row['ratio']:6.2f} "
          f"{row['wall_ratio']:6.2f} {row['overhead_us_per_dispatch']:8.1f} {row['kernel_path_ratio']:7.2f} "
          f"{'match' if row['match'] else 'MISMATCH'}", file=out, flush=True)


def nonempty_path(text: str) -> Path:
    """An argparse type: a path that is not empty (``Path("")`` is the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: an empty path")
    return Path(text)


def opencl_device_arg(text: str) -> str:
    """An argparse type: a device index or a non-empty part of a device's name (``mtlir run --list-devices``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: an empty name: give an index or a part of a device's name "
                                         "(mtlir run --list-devices lists them)")
    return text


def check_opencl_device(ap: argparse.ArgumentParser, which: str | None) -> None:
    """``ap.error`` (exit 2) unless the OpenCL device ``which`` exists (None: any device at all), before anything
    is measured: ``NoDeviceError`` (no pyopencl, no platform, no such device) used to end the run as a
    traceback."""
    from mtlir.errors import NoDeviceError
    from mtlir.runtime.sim.kernels.devices import INSTALL_HINT, select_device
    try:
        import pyopencl as cl
    except ImportError:
        ap.error(f"--opencl-device: pyopencl is not installed: {INSTALL_HINT}")
    try:
        select_device(cl, which)
    except NoDeviceError as e:
        ap.error(f"--opencl-device {which}: {e}" if which is not None else str(e))


def check_output_file(ap: argparse.ArgumentParser, flag: str, path: Path | None) -> None:
    """``ap.error`` (exit 2) unless ``path`` can be written as a file: its folder exists and is writable, and it is
    not a folder (``--json /nonexistent/x.json`` failed only after the whole run)."""
    if path is None:
        return
    if path.is_dir():
        ap.error(f"{flag} {path}: is a folder: give a file name")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        ap.error(f"{flag} {path}: no folder {folder}")
    try:
        with tempfile.TemporaryFile(dir=folder):  # a real write: os.access says yes to root on a read-only mount
            pass
    except OSError as e:
        ap.error(f"{flag} {path}: folder {folder} is not writable: {e.strerror or e}")


def _trace_names(ap: argparse.ArgumentParser, flag: str, text: str) -> tuple[str, ...]:
    """The comma-separated trace file names of ``flag``, each a file of examples/traces, else ``ap.error``."""
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [n for n in names if not (TRACES / n).is_file()]
    if unknown:
        present = ", ".join(sorted(p.name for p in TRACES.glob("*.json")))
        ap.error(f"{flag}: no trace {', '.join(map(repr, unknown))} in {TRACES} (its traces: {present})")
    return names


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring). Every option is checked before anything is measured: a bad one is an
    argparse error (exit 2) naming it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--opencl-device", type=opencl_device_arg, default=None, metavar="NAME|INDEX",
                    help="the OpenCL device (an index or a part of its name; default the first)")
    ap.add_argument("--rounds", type=positive_int("at least 1"), default=15, help="interleaved rounds per figure (>= 1)")
    ap.add_argument("--long-repeat", type=positive_int("at least 1"), default=40,
                    help="how many times the long traces repeat their dispatches (>= 1)")
    ap.add_argument("--json", type=nonempty_path, default=None, help="also write the figures to this file")
    ap.add_argument("--skip", default="", help="trace file names to leave out, comma-separated")
    ap.add_argument("--long-traces", default=LONG_TRACE,
                    help="traces to also run made long (their dispatches repeated --long-repeat times into one "
                         "command buffer), comma-separated; the first gives sim_overhead_us_per_dispatch")
    args = ap.parse_args(argv)
    skip = _trace_names(ap, "--skip", args.skip)
    long_traces = _trace_names(ap, "--long-traces", args.long_traces) or (LONG_TRACE,)
    if all(p.name in skip for p in TRACES.glob("*.json")):
        ap.error("--skip leaves no trace to measure")
    check_output_file(ap, "--json", args.json)
    check_opencl_device(ap, args.opencl_device)
    print(f"{'trace':30} {'disp':>4} {'sim us':>9} {'raw us':>9} {'ratio':>6} {'wall':>6} {'ovh us/d':>8} "
          f"{'kernels':>7}")
    figures = measure(args.opencl_device, args.rounds, skip, args.long_repeat, out=sys.stdout, long_traces=long_traces)
    print(f"OpenCL device: {figures['device']}; medians of {args.rounds} interleaved rounds "
          f"({figures['rows'][0]['clock']} time)")
    print(f"long_over_pyopencl (worst): {figures['long_over_pyopencl']['worst']:.2f} "
          f"({', '.join(f'{k} {v:.2f}' for k, v in figures['long_over_pyopencl']['traces'].items())})")
    print(f"kernel_path_over_pyopencl (worst): {figures['kernel_path_over_pyopencl']['worst']:.2f}")
    print(f"sim_run_over_pyopencl (worst): {figures['sim_run_over_pyopencl']['worst']:.2f} (bar 1.3); "
          f"sim_overhead_us_per_dispatch: {figures['sim_overhead_us_per_dispatch']:.1f} (bar 20)")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
