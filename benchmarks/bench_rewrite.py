"""Rewrite cost per node against a plain iterative DFS over the same graph, and against tinygrad, in the same run.

Run: ``python -m benchmarks.bench_rewrite [--rounds N] [--nodes N]`` from where the package ``benchmarks`` is
importable (``make bench`` sets that up). For each graph (a chain of ``--nodes`` ADDs, a sink of a fifth as many)
it times, as medians of N interleaved rounds of CPU time (``benchmarks.timing.interleaved``: the cases take turns
within every round, so a busy moment of the shared machine hits them alike):

- ``dfs``: a plain iterative depth-first walk (a visited set and a stack): the floor any traversal pays, and the
  reference of every ratio;
- ``toposort``: ``UOp.toposort()``;
- ``no-match``: ``graph_rewrite`` with a matcher whose rules are for ops the graph does not hold (MSG, STORE, ...);
- ``rules-miss``: ``graph_rewrite`` with rules for the graph's own ops that never match: the matcher's precheck
  rejects each node without running the patterns;
- ``match``: ``graph_rewrite`` with one rule that rewrites every ADD into a SUB (every node of the chain but its
  leaves is rebuilt); where tinygrad is installed (an optional dependency of the benchmarks), the same rule with
  tinygrad's own UPat, PatternMatcher and graph_rewrite on the same chain built from tinygrad's UOps, interleaved
  in the same rounds. The aims (issue 14): no-match at most 2x dfs, match at most 0.8x tinygrad.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from mtlir import Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite


def chain(n: int) -> UOp:
    """``((x + 1) + 2) + ... + n``: n ADDs and n constants, each node using the one before."""
    x = UOp.variable("x", 0, 10)
    for i in range(1, n + 1):
        x = x + i
    return x


def wide(n: int) -> UOp:
    """A SINK of n independent ``x + i``."""
    x = UOp.variable("x", 0, 10)
    return UOp.sink(*[x + i for i in range(1, n + 1)])


def dfs(root: UOp) -> int:
    """The baseline: visit every node once."""
    seen = {root}
    stack = [root]
    while stack:
        for s in stack.pop().src:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return len(seen)


def _keep(n: UOp) -> None:
    return None


# rules for ops the benchmark graphs do not hold: graph_rewrite must still visit every node
no_match = PatternMatcher([(UPat(op, name="n"), _keep) for op in (Ops.MSG, Ops.STORE, Ops.CALL, Ops.EXEC, Ops.LOAD)])
# rules for ADD and SINK that never match these graphs (x + 0, x * 1, a sink of nothing)
i32 = dtypes.int32
rules_miss = PatternMatcher([
    (UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(i32, 0))), lambda a: a),
    (UPat(Ops.ADD, src=(UPat(Ops.MUL, src=(UPat.var("a"), UPat.const(i32, 1))), UPat.var("b"))), lambda a, b: a + b),
    (UPat(Ops.SINK, src=()), lambda: None),
])


def to_sub(x: UOp) -> UOp:
    """ADD -> SUB: a rule that fires once on every ADD (a SUB matches nothing)."""
    return x.replace(op=Ops.SUB)


# one rule that rewrites every ADD of the benchmark graphs
every_add = PatternMatcher([(UPat(Ops.ADD, name="x"), to_sub)])


def tinygrad_case(n: int) -> Callable[[], Any] | None:
    """``graph_rewrite`` of tinygrad with the ADD -> SUB rule on tinygrad's chain of ``n`` ADDs; None without
    tinygrad."""
    try:
        from tinygrad.uop import Ops as TOps
        from tinygrad.uop.ops import PatternMatcher as TPatternMatcher, UOp as TUOp, UPat as TUPat
        from tinygrad.uop.ops import graph_rewrite as tgraph_rewrite
    except ImportError:
        return None
    x = TUOp.variable("x", 0, 10)
    for i in range(1, n + 1):
        x = x + i
    # tinygrad compiles a rule's code and refuses closures: the rule names SUB through its own argument
    pm = TPatternMatcher([(TUPat(TOps.ADD, name="x"), lambda x: x.replace(op=type(x.op).SUB))])
    assert tgraph_rewrite(x, pm).op is TOps.SUB
    return lambda: tgraph_rewrite(x, pm)


def figures(nodes: int = 100_000, rounds: int = 7) -> dict[str, Any]:
    """µs per node of every case on both graphs and the ratios to ``dfs`` (and ``match`` over tinygrad's), medians
    of ``rounds`` interleaved rounds: ``{"chain": {...}, "wide": {...}}``."""
    limit = sys.getrecursionlimit()
    try:  # tinygrad's rewrite recurses on a chain (and its import raises the limit): the caller's limit comes back
        sys.setrecursionlimit(max(limit, 4 * nodes))
        return _figures(nodes, rounds)
    finally:
        sys.setrecursionlimit(limit)


def _figures(nodes: int, rounds: int) -> dict[str, Any]:
    from benchmarks.timing import interleaved, ratio
    out: dict[str, Any] = {}
    for name, graph in (("chain", chain(nodes)), ("wide", wide(nodes // 5))):
        n = dfs(graph)
        assert graph_rewrite(graph, no_match) is graph and graph_rewrite(graph, rules_miss) is graph
        assert graph_rewrite(graph, every_add) is not graph
        cases: dict[str, Callable[[], Any]] = {
            "dfs": lambda: dfs(graph), "toposort": graph.toposort, "no-match": lambda: graph_rewrite(graph, no_match),
            "rules-miss": lambda: graph_rewrite(graph, rules_miss), "match": lambda: graph_rewrite(graph, every_add)}
        tiny = tinygrad_case(nodes) if name == "chain" else None
        if tiny is not None:
            cases["tinygrad match"] = tiny
        t = interleaved(cases, 1, rounds)
        row: dict[str, float] = {f"{k} us/node": v / n * 1e6 for k, v in t.items()}
        row.update({f"{k} / dfs": ratio(v, t["dfs"]) for k, v in t.items() if k != "dfs"})
        if tiny is not None:
            row["match / tinygrad"] = ratio(t["match"], t["tinygrad match"])
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    """Time each graph and print the table (module docstring); returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (the median counts; at least 7)")
    ap.add_argument("--nodes", type=int, default=100_000, help="ADDs of the chain (the sink has a fifth)")
    args = ap.parse_args(argv)
    for name, row in figures(args.nodes, args.rounds).items():
        print(f"{name}: dfs {row['dfs us/node']:.3f} µs/node")
        for k in ("toposort", "no-match", "rules-miss", "match", "tinygrad match"):
            if f"{k} / dfs" in row:
                print(f"  {k:<15}{row[f'{k} us/node']:>8.3f} µs/node {row[f'{k} / dfs']:>7.2f}x dfs")
        if "match / tinygrad" in row:
            print(f"  match / tinygrad's graph_rewrite: {row['match / tinygrad']:.2f} (aim <= 0.8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
