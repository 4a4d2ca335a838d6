"""Rewrite cost per node against a plain iterative DFS over the same graph, measured in the same run.

Run: ``python benchmarks/bench_rewrite.py [--repeat N]``. For each graph (a 100,000-node chain, a 20,000-wide
sink) it times, as medians of N repeats:

- ``dfs``: a plain iterative depth-first walk (a visited set and a stack): the floor any traversal pays;
- ``toposort``: ``UOp.toposort()``;
- ``no-match``: ``graph_rewrite`` with a matcher whose rules are for ops the graph does not hold (MSG, STORE, ...):
  the issue's aim is at most 3x ``dfs``;
- ``rules-miss``: ``graph_rewrite`` with rules for the graph's own ops that never match: the matcher's precheck
  (one generated test per op of the rules' cheap conditions: source count, source ops, dtypes and args) rejects
  each node without running the patterns; reported against the same aim;

and prints each as µs per node and as a ratio to ``dfs``. Ratios are what to compare between machines.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from mtlir import Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite

AIM = 3.0


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


def median_time(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn`` in seconds over ``repeat`` runs (after one warm-up run)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Time each graph and print the table (module docstring); returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs per measurement (median)")
    args = ap.parse_args(argv)
    ok, ok_miss = True, True
    print(f"{'graph':<14}{'nodes':>8}  {'dfs µs/node':>12}  {'toposort':>9}  {'no-match':>9}  {'rules-miss':>10}")
    for name, graph in (("chain 100k", chain(100_000)), ("wide 20k", wide(20_000))):
        n = dfs(graph)
        assert graph_rewrite(graph, no_match) is graph and graph_rewrite(graph, rules_miss) is graph
        base = median_time(lambda: dfs(graph), args.repeat)
        topo = median_time(graph.toposort, args.repeat)
        nomatch = median_time(lambda: graph_rewrite(graph, no_match), args.repeat)
        miss = median_time(lambda: graph_rewrite(graph, rules_miss), args.repeat)
        ok &= nomatch / base <= AIM
        ok_miss &= miss / base <= AIM
        print(f"{name:<14}{n:>8}  {base / n * 1e6:>12.3f}  {topo / base:>8.2f}x  {nomatch / base:>8.2f}x  "
              f"{miss / base:>9.2f}x")
    for what, good in (("no-match", ok), ("rules-miss", ok_miss)):
        print(f"{what} graph_rewrite / plain DFS: {'meets' if good else 'MISSES'} the aim of <= {AIM:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
