"""The front end and the passes: queue building + lowering per command, memory, messages per submit, rewrite.

Built on ``benchmarks/bench_lowering.py`` (its ``build``/``PATHS``/``messages``) and ``benchmarks/bench_rewrite.py``
(its ``figures``), measured the package's way
(``benchmarks.timing``: interleaved with a reference, medians of at least 7 rounds, CPU time):

- ``lowering_figures``: per path and command count, building the queue graph (``Queue.exec`` ...) and all passes
  (``lower``), µs per command, beside the reference: one ``toposort()`` of a graph of the same shape (a walk that
  visits each node once; ``build(..., reference=True)``: no node in common, so the measured build makes its nodes)
  in the same rounds; ``lowering_scaling_100k_over_1k``: cost per command at the largest size over that at
  1k, the worst path; ``memory_bytes_per_cmd``: the peak of ``tracemalloc`` while building and lowering the largest
  ICB queue, per command (``memory_bytes_per_cmd_by_path``: the same on every path), each path measured in a fresh
  process (``peak_bytes`` run by ``python -P -c``): the intern table is a dict, which keeps its size when entries
  leave it and grows only while inserting, so in one process the peak moved by ~105 B per command with what had
  run before (whether the table allocated a larger array inside the measured window); ``messages_per_submit``:
  messages one submit sends on the ICB and the direct path, by kernel count.
- ``rewrite_figures``: ``graph_rewrite`` with no matching rule over a plain iterative DFS of the same graph
  (``rewrite_nomatch_over_dfs``, the worse of a 100k chain and a 20k-wide sink) and, where tinygrad is
  installed, ``graph_rewrite`` with one rule rewriting every ADD over tinygrad's own with the same rule on the
  same chain built with tinygrad's UOps (``rewrite_match_over_tinygrad``); ``rewrite_rows``: every case of
  ``bench_rewrite.figures``.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from typing import Any

from benchmarks.bench_lowering import PATHS, build, messages
from benchmarks.bench_rewrite import figures as rewrite_rows
from benchmarks.timing import MIN_ROUNDS, interleaved, ratio
from mtlir.metal import DeviceSpec
from mtlir.passes import lower

__all__ = ["lowering_figures", "rewrite_figures", "peak_bytes"]


def _device(path: str) -> DeviceSpec:
    return DeviceSpec("Apple7", residency_set=False, icb=PATHS[path][0])


def _queue(path: str, n: int, reference: bool = False) -> Any:
    _, stamps, every, _ = PATHS[path]
    return build(n, _device(path), stamps, every, reference=reference)


def lowering_figures(quick: bool = False) -> dict[str, Any]:
    """Queue building + lowering per command on every path of ``bench_lowering.PATHS`` (module docstring)."""
    sizes = [10, 100] if quick else [1000, 10_000, 100_000]
    per_cmd: dict[str, dict[str, float]] = {}
    over_topo: dict[str, dict[str, float]] = {}
    for path, (_, _, _, largest) in PATHS.items():
        per_cmd[path], over_topo[path] = {}, {}
        for n in sizes:
            if n > largest:
                continue
            graph = _queue(path, n, reference=True)  # alive while timing: no node in common with the measured queue
            t = interleaved({"build+lower": lambda: lower(_queue(path, n), target="arm64", keep_stages=False),
                             "toposort": graph.toposort}, 1)
            per_cmd[path][str(n)] = t["build+lower"] / n * 1e6
            over_topo[path][str(n)] = ratio(t["build+lower"], t["toposort"])
            del graph
            gc.collect()
    lo = str(sizes[0])
    scaling = {p: ratio(v[max(v, key=int)], v[lo]) for p, v in per_cmd.items() if len(v) > 1}
    big = sizes[-1]
    memory = {path: _fresh_peak_bytes(path, big) / big for path in PATHS}
    counts = [1, 10] if quick else [1, 100, 1000]
    msgs = {kind: {str(n): messages(lower(build(n, DeviceSpec("Apple7", residency_set=False, icb=icb)),
                                          keep_stages=False).program) for n in counts}
            for kind, icb in (("icb", True), ("direct", False))}
    return {"lowering_us_per_cmd": per_cmd, "lowering_over_toposort": over_topo,
            "lowering_scaling_100k_over_1k": max(scaling.values()), "lowering_scaling": scaling,
            "memory_bytes_per_cmd": memory["icb"], "memory_bytes_per_cmd_by_path": memory, "memory_commands": big,
            "messages_per_submit": msgs}


def peak_bytes(path: str, n: int) -> int:
    """The peak of ``tracemalloc``, in bytes, while building the queue of ``n`` commands on ``path`` and lowering it
    (in this process: ``_fresh_peak_bytes`` runs it in a new one)."""
    gc.collect()
    tracemalloc.start()
    try:
        lower(_queue(path, n), target="arm64", keep_stages=False)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# the child: the installed mtlir first (-P: neither the working directory nor the script's folder on sys.path),
# the folder holding this package appended last so that ``benchmarks`` is found even without PYTHONPATH
_CHILD = "import sys; sys.path.append(sys.argv[1]); from benchmarks.compiler import peak_bytes; " \
         "print(peak_bytes(sys.argv[2], int(sys.argv[3])))"


def _fresh_peak_bytes(path: str, n: int) -> int:
    """``peak_bytes(path, n)`` in a new Python process, so that the figure does not depend on what ran before in
    this one (module docstring: the intern table's size). Raises ``RuntimeError`` with the child's error output
    when it fails."""
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-P", "-c", _CHILD, parent, path, str(n)], capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"measuring the memory of {path} at {n} commands failed:\n{done.stderr[-4000:]}")
    return int(done.stdout.split()[-1])


def rewrite_figures(quick: bool = False) -> dict[str, Any]:
    """graph_rewrite against a plain DFS and against tinygrad: ``bench_rewrite.figures`` (its docstring: the
    graphs, the rules, interleaved medians), flattened (module docstring)."""
    rows = rewrite_rows(2000 if quick else 100_000, MIN_ROUNDS)
    out: dict[str, Any] = {"rewrite_nomatch_over_dfs": max(r["no-match / dfs"] for r in rows.values()),
                           "rewrite_nomatch": {g: {"us_per_node_rewrite": r["no-match us/node"],
                                                   "us_per_node_dfs": r["dfs us/node"], "ratio": r["no-match / dfs"]}
                                               for g, r in rows.items()},
                           "rewrite_rows": rows}
    chain_row = rows.get("chain", {})
    if "match / tinygrad" in chain_row:
        out["rewrite_match_over_tinygrad"] = chain_row["match / tinygrad"]
        out["rewrite_match"] = {"us_per_node_mtlir": chain_row["match us/node"],
                                "us_per_node_tinygrad": chain_row["tinygrad match us/node"]}
    return out
