"""The simulated device against plain pyopencl: ``sim_run_over_pyopencl`` and ``sim_overhead_us_per_dispatch``.

The measurement is ``benchmarks/bench_dispatch.py``'s ``measure()`` (its docstring says what each path does and
how it is timed: interleaved rounds, process CPU time on a CPU device); this module picks its size and flattens
the figures for ``python -m benchmarks``: ``sim_run_over_pyopencl`` is the worst trace's ratio (each trace's
ratio and absolute µs beside it), ``sim_overhead_us_per_dispatch`` the simulator's own cost per dispatch of one
long command buffer, ``long_over_pyopencl`` the worst of ``LONG_TRACES`` made long (one command buffer of their
dispatches repeated: issue 12's per-dispatch overhead against raw pyopencl), ``kernel_path_over_pyopencl`` the kernel path alone (launches prepared once) against the same
raw rounds, the worst trace.
"""
from __future__ import annotations

from typing import Any

from benchmarks.bench_dispatch import TRACES, measure
from benchmarks.timing import MIN_ROUNDS

__all__ = ["sim_figures"]

QUICK_TRACES = ("mlp.apple7.json", "symbolic_kv.apple7.json")
# made long (dispatches repeated into one command buffer): the simulator's cost per dispatch, issue 12's figure
LONG_TRACES = ("mlp.apple7.json", "cnn.apple9.json", "layernorm_attn.apple9.json")


def sim_figures(quick: bool = False, opencl_device: str | int | None = None) -> dict[str, Any]:
    """The simulator's figures on ``opencl_device`` (default: the first OpenCL device); ``quick``: two traces, a
    short long trace, the fewest rounds."""
    skip = tuple(p.name for p in TRACES.glob("*.json") if p.name not in QUICK_TRACES) if quick else ()
    got = measure(opencl_device, rounds=MIN_ROUNDS if quick else 15, skip=skip, long_repeat=5 if quick else 40,
                  long_traces=LONG_TRACES[:1] if quick else LONG_TRACES)
    return {"sim_run_over_pyopencl": got["sim_run_over_pyopencl"]["worst"],
            "sim_run_traces": got["sim_run_over_pyopencl"]["traces"],
            "sim_overhead_us_per_dispatch": got["sim_overhead_us_per_dispatch"],
            "long_over_pyopencl": got["long_over_pyopencl"]["worst"],
            "long_traces": got["long_over_pyopencl"]["traces"],
            **({"kernel_path_over_pyopencl": got["kernel_path_over_pyopencl"]["worst"],
                "kernel_path_traces": got["kernel_path_over_pyopencl"]["traces"]}
               if "kernel_path_over_pyopencl" in got else {}),
            "sim_device": got["device"], "sim_rows": got["rows"]}
