"""graph_rewrite: apply a PatternMatcher to a graph until nothing matches (bottom-up, to a fixed point).

Sources are rewritten before the node that uses them; a node a rule returns is itself rewritten (its new sources
first, then the rules again on it) until no rule matches. A rule set that would never finish (A->B->A,
A->B->C->A, a replacement that contains the node it replaces, or one that keeps growing) raises
``RewriteLoopError`` naming the rules involved.

How it runs (iterative throughout, so deep graphs work at Python's default recursion limit):

1. a plain depth-first walk collects the input graph; when the matcher has no rule for any of its ops, that is all
   (the graph is returned as it is); else the nodes are sorted by ``UOp._rank`` (sources before users);
2. one loop over that list visits each node once: a node whose op has no rule and whose sources did not change
   costs a set lookup; only a node a rule rewrites (or whose sources changed) goes further;
3. the node a rule returns is rewritten by a small depth-first worklist (``_Rewriter.run``) that also carries the
   loop detection: nodes in progress are marked, and a rule result that is one of them is a cycle.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from mtlir.ir.upat import PatternMatcher, PatternRule
from mtlir.errors import MtlirError
from mtlir.ir.uop import UOp

__all__ = ["graph_rewrite", "RewriteLoopError", "RewriteTrace", "RewriteStep"]

_BUSY: Any = object()  # state of a node whose rewrite is in progress
_rank_of = attrgetter("_rank")


class RewriteLoopError(MtlirError, RuntimeError):
    """A rule set that does not terminate; ``rules`` lists the rules of the cycle in firing order (or, for a rule
    set that keeps growing the graph, the rules involved, most frequent first)."""

    def __init__(self, message: str, rules: list[PatternRule]) -> None:
        super().__init__(message)
        self.rules = rules


@dataclass(frozen=True)
class RewriteStep:
    """One firing: ``rule`` rewrote ``before`` into ``after``."""

    rule: PatternRule
    before: UOp
    after: UOp


@dataclass
class RewriteTrace:
    """What a graph_rewrite did, for the pictures: the input, the output and every rule firing in order."""

    name: str = ""
    steps: list[RewriteStep] = field(default_factory=list)
    before: UOp | None = None
    after: UOp | None = None

    def __len__(self) -> int:
        return len(self.steps)

    def counts(self) -> dict[str, int]:
        """How often each rule fired, keyed ``"name (file:line)"``, in order of first firing."""
        return dict(Counter(f"{s.rule.name} ({s.rule.location})" for s in self.steps))


def _describe(rules: list[PatternRule]) -> str:
    return " -> ".join(f"{r.name} ({r.location})" for r in rules)


class _Rewriter:
    """The state of one graph_rewrite: results of finished nodes, nodes in progress, the rule chains pending."""

    def __init__(self, matcher: PatternMatcher, ctx: Any, name: str, trace: RewriteTrace | None, max_steps: int,
                 nodes: list[UOp], old: set[UOp]) -> None:
        self.rewrite = matcher.rewrite_with_rule
        self.by_op = matcher._by_op
        self.ctx, self.name, self.trace, self.max_steps = ctx, name, trace, max_steps
        self.nodes, self.old = nodes, old
        self.state: dict[UOp, UOp] = {}  # node -> final result, or _BUSY while in progress
        self.replaced: dict[UOp, UOp] = {}  # input-graph node -> final result, only where they differ
        self.early: set[UOp] = set()  # input-graph nodes finished before the main loop reached them
        # node -> (rule result being rewritten, rule, before)
        self.pending: dict[UOp, tuple[UOp, PatternRule, UOp]] = {}
        self.cur: UOp | None = None  # the input-graph node the main loop is at
        self.pos: dict[UOp, int] | None = None
        self.lookup = self._make_lookup()

    # ---- results

    def _make_lookup(self) -> Callable[[UOp], UOp | None]:
        state_get, replaced_get, old = self.state.get, self.replaced.get, self.old

        def lookup(x: UOp) -> UOp | None:
            """The final result of ``x``; ``_BUSY`` while ``x`` is in progress; None when ``x`` is not done yet."""
            r = state_get(x)
            if r is not None:
                return r
            r = replaced_get(x)
            if r is not None:
                return r
            if x in old:  # an input-graph node: done when the main loop has passed it
                cur = self.cur
                assert cur is not None
                if x._rank < cur._rank:
                    return x
                if self.pos is None:
                    self.pos = {n: i for i, n in enumerate(self.nodes)}
                if self.pos[x] < self.pos[cur]:
                    return x
            return None
        return lookup

    def record(self, x: UOp, r: UOp) -> None:
        self.state[x] = r
        if x in self.old:
            self.early.add(x)
            if r is not x:
                self.replaced[x] = r

    # ---- loops

    def loop_error(self, again: UOp | None, rule: PatternRule | None, what: str) -> RewriteLoopError:
        """The error for a cycle: the rules pending from ``again`` on (all pending when None), then ``rule``."""
        chain = list(self.pending.items())
        start = next((i for i, (n, _) in enumerate(chain) if n is again), 0)
        rules = [r for _, (_, r, _) in chain[start:]] + ([rule] if rule is not None else [])
        node = chain[start][0] if chain else again
        where = f" on {node.op!r}" if node is not None else ""
        return RewriteLoopError(f"graph_rewrite {self.name!r}: the rules never terminate{where} ({what}): "
                                f"{_describe(rules)}", rules)

    def growth_error(self, rule: PatternRule) -> RewriteLoopError:
        counts = Counter([r for _, (_, r, _) in self.pending.items()] + [rule])
        rules = [r for r, _ in counts.most_common()]
        return RewriteLoopError(
            f"graph_rewrite {self.name!r}: more than max_steps={self.max_steps} rewrites in progress at once, the "
            f"rules keep growing the graph: {', '.join(f'{r.name} ({r.location}) x{c}' for r, c in counts.most_common(8))}",
            rules)

    # ---- rewriting

    def fire(self, x: UOp, before: UOp, ret: UOp, rule: PatternRule, stack: list[UOp]) -> bool:
        """``rule`` rewrote ``before`` (``x`` with its sources rewritten) into ``ret``: finish ``x`` when ``ret``
        is done, else schedule ``ret``. Returns True when work was pushed on ``stack``."""
        if self.trace is not None:
            self.trace.steps.append(RewriteStep(rule, before, ret))
        r = self.lookup(ret)
        if r is _BUSY or ret in self.pending:
            raise self.loop_error(ret, rule, "a rule returned a node whose rewrite is in progress")
        if r is not None:
            self.record(x, r)
            if before is not x:
                self.record(before, r)
            return False
        self.pending[x] = (ret, rule, before)
        if len(self.pending) > self.max_steps:
            raise self.growth_error(rule)
        self.state[x] = _BUSY
        stack.append(x)
        stack.append(ret)
        return True

    def post(self, x: UOp, before: UOp | None, stack: list[UOp]) -> None:
        """Rewrite ``x``, whose sources are all done (``before``: ``x`` with rewritten sources, if known)."""
        lookup = self.lookup
        if before is None:
            src = x.src
            new_src: tuple[UOp, ...] = tuple([lookup(s) for s in src])  # type: ignore[misc]  # all done
            before = x if new_src == src else UOp(x.op, x.dtype, new_src, x.arg, x.tag)  # == is identity here
        if before is not x:
            r = lookup(before)
            if r is _BUSY:
                raise self.loop_error(None, None, "a node became one of its own users")
            if r is not None:
                self.record(x, r)
                return
        fired = self.rewrite(before, self.ctx) if before.op in self.by_op else None
        if fired is None:
            self.record(x, before)
            if before is not x:
                self.record(before, before)
            return
        self.fire(x, before, fired[0], fired[1], stack)

    def run(self, x: UOp, before: UOp | None, fired: tuple[UOp, PatternRule] | None) -> UOp:
        """Finish ``x`` (an input-graph node at the main loop) and everything its rewrite creates."""
        state, pending, lookup, post = self.state, self.pending, self.lookup, self.post
        stack: list[UOp] = []
        push, pop = stack.append, stack.pop
        state[x] = _BUSY
        if fired is not None:
            assert before is not None
            self.fire(x, before, fired[0], fired[1], stack)
        else:
            post(x, before, stack)
        while stack:
            n = pop()
            r = lookup(n)
            if r is None:  # first visit: its sources first, if any is not done
                state[n] = _BUSY
                todo = []
                done: list[UOp] = []  # the sources' results, when all are done (post then needs no lookups)
                for s in n.src:
                    rs = lookup(s)
                    if rs is None:
                        todo.append(s)
                    elif rs is _BUSY:
                        raise self.loop_error(s if s in pending else None, None,
                                              "a rule's result contains the node it replaces")
                    elif not todo:
                        done.append(rs)  # a UOp: not None, not _BUSY
                if todo:
                    push(n)
                    stack.extend(reversed(todo))
                else:
                    src = n.src
                    new_src = tuple(done)
                    post(n, n if new_src == src else UOp(n.op, n.dtype, new_src, n.arg, n.tag), stack)
                continue
            if r is not _BUSY:
                continue
            job = pending.pop(n, None)
            if job is not None:  # the rule result ``job[0]`` is done: it is ``n``'s result too
                out = lookup(job[0])
                assert out is not None and out is not _BUSY
                self.record(n, out)
                if job[2] is not n:
                    self.record(job[2], out)
                continue
            post(n, None, stack)
        out = state[x]
        assert out is not _BUSY
        return out


def _collect(graph: UOp) -> tuple[list[UOp], set[UOp]]:
    """Every node reachable from ``graph`` in depth-first pre-order, sources left to right (so that after the
    stable sort by rank, nodes of one rank are visited left to right), and the same nodes as a set."""
    seen = {graph}
    nodes: list[UOp] = []
    stack = [graph]
    add, push, pop, append = seen.add, stack.append, stack.pop, nodes.append
    while stack:
        node = pop()
        append(node)
        for s in reversed(node.src):
            if s not in seen:
                add(s)
                push(s)
    return nodes, seen


def _final_sources(u: UOp, lookup: Callable[[UOp], UOp | None]) -> bool:
    """Whether every source of ``u`` is done and is its own result."""
    for s in u.src:
        if lookup(s) is not s:
            return False
    return True


def graph_rewrite(graph: UOp, matcher: PatternMatcher, ctx: Any = None, name: str = "rewrite",
                  trace: RewriteTrace | None = None, max_steps: int = 10_000, results_final: bool = False) -> UOp:
    """Rewrite ``graph`` with ``matcher`` to a fixed point and return the new graph (``graph`` itself when no
    rule fired, so ``graph_rewrite(g, pm) is g`` tells "nothing to do").

    ``ctx`` is passed to rules that declare a ``ctx`` parameter. ``name`` names the pass in errors. ``trace``,
    when given, records every firing (``RewriteTrace.steps``) and the graph before and after. ``max_steps``
    bounds how many rewrites may be in progress at once (successive or nested); a valid graph of any size stays
    far below it. ``results_final``: a rule's result is the node's final result, not rewritten again (for a
    lowering whose rules return nodes no rule matches, built from sources already rewritten: abi's CALLs, encode's
    message chain; the walk then skips the worklist a result would go through). Raises ``RewriteLoopError`` for
    a rule set that does not terminate, ``RuleError`` for a rule returning something other than a UOp,
    ``TypeError`` for a ``graph`` that is not a UOp. Anything a rule raises goes on unchanged (same type) with notes
    (``__notes__``) naming the rule (file:line), the node it was matching and this rewrite's ``name``."""
    if not isinstance(graph, UOp):
        raise TypeError(f"graph_rewrite {name!r}: the graph is a {type(graph).__name__}, not a UOp")
    if not isinstance(matcher, PatternMatcher):
        raise TypeError(f"graph_rewrite {name!r}: the matcher is a {type(matcher).__name__}, not a PatternMatcher")
    nodes, old = _collect(graph)
    if matcher._by_op.keys().isdisjoint({n.op for n in nodes}):  # no rule for any op of the graph: nothing fires
        if trace is not None:
            trace.name, trace.before, trace.after = name, graph, graph
        return graph
    nodes.sort(key=_rank_of)
    try:
        out = _rewrite_all(graph, matcher, ctx, name, trace, max_steps, results_final, nodes, old)
    except RewriteLoopError:  # already names the rewrite and its rules
        raise
    except Exception as e:  # a rule raised: same exception (callers' except clauses still work), one more note
        e.add_note(f"in graph_rewrite {name!r}")
        raise
    if trace is not None:
        trace.name, trace.before, trace.after = name, graph, out
    return out


