"""graph_rewrite: apply a PatternMatcher to a graph until nothing matches (bottom-up, to a fixed point).

Sources are rewritten before the node that uses them; a node a rule returns is itself rewritten (its new sources
first, then rules again on it) until no rule matches. A rule set that would never finish (A->B->A, A->B->C->A,
or a chain of rewrites longer than ``max_steps``) raises ``RewriteLoopError`` naming the rules involved. Iterative
throughout: deep graphs work at Python's default recursion limit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mtlir.upat import PatternMatcher, Rule
from mtlir.uop import UOp

__all__ = ["graph_rewrite", "RewriteLoopError", "RewriteTrace", "RewriteStep"]


class RewriteLoopError(RuntimeError):
    """A rule set that does not terminate; ``rules`` lists the rules of the cycle in firing order."""

    def __init__(self, message: str, rules: list[Rule]) -> None:
        super().__init__(message)
        self.rules = rules


@dataclass(frozen=True)
class RewriteStep:
    """One firing: ``rule`` rewrote ``before`` into ``after``."""

    rule: Rule
    before: UOp
    after: UOp


@dataclass
class RewriteTrace:
    """What a graph_rewrite did, for the pictures: the input, the output and every rule firing in order."""

    name: str = ""
    steps: list[RewriteStep] = field(default_factory=list)
    before: UOp | None = None
    after: UOp | None = None


def _loop_error(name: str, chain: list[tuple[UOp, Rule]], again: UOp, last: Rule) -> RewriteLoopError:
    start = next((i for i, (n, _) in enumerate(chain) if n is again), 0)
    rules = [r for _, r in chain[start:]] + [last]
    names = " -> ".join(f"{getattr(r.fn, '__name__', '?')} ({r.location})" for r in rules)
    return RewriteLoopError(f"graph_rewrite {name!r}: the rules never terminate on {again.op!r}: {names}", rules)


def graph_rewrite(graph: UOp, matcher: PatternMatcher, ctx: Any = None, name: str = "rewrite",
                  trace: RewriteTrace | None = None, max_steps: int = 10_000) -> UOp:
    """Rewrite ``graph`` with ``matcher`` to a fixed point and return the new graph (``graph`` itself when no
    rule fired).

    ``ctx`` is passed to rules that declare a ``ctx`` parameter. ``trace``, when given, records every firing.
    ``max_steps`` bounds how many successive rewrites one node may go through. Raises ``RewriteLoopError``.
    """
    done: dict[UOp, UOp] = {}
    pending: dict[UOp, Rule] = {}  # nodes whose replacement is being rewritten, in order
    depth: dict[UOp, int] = {}
    # stack entries: (node, stage, result) -- stage 0: visit sources, 1: rewrite, 2: take the result's rewrite
    stack: list[tuple[UOp, int, UOp | None]] = [(graph, 0, None)]
    by_op = matcher._by_op
    while stack:
        node, stage, result = stack.pop()
        if stage == 0:
            if node in done:
                continue
            if node in pending:
                raise _loop_error(name, list(pending.items()), node, pending[node])
            stack.append((node, 1, None))
            for s in reversed(node.src):
                if s not in done:
                    stack.append((s, 0, None))
            continue
        if stage == 2:
            assert result is not None
            done[node] = done[result]
            pending.pop(node, None)
            continue
        if node in done:
            continue
        src = node.src
        new_src = tuple(done[s] for s in src)
        new = node
        for a, b in zip(src, new_src):
            if a is not b:
                new = node.replace(src=new_src)
                if new in done:
                    done[node] = done[new]
                    new = None  # type: ignore[assignment]
                break
        if new is None:
            continue
        if new.op not in by_op:
            done[node] = new
            if new is not node:
                done.setdefault(new, new)
            continue
        fired = matcher.rewrite_with_rule(new, ctx)
        if fired is None:
            done[node] = new
            if new is not node:
                done.setdefault(new, new)
            continue
        ret, rule = fired
        if trace is not None:
            trace.steps.append(RewriteStep(rule, new, ret))
        steps = depth.get(node, 0) + 1
        if ret in pending or ret is node:
            raise _loop_error(name, list(pending.items()) + [(node, rule)], ret, rule)
        if steps > max_steps:
            raise _loop_error(name, list(pending.items())[-8:], node, rule)
        pending[node] = rule
        depth[ret] = steps
        stack.append((node, 2, ret))
        stack.append((ret, 0, None))
    out = done[graph]
    if trace is not None:
        trace.name, trace.before, trace.after = name, graph, out
    return out
