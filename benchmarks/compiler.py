"""The front end and the passes: queue building + lowering per command, memory, messages per submit, rewrite.

Built on the queues and graphs of ``benchmarks/bench_lowering.py`` and ``benchmarks/bench_rewrite.py`` (their
``build``/``PATHS``/``messages`` and ``chain``/``wide``/``dfs``/``no_match``), measured here the package's way
(``benchmarks.timing``: interleaved with a reference, medians of at least 7 rounds, CPU time):

- ``lowering_figures``: per path and command count, building the queue graph (``Queue.exec`` ...) and all passes
  (``lower``), µs per command, beside the reference: one ``toposort()`` of the same graph (a walk that visits
  each node once) in the same rounds; ``lowering_scaling_100k_over_1k``: cost per command at the largest size
  over that at 1k, the worst path; ``memory_bytes_per_cmd``: the peak of ``tracemalloc`` while building and
  lowering the largest ICB queue, per command; ``messages_per_submit``: messages one submit sends on the ICB and
  the direct path, by kernel count.
- ``rewrite_figures``: ``graph_rewrite`` with no matching rule over a plain iterative DFS of the same graph
  (``rewrite_nomatch_over_dfs``, the worse of a 100k chain and a 20k-wide sink) and, where tinygrad is
  installed, ``graph_rewrite`` with one rule matching every node over tinygrad's own on the same graph built with
  tinygrad's UOps (``rewrite_match_over_tinygrad``).
"""
from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from benchmarks.bench_lowering import PATHS, build, messages
from benchmarks.bench_rewrite import chain, dfs, no_match, wide
from benchmarks.timing import interleaved, ratio
from mtlir import PatternMatcher, UPat, graph_rewrite
from mtlir.metal import DeviceSpec
from mtlir.passes import lower

__all__ = ["lowering_figures", "rewrite_figures"]


def _device(path: str) -> DeviceSpec:
    return DeviceSpec("Apple7", residency_set=False, icb=PATHS[path][0])


def _queue(path: str, n: int) -> Any:
    _, stamps, every, _ = PATHS[path]
    return build(n, _device(path), stamps, every)


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
            graph = _queue(path, n)
            t = interleaved({"build+lower": lambda: lower(_queue(path, n), target="arm64", keep_stages=False),
                             "toposort": graph.toposort}, 1)
            per_cmd[path][str(n)] = t["build+lower"] / n * 1e6
            over_topo[path][str(n)] = ratio(t["build+lower"], t["toposort"])
            del graph
            gc.collect()
    lo = str(sizes[0])
    scaling = {p: ratio(v[max(v, key=int)], v[lo]) for p, v in per_cmd.items() if len(v) > 1}
    big = sizes[-1]
    gc.collect()
    tracemalloc.start()
    lower(_queue("icb", big), target="arm64", keep_stages=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    counts = [1, 10] if quick else [1, 100, 1000]
    msgs = {kind: {str(n): messages(lower(build(n, DeviceSpec("Apple7", residency_set=False, icb=icb)),
                                          keep_stages=False).program) for n in counts}
            for kind, icb in (("icb", True), ("direct", False))}
    return {"lowering_us_per_cmd": per_cmd, "lowering_over_toposort": over_topo,
            "lowering_scaling_100k_over_1k": max(scaling.values()), "lowering_scaling": scaling,
            "memory_bytes_per_cmd": peak / big, "memory_commands": big, "messages_per_submit": msgs}


def rewrite_figures(quick: bool = False) -> dict[str, Any]:
    """graph_rewrite against a plain DFS and against tinygrad (module docstring)."""
    n = 2000 if quick else 100_000
    graphs = {"chain": chain(n), "wide": wide(n // 5)}
    nomatch: dict[str, dict[str, float]] = {}
    for name, g in graphs.items():
        assert graph_rewrite(g, no_match) is g
        t = interleaved({"no-match": lambda: graph_rewrite(g, no_match), "dfs": lambda: dfs(g)}, 1)
        nomatch[name] = {"us_per_node_rewrite": t["no-match"] / n * 1e6, "us_per_node_dfs": t["dfs"] / n * 1e6,
                         "ratio": ratio(t["no-match"], t["dfs"])}
    out: dict[str, Any] = {"rewrite_nomatch_over_dfs": max(v["ratio"] for v in nomatch.values()),
                           "rewrite_nomatch": nomatch}
    try:
        from tinygrad.uop.ops import PatternMatcher as TPatternMatcher, UOp as TUOp, UPat as TUPat
        from tinygrad.uop.ops import GroupOp as TGroupOp, graph_rewrite as tgraph_rewrite  # type: ignore[attr-defined]
    except ImportError:
        return out
    g = graphs["chain"]
    every = PatternMatcher([(UPat(tuple({u.op for u in g.toposort()}), name="x"), lambda x: None)])
    tevery = TPatternMatcher([(TUPat(tuple(TGroupOp.All), name="x"), lambda x: None)])
    tx = TUOp.variable("x", 0, 10)
    tchain = tx
    for i in range(1, n + 1):
        tchain = tchain + i
    t = interleaved({"mtlir": lambda: graph_rewrite(g, every), "tinygrad": lambda: tgraph_rewrite(tchain, tevery)}, 1)
    out["rewrite_match_over_tinygrad"] = ratio(t["mtlir"], t["tinygrad"])
    out["rewrite_match"] = {"us_per_node_mtlir": t["mtlir"] / n * 1e6, "us_per_node_tinygrad": t["tinygrad"] / n * 1e6}
    return out
