"""The command line of ``python -m benchmarks``: the groups, the table, the JSON (``benchmarks.__main__``).

``GROUPS`` maps a name (``--only``) to the function returning that group's figures. ``TARGETS`` lists each
headline figure with issue 14's target and the figure measured beside it as the absolute number. The JSON is one
object: every group's figures merged (``lowering_us_per_cmd``, ``rewrite_nomatch_over_dfs``, ...), plus
``"machine"`` (processor, CPUs, Python) and ``"skipped"`` (group -> why it could not run here).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from benchmarks.bench_dispatch import check_opencl_device, nonempty_path, opencl_device_arg
from benchmarks.standin import StandInError

__all__ = ["GROUPS", "TARGETS", "run_groups", "table", "main"]


def _lowering(quick: bool, device: Any) -> dict[str, Any]:
    from benchmarks.compiler import lowering_figures
    return lowering_figures(quick)


def _rewrite(quick: bool, device: Any) -> dict[str, Any]:
    from benchmarks.compiler import rewrite_figures
    return rewrite_figures(quick)


def _replay(quick: bool, device: Any) -> dict[str, Any]:
    from benchmarks.replay import replay_figures
    return replay_figures(quick)


def _submit(quick: bool, device: Any) -> dict[str, Any]:
    from benchmarks.submit import submit_figures
    return submit_figures(quick)


def _sim(quick: bool, device: Any) -> dict[str, Any]:
    from benchmarks.sim import sim_figures
    return sim_figures(quick, device)


def _simdgroup(quick: bool, device: Any) -> dict[str, Any]:
    from benchmarks.simdgroup import simdgroup_figures
    return simdgroup_figures(quick)


def _tinygrad(quick: bool, device: Any) -> dict[str, Any]:
    from benchmarks.tinygrad_device import measure
    fig = measure(rounds=5 if quick else 9, calls=10 if quick else 20)
    return {f"tinygrad_{k}": v for k, v in fig.items()}


GROUPS: dict[str, Callable[[bool, Any], dict[str, Any]]] = {
    "lowering": _lowering, "rewrite": _rewrite, "replay": _replay, "submit": _submit, "sim": _sim,
    "simdgroup": _simdgroup}
if importlib.util.find_spec("tinygrad") is not None:  # the tinygrad device's group: only with the tinygrad extra
    GROUPS["tinygrad"] = _tinygrad

# (figure, issue 14's target: the figure should be at most this, unit)
TARGETS: list[tuple[str, float, str]] = [
    ("lowering_us_per_cmd (worst path and size)", 5.0, "us"),
    ("lowering_scaling_100k_over_1k", 1.3, "x"),
    ("memory_bytes_per_cmd", 1024.0, "B"),
    ("rewrite_nomatch_over_dfs", 2.0, "x"),
    ("rewrite_match_over_tinygrad", 0.8, "x"),
    ("replay_compiled_over_direct", 1.05, "x"),
    ("replay_interp_over_direct", 1.5, "x"),
    ("submit_time_100k_over_10", 1.3, "x"),
    ("sim_run_over_pyopencl", 1.3, "x"),
    ("sim_overhead_us_per_dispatch", 20.0, "us"),
    ("long_over_pyopencl", 1.3, "x"),  # issue 12's per-dispatch overhead: long command buffers, worst trace
    ("kernel_path_over_pyopencl", 1.3, "x"),
    ("simdgroup_over_scalar", 3.0, "x"),
    ("tinygrad_eager_over_raw", 2.0, "x"),  # issue 11's targets
    ("tinygrad_graph_us_per_dispatch", 30.0, "us"),
    ("tinygrad_jit_us_per_dispatch", 30.0, "us"),  # the same with tinygrad's own TinyJit Python
]


def machine() -> dict[str, Any]:
    """What the figures were measured on: processor, CPUs this process may use, Python."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"processor": model, "cpus": cpus, "python": platform.python_version(), "system": platform.system()}


