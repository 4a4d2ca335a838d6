"""The plot of docs/performance.md: ``python -m benchmarks --plot docs/img`` writes ``performance.svg``.

Left: host µs per command (queue building + lowering) against the command count, one line per path, both axes
logarithmic. Right: µs per dispatch of a whole trace run on the simulated device and with plain pyopencl, per
trace (the last one long: one command buffer of many dispatches), with the simulator's per-dispatch overhead of
that long command buffer in the title. matplotlib is an optional dependency
(``pip install -e '.[bench]'``); a group not run leaves its panel empty with a note.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot"]


def plot(fig: dict[str, Any], folder: Path) -> Path:
    """Write ``folder/performance.svg`` from the figures of ``run_groups``; returns its path. Raises
    ``ImportError`` naming the extra when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("the plot needs matplotlib: pip install -e '.[bench]'") from e
    folder.mkdir(parents=True, exist_ok=True)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    per = fig.get("lowering_us_per_cmd", {})
    for path, row in per.items():
        xs = sorted(row, key=int)
        left.plot([int(x) for x in xs], [row[x] for x in xs], marker="o", label=path)
    left.axhline(5.0, color="grey", linestyle="--", linewidth=1, label="target 5 µs")
    left.set(xscale="log", yscale="log", xlabel="commands in the queue",
             ylabel="µs per command (queue building + lowering)", title="Lowering cost per command")
    if per:
        left.legend(fontsize=8)
    else:
        left.text(0.5, 0.5, "lowering not run", ha="center", transform=left.transAxes)
    rows = fig.get("sim_rows", [])
    if rows:
        names = [r["trace"].replace(".json", "") for r in rows]
        ticks = list(range(len(rows)))
        right.bar([x - 0.2 for x in ticks], [r["sim_us"] / r["dispatches"] for r in rows], 0.4,
                  label="simulated device")
        right.bar([x + 0.2 for x in ticks], [r["raw_us"] / r["dispatches"] for r in rows], 0.4,
                  label="plain pyopencl")
        right.set_xticks(ticks, names, rotation=60, ha="right", fontsize=7)
        right.set(ylabel="µs per dispatch of a trace run (CPU time)",
                  title=f"Simulator vs pyopencl: {fig.get('sim_overhead_us_per_dispatch', float('nan')):.0f} µs "
                        "overhead per dispatch")
        right.legend(fontsize=8)
    else:
        right.text(0.5, 0.5, "sim not run", ha="center", transform=right.transAxes)
    figure.tight_layout()
    out = folder / "performance.svg"
    figure.savefig(out, format="svg", metadata={"Date": None})
    plt.close(figure)
    return out