def _rewrite_all(graph: UOp, matcher: PatternMatcher, ctx: Any, name: str, trace: RewriteTrace | None,
                 max_steps: int, results_final: bool, nodes: list[UOp], old: set[UOp]) -> UOp:
    """graph_rewrite's main loop over ``nodes`` (the input graph, sorted by rank; ``old``: the same as a set)."""
    rw = _Rewriter(matcher, ctx, name, trace, max_steps, nodes, old)
    by_op, rewrite, replaced, early, state = matcher._by_op, matcher.rewrite_with_rule, rw.replaced, rw.early, rw.state
    get, state_get = replaced.get, state.get
    dispatch, unchecked = matcher._dispatch, matcher._rewrite_unchecked
    for n in nodes:
        if early and n in early:
            continue
        src = n.src
        if replaced and src and not replaced.keys().isdisjoint(src):  # a source changed: rebuild the node
            rw.cur = n
            before = UOp(n.op, n.dtype, tuple([get(s, s) for s in src]), n.arg, n.tag)
            known = state_get(before)
            if known is not None:  # built and rewritten before
                if known is not n:
                    replaced[n] = known
                continue
            if before in old:  # another node of the input graph: take the general path
                out = rw.run(n, before, None)
                if out is not n:
                    replaced[n] = out
                continue
            if before.op not in by_op or (fired := rewrite(before, ctx)) is None:
                replaced[n] = state[before] = before
                continue
        elif (entry := dispatch.get(n.op)) is not None:  # the op's rules and their precheck, in one lookup
            if ((pre := entry[1]) is not None and not pre(n)) or (fired := unchecked(n, ctx, entry[0])) is None:
                continue
            rw.cur = before = n
        else:
            continue
        # a rule rewrote ``before`` (``n`` with its sources rewritten) into ``ret``: done if ``ret`` is done
        ret, rule = fired
        if results_final:
            if trace is not None:
                trace.steps.append(RewriteStep(rule, before, ret))
            if before is not n:
                state[before] = ret
            if ret is not n:
                replaced[n] = ret
            continue
        done = rw.lookup(ret)
        if done is None and ret.op not in by_op and _final_sources(ret, rw.lookup):
            # the usual result: a node no rule matches over sources already final, so final itself (what the
            # worklist would find, without it)
            rw.record(ret, ret)
            done = ret
        if done is None or done is _BUSY:
            out = rw.run(n, before, fired)
        else:
            out = done
            if trace is not None:
                trace.steps.append(RewriteStep(rule, before, ret))
            if before is not n:
                state[before] = out
        if out is not n:
            replaced[n] = out
    return get(graph, graph)