def run_groups(names: list[str], quick: bool, opencl_device: Any = None,
               progress: TextIO | None = None) -> dict[str, Any]:
    """The figures of the groups ``names`` merged into one dict, with ``machine`` and ``skipped``."""
    out: dict[str, Any] = {"machine": machine(), "quick": quick, "skipped": {}}
    for name in names:
        if progress is not None:
            print(f"benchmarks: {name} ...", file=progress, flush=True)
        try:
            out.update(GROUPS[name](quick, opencl_device))
        except StandInError as e:
            out["skipped"][name] = str(e)
    return out


def _value(fig: dict[str, Any], key: str) -> tuple[float | None, str]:
    """A headline figure and the absolute numbers beside it (text)."""
    if key.startswith("lowering_us_per_cmd"):
        per = fig.get("lowering_us_per_cmd")
        if not per:
            return None, ""
        worst = max(((p, n, v) for p, row in per.items() for n, v in row.items()), key=lambda t: t[2])
        return worst[2], f"{worst[0]} at {worst[1]} commands"
    v = fig.get(key)
    if not isinstance(v, (int, float)):
        return None, ""
    beside = {
        "lowering_scaling_100k_over_1k": lambda: ", ".join(f"{p} {r:.2f}" for p, r in fig["lowering_scaling"].items()),
        "memory_bytes_per_cmd": lambda: f"peak of build + lower at {fig['memory_commands']} commands",
        "rewrite_nomatch_over_dfs": lambda: ", ".join(
            f"{g}: {r['us_per_node_rewrite']:.3f} vs {r['us_per_node_dfs']:.3f} us/node"
            for g, r in fig["rewrite_nomatch"].items()),
        "rewrite_match_over_tinygrad": lambda: "{us_per_node_mtlir:.3f} vs {us_per_node_tinygrad:.3f} us/node".format(
            **fig["rewrite_match"]),
        "replay_compiled_over_direct": lambda: "; ".join(
            f"{c}: {r['us_compiled']:.1f} vs {r['us_hand_written']:.1f} us" for c, r in fig["replay_cases"].items()),
        "replay_interp_over_direct": lambda: "; ".join(
            f"{c}: {r['us_interpreter']:.1f} us" for c, r in fig["replay_cases"].items()),
        "submit_time_100k_over_10": lambda: ", ".join(
            f"{n} commands {us:.1f} us ({fig['submit_messages'][n]} messages)" for n, us in fig["submit_us"].items())
        + f"; per message {fig['submit_time_per_message_100k_over_10']:.2f}x",
        "sim_run_over_pyopencl": lambda: ", ".join(f"{t.split('.json')[0]} {r:.2f}"
                                                   for t, r in fig["sim_run_traces"].items()),
        "sim_overhead_us_per_dispatch": lambda: f"on {fig['sim_device']}",
        "long_over_pyopencl": lambda: ", ".join(f"{t.split('.json')[0]} {r:.2f}" for t, r in fig["long_traces"].items()),
        "kernel_path_over_pyopencl": lambda: "the kernel path alone (launches prepared once), worst trace",
        "tinygrad_eager_over_raw": lambda: "{tinygrad_eager_us:.0f} vs {tinygrad_raw_us:.0f} us; paired "
                                           "{tinygrad_eager_over_raw_paired:.2f}".format(**fig),
        "tinygrad_graph_us_per_dispatch": lambda: "the graph runner alone: {tinygrad_graph_us_per_call:.0f} us per "
                                                  "call of {tinygrad_jit_kernels} kernels; paired "
                                                  "{tinygrad_graph_us_per_dispatch_paired:.1f}".format(**fig),
        "tinygrad_jit_us_per_dispatch": lambda: "TinyJit's call: {tinygrad_jit_us_per_call:.0f} vs "
                                                "{tinygrad_jit_raw_us_per_call:.0f} us per call of "
                                                "{tinygrad_jit_kernels} kernels; paired "
                                                "{tinygrad_jit_us_per_dispatch_paired:.1f}".format(**fig),
        "simdgroup_over_scalar": lambda: ", ".join(f"N={n}: {r['ms_simdgroup']:.2f} vs {r['ms_scalar']:.2f} ms"
                                                   for n, r in fig["simdgroup"].items()),
    }.get(key)
    return float(v), beside() if beside else ""


def table(fig: dict[str, Any], out: TextIO) -> None:
    """The headline figures against their targets, one line each, then messages per submit."""
    m = fig["machine"]
    print(f"{m['processor']}, {m['cpus']} CPUs, Python {m['python']}{' (quick sizes)' if fig['quick'] else ''}",
          file=out)
    print(f"{'figure':<48} {'measured':>10} {'target':>9}  beside it", file=out)
    for key, target, unit in TARGETS:
        v, beside = _value(fig, key)
        if v is None:
            continue
        # quick sizes say nothing about the targets (the fixed costs dominate small sizes): no verdict
        ok = "n/a (quick sizes)" if fig["quick"] else "ok " if v <= target else "MISS"
        print(f"{key:<48} {v:>8.2f}{unit:<2} {'<= ' + format(target, 'g'):>9}  {ok} {beside}", file=out)
    msgs = fig.get("messages_per_submit")
    if msgs:
        print("messages per submit (kernels: icb / direct): " + ", ".join(
            f"{n}: {msgs['icb'][n]} / {msgs['direct'][n]}" for n in msgs["icb"]), file=out)
    for name, why in fig["skipped"].items():
        print(f"skipped {name}: {why}", file=out)


def _finite(x: Any) -> Any:
    """JSON has no infinity or NaN: such a figure becomes null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def _check_plot_folder(ap: argparse.ArgumentParser, folder: Path) -> None:
    """``ap.error`` (exit 2), before any benchmark runs, unless ``--plot DIR`` can be written: matplotlib installed,
    ``DIR`` not a file, and ``DIR`` made now when missing (with the folders above it, as the help says; an
    impossible one used to fail only after every group had run)."""
    if importlib.util.find_spec("matplotlib") is None:
        ap.error("--plot needs matplotlib (pip install matplotlib)")
    if folder.exists() and not folder.is_dir():
        ap.error(f"--plot {folder}: is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"--plot {folder}: cannot make the folder: {e.strerror or e}")
    if not os.access(folder, os.W_OK):
        ap.error(f"--plot {folder}: the folder is not writable")


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    """The command line (module docstring of ``benchmarks.__main__``); returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description="mtlir's benchmarks (issue 14)")
    ap.add_argument("--json", action="store_true", help="print one JSON object of every figure")
    ap.add_argument("--quick", action="store_true", help="small sizes and few rounds (a smoke test)")
    ap.add_argument("--only", default="", help=f"groups to run, comma separated ({', '.join(GROUPS)})")
    ap.add_argument("--plot", type=nonempty_path, metavar="DIR", help="also write DIR/performance.svg (needs matplotlib; "
                    "DIR and the folders above it are made, before the run, when missing)")
    ap.add_argument("--opencl-device", type=opencl_device_arg, default=None, metavar="NAME|INDEX",
                    help="OpenCL device of the sim group (index or name part)")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(GROUPS)
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        ap.error(f"unknown group(s) {', '.join(unknown)}: expected {', '.join(GROUPS)}")
    if args.plot is not None:
        _check_plot_folder(ap, args.plot)
    if args.opencl_device is not None:
        check_opencl_device(ap, args.opencl_device)
    device = int(args.opencl_device) if args.opencl_device and args.opencl_device.isdigit() else args.opencl_device
    fig = run_groups(names, args.quick, device, progress=sys.stderr)
    if args.plot is not None:
        from benchmarks.plot import plot
        fig["plot"] = str(plot(fig, args.plot))
    if args.json:
        json.dump(_finite(fig), out, indent=1)
        print(file=out)
    else:
        table(fig, out)
    return 0
