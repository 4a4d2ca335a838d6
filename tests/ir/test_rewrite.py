"""graph_rewrite: fixed point, bottom-up order, termination, idempotence, loop detection, traces."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtlir import Ops, PatternMatcher, RewriteLoopError, RewriteTrace, RuleError, UOp, UPat, dtypes, graph_rewrite
from mtlir.ir.dtypes import wrap
from mtlir.ir.evaluate import ALU_FUNCS

i32 = dtypes.int32
x = UOp.variable("x", -50, 50)
y = UOp.variable("y", -50, 50)


# constant folding and identities: what the symbolic pass does, small enough to check against evaluate()
def fold_consts(n: UOp) -> UOp | None:
    if all(s.op is Ops.CONST for s in n.src):
        try:
            return UOp.const(n.dtype, wrap(n.dtype, ALU_FUNCS[n.op](*(s.arg for s in n.src))))
        except ZeroDivisionError:
            return None
    return None


symbolic = PatternMatcher([
    (UPat({Ops.ADD, Ops.MUL, Ops.SUB, Ops.MAX, Ops.MIN, Ops.IDIV}, name="n"), fold_consts),
    (UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(i32, 0))), lambda a: a),
    (UPat(Ops.MUL, src=(UPat.var("a"), UPat.const(i32, 1))), lambda a: a),
    (UPat(Ops.MUL, src=(UPat.var("a"), UPat.const(i32, 0))), lambda a: UOp.const(i32, 0)),
    (UPat(Ops.SUB, src=(UPat.var("a"), UPat.var("a"))), lambda a: UOp.const(i32, 0)),
    # (a + c1) + c2 -> a + (c1 + c2): creates a node that is itself rewritten (folded)
    (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("c1"))), UPat.cvar("c2"))),
     lambda a, c1, c2: a + (c1 + c2)),
])


def test_folding_to_a_fixed_point() -> None:
    assert graph_rewrite(x + 1 + 1 + 1, symbolic) is x + 3
    assert graph_rewrite((x + 0) * 1, symbolic) is x
    assert graph_rewrite((x * 0 + 2) * (y - y + 3), symbolic) is UOp.const(i32, 6)
    assert graph_rewrite(UOp.sink(x + 0, x), symbolic) is UOp.sink(x, x)


def test_no_change_returns_the_graph_itself_and_rewriting_is_idempotent() -> None:
    g = UOp.sink(x * 3, y + x)
    assert graph_rewrite(g, symbolic) is g
    h = graph_rewrite(UOp.sink(x + 1 + 2, (y * 1) - 0), symbolic)
    assert graph_rewrite(h, symbolic) is h


def test_bottom_up_sources_first() -> None:
    order: list[UOp] = []

    def log(n: UOp) -> None:
        order.append(n)

    g = UOp.sink((x + 1) * 2, x - 3)
    graph_rewrite(g, PatternMatcher([(UPat(name="n"), log)]))
    pos = {n: i for i, n in enumerate(order)}
    assert set(order) == set(g.toposort())
    assert all(pos[s] < pos[n] for n in order for s in n.src)


def test_nodes_created_by_rules_are_rewritten_too() -> None:
    # a rule returns a tree whose inner nodes match other rules
    expand = PatternMatcher([(UPat(Ops.NEG, src=(UPat.var("a"),)), lambda a: (a * 1 + 0) * -1)]) + symbolic
    assert graph_rewrite(-x, expand) is x * -1
    assert graph_rewrite(-(x + 0), expand) is x * -1


def test_results_final_takes_a_rule_result_as_it_is() -> None:
    # NEG(a) -> (a * 1 + 0) * -1: rewritten again by default (symbolic folds it), kept as returned with results_final
    expand = PatternMatcher([(UPat(Ops.NEG, src=(UPat.var("a"),)), lambda a: (a * 1 + 0) * -1)]) + symbolic
    g = UOp.sink(-x, -(y + 0))
    assert graph_rewrite(g, expand) is UOp.sink(x * -1, y * -1)
    trace = RewriteTrace()
    # y + 0 (a source) is still rewritten first; each NEG's result is then final: its inner x * 1 + 0 stays
    out = graph_rewrite(g, expand, results_final=True, trace=trace)
    assert out is UOp.sink((x * 1 + 0) * -1, (y * 1 + 0) * -1)
    assert len(trace) == 3 and trace.after is out
    assert graph_rewrite(x + 1, expand, results_final=True) is x + 1  # nothing fires: the graph itself


def test_ctx_and_trace() -> None:
    seen: list[UOp] = []

    def drop_zero(a: UOp, ctx: list[UOp]) -> UOp:
        ctx.append(a)
        return a

    trace = RewriteTrace()
    pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(i32, 0))), drop_zero)])
    g = UOp.sink(x + 0, (y + 0) + 0)
    out = graph_rewrite(g, pm, ctx=seen, name="drop", trace=trace)
    assert out is UOp.sink(x, y)
    assert trace.name == "drop" and trace.before is g and trace.after is out
    # (y + 0) + 0 becomes y + 0 once its source is rewritten: a node already rewritten, so the rule fires twice
    assert {(s.before, s.after) for s in trace.steps} == {(x + 0, x), (y + 0, y)} and len(trace) == 2
    assert set(seen) == {x, y} and len(seen) == 2
    assert list(trace.counts().values()) == [2] and "drop_zero" in next(iter(trace.counts()))


def test_a_node_rewritten_into_an_existing_node_of_the_graph() -> None:
    # f(a) and f(b) both in the graph, a -> b: f(a) becomes the f(b) that is already there
    a, b = UOp.variable("a", 0, 1), UOp.variable("b", 0, 1)
    g = UOp.sink(-a, -b, (-a) + (-b))
    pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, arg=("a", 0, 1)), lambda: b)])
    assert graph_rewrite(g, pm) is UOp.sink(-b, -b, (-b) + (-b))


# ---- loops

def _tag_rule(frm: str, to: str) -> Any:
    def rule(n: UOp) -> UOp | None:
        return n.replace(tag=to) if n.tag == frm else None
    rule.__name__ = rule.__qualname__ = f"{frm}_to_{to}"
    return rule


def test_a_two_rule_cycle_is_named() -> None:
    pm = PatternMatcher([(UPat(Ops.NOOP, name="n"), _tag_rule("a", "b")), (UPat(Ops.NOOP, name="n"), _tag_rule("b", "a"))])
    with pytest.raises(RewriteLoopError) as e:
        graph_rewrite(UOp.sink(UOp(Ops.NOOP, tag="a")), pm, name="flip")
    assert [r.name for r in e.value.rules] == ["a_to_b", "b_to_a"]
    assert "'flip'" in str(e.value) and "a_to_b" in str(e.value) and "test_rewrite.py:" in str(e.value)


def test_a_three_rule_cycle_is_named_in_firing_order() -> None:
    pm = PatternMatcher([(UPat(Ops.NOOP, name="n"), _tag_rule(f, t)) for f, t in (("a", "b"), ("b", "c"), ("c", "a"))])
    for start, names in (("a", ["a_to_b", "b_to_c", "c_to_a"]), ("c", ["c_to_a", "a_to_b", "b_to_c"])):
        with pytest.raises(RewriteLoopError) as e:
            graph_rewrite(UOp.sink(x, UOp(Ops.NOOP, dtypes.void, (x,), tag=start)), pm)
        assert [r.name for r in e.value.rules] == names


def test_a_cycle_through_nested_results() -> None:
    # NEG(a) -> SUB(0, a) and SUB(0, a) -> NEG(a): the cycle goes through a node the first rule creates
    pm = PatternMatcher([(UPat(Ops.NEG, src=(UPat.var("a"),)), lambda a: UOp.const(i32, 0) - a),
                         (UPat(Ops.SUB, src=(UPat.const(i32, 0), UPat.var("a"))), lambda a: -a)])
    with pytest.raises(RewriteLoopError) as e:
        graph_rewrite(UOp.sink(-x + 1), pm)
    assert [r.name.rsplit(".", 1)[-1] for r in e.value.rules] == ["<lambda>", "<lambda>"]
    assert e.value.rules[0] is pm.rules[0] and e.value.rules[1] is pm.rules[1]


def test_a_result_containing_the_node_it_replaces_is_a_loop() -> None:
    def wrap_var(v: UOp) -> UOp:
        return v + 0

    pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), wrap_var)])
    with pytest.raises(RewriteLoopError, match="contains the node it replaces") as e:
        graph_rewrite(x * 2, pm)
    assert [r.name for r in e.value.rules] == ["test_a_result_containing_the_node_it_replaces_is_a_loop.<locals>."
                                                "wrap_var"]


def test_a_rule_set_that_keeps_growing_stops_at_max_steps() -> None:
    pm = PatternMatcher([(UPat(Ops.CONST, dtype=i32, name="c"), lambda c: UOp.const(i32, c.arg + 1))])
    with pytest.raises(RewriteLoopError, match="max_steps=500") as e:
        graph_rewrite(x + 1, pm, max_steps=500)
    assert len(e.value.rules) == 1 and e.value.rules[0] is pm.rules[0]


def test_no_false_positive_on_a_valid_300k_node_graph() -> None:
    # a 300,001-node chain (150,000 ADDs of distinct constants); every other ADD is rewritten (its tag dropped),
    # so every node above the first rewrite is rebuilt, and max_steps is far below the graph's size
    c = x
    for i in range(150_000):
        c = UOp(Ops.ADD, i32, (c, UOp.const(i32, i + 1)), tag=None if i % 10 else i)
    nodes = c.toposort()
    assert len(nodes) == 300_001
    pm = PatternMatcher([(UPat(Ops.ADD, name="n"), lambda n: n.replace(tag=None) if n.tag is not None else None)])
    out = graph_rewrite(c, pm, max_steps=100)
    assert out is not c and out._rank == 150_000 and out.src[1].arg == 150_000
    assert sum(u.tag is not None for u in nodes) == 15_000 and all(u.tag is None for u in out.toposort())
    assert graph_rewrite(out, pm, max_steps=100) is out


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="not a UOp"):
        graph_rewrite("x", symbolic)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a PatternMatcher"):
        graph_rewrite(x, [])  # type: ignore[arg-type]
    with pytest.raises(RuleError, match="returned a str"):
        graph_rewrite(x + 1, PatternMatcher([(UPat(Ops.ADD), lambda: "no")]))


# ---- properties

def reference_rewrite(root: UOp, pm: PatternMatcher) -> UOp:
    """The definition: rewrite sources, then apply rules until none matches, recursively (small graphs only)."""
    memo: dict[UOp, UOp] = {}

    def go(u: UOp, depth: int = 0) -> UOp:
        assert depth < 200
        if u in memo:
            return memo[u]
        new = u.replace(src=tuple(go(s, depth + 1) for s in u.src))
        r = pm.rewrite(new)
        out = new if r is None else go(r, depth + 1)
        memo[u] = out
        return out
    return go(root)


@st.composite
def expressions(draw: st.DrawFn) -> UOp:
    nodes = [x, y, UOp.const(i32, 0), UOp.const(i32, 1)]
    for _ in range(draw(st.integers(1, 25))):
        a, b = draw(st.sampled_from(nodes)), draw(st.sampled_from(nodes))
        op = draw(st.sampled_from([Ops.ADD, Ops.MUL, Ops.SUB, Ops.MAX, Ops.MIN, "const"]))
        nodes.append(UOp.const(i32, draw(st.integers(-3, 3))) if op == "const" else a.alu(op, b))
    return UOp.sink(*draw(st.lists(st.sampled_from(nodes[4:]), min_size=1, max_size=3)))


@settings(max_examples=150, deadline=None)
@given(expressions(), st.integers(-50, 50), st.integers(-50, 50))
def test_rewrite_keeps_values_matches_the_definition_and_is_idempotent(g: UOp, vx: int, vy: int) -> None:
    out = graph_rewrite(g, symbolic)
    assert out is reference_rewrite(g, symbolic)
    assert graph_rewrite(out, symbolic) is out
    values = {"x": vx, "y": vy}
    assert [s.evaluate(values) for s in out.src] == [s.evaluate(values) for s in g.src]


# a terminating but not confluent rule set whose results create more matches, and a rule that returns another node
# of the input graph: graph_rewrite must compute exactly the definition (reference_rewrite)
a_var, b_var = UOp.variable("a", 0, 9), UOp.variable("b", 0, 9)


def dedup_sink(n: UOp) -> UOp | None:
    uniq = tuple(dict.fromkeys(n.src))
    return UOp.sink(*uniq) if len(uniq) != len(n.src) else None


tangled = PatternMatcher([
    (UPat(Ops.DEFINE_VAR, arg=("a", 0, 9)), lambda: b_var),
    (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("v"),)),)), lambda v: v),
    (UPat(Ops.ADD, src=(UPat.var("v"), UPat.var("v"))), lambda v: v * 2),
    (UPat(Ops.MUL, src=(UPat.var("v"), UPat.const(i32, 2))), lambda v: v << 1),
    (UPat(Ops.NEG, src=(UPat(Ops.ADD, src=(UPat.var("p"), UPat.var("q"))),)), lambda p, q: (-p) + (-q)),
    (UPat(Ops.SINK, name="n"), dedup_sink),
])


@st.composite
def tangled_graphs(draw: st.DrawFn) -> UOp:
    nodes = [a_var, b_var, UOp.const(i32, 2)]
    for _ in range(draw(st.integers(1, 20))):
        kind = draw(st.sampled_from(["neg", "add", "mul", "sink"]))
        p, q = draw(st.sampled_from(nodes)), draw(st.sampled_from(nodes))
        nodes.append(-p if kind == "neg" else p + q if kind == "add" else p * q if kind == "mul" else UOp.sink(p, q))
    return UOp.sink(*draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=4)))


@settings(max_examples=200, deadline=None)
@given(tangled_graphs())
def test_rewrite_is_exactly_the_definition_on_tangled_rules(g: UOp) -> None:
    trace = RewriteTrace()
    out = graph_rewrite(g, tangled, trace=trace)
    assert out is reference_rewrite(g, tangled)
    assert graph_rewrite(out, tangled) is out
    assert all(tangled.rewrite(u) is None for u in out.toposort())  # a fixed point: no rule matches anywhere
    assert all(s.rule.pat.match(s.before) for s in trace.steps)
    assert (len(trace) == 0) == (out is g)


@st.composite
def mapped_graphs(draw: st.DrawFn) -> tuple[UOp, dict[UOp, UOp]]:
    """A random graph and a map sending some of its NEG nodes to later nodes of it (nodes the main loop may not
    have reached yet); with ADD(v, v) -> NEG(v) the map can also close cycles."""
    nodes = [UOp.variable(f"v{i}", 0, 1) for i in range(3)]
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["neg", "sink", "add"]))
        p, q = draw(st.sampled_from(nodes)), draw(st.sampled_from(nodes))
        n = -p if kind == "neg" else UOp.sink(p, q) if kind == "sink" else UOp(Ops.ADD, i32, (p, q))
        if n not in nodes:
            nodes.append(n)
    mapping = {u: nodes[draw(st.integers(i + 1, len(nodes) - 1))] for i, u in enumerate(nodes[:-1])
               if u.op is Ops.NEG and draw(st.booleans())}
    return UOp.sink(*draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=4))), mapping


@settings(max_examples=300, deadline=None)
@given(mapped_graphs())
def test_rules_returning_other_nodes_of_the_graph(case: tuple[UOp, dict[UOp, UOp]]) -> None:
    g, mapping = case
    rules = [(UPat(Ops.ADD, src=(UPat.var("v"), UPat.var("v"))), lambda v: -v)]
    with_ctx = PatternMatcher([(UPat(Ops.NEG, name="u"), lambda u, ctx: ctx.get(u)), *rules])
    try:
        ref = reference_rewrite(g, PatternMatcher([(UPat(Ops.NEG, name="u"), lambda u: mapping.get(u)), *rules]))
    except (AssertionError, RecursionError):  # the definition does not terminate: graph_rewrite must say so
        with pytest.raises(RewriteLoopError):
            graph_rewrite(g, with_ctx, ctx=mapping)
        return
    assert graph_rewrite(g, with_ctx, ctx=mapping) is ref


def test_nodes_of_one_rank_are_rewritten_left_to_right() -> None:
    order: list[UOp] = []

    def log(n: UOp) -> None:
        order.append(n)

    a, b, c = (UOp.variable(v, 0, 1) for v in "abc")
    graph_rewrite(UOp.sink(-a, -b, -c), PatternMatcher([(UPat(name="n"), log)]))
    assert order == [a, b, c, -a, -b, -c, UOp.sink(-a, -b, -c)]


def test_an_exception_a_rule_raises_keeps_its_type_and_gets_notes_naming_the_rule_and_the_node() -> None:
    g = (x + 1) + 2
    pm = PatternMatcher([(UPat(Ops.ADD, name="n"), lambda n: n if 1 // 0 else None)])
    rule = pm.rules[0]
    with pytest.raises(ZeroDivisionError) as e:  # not wrapped: a caller's ``except ZeroDivisionError`` still works
        graph_rewrite(g, pm, name="mypass")
    assert e.value.__notes__ == [
        f"in rule {rule.name} at {rule.location}, matching UOp(Ops.ADD, dtypes.int32, 2 sources)",
        "in graph_rewrite 'mypass'"]
    assert rule.name.endswith("<lambda>") and "tests/ir/test_rewrite.py:" in rule.location


def _boom() -> UOp:
    raise KeyError("boom")


def test_a_rule_raising_in_a_nested_rewrite_is_named_at_each_level_and_loop_errors_get_no_extra_note() -> None:
    inner = PatternMatcher([(UPat(Ops.CONST, name="c"), lambda c: _boom() if c.arg == 2 else None)])

    def outer_rule(n: UOp) -> UOp | None:
        return graph_rewrite(n.src[1], inner, name="inner")

    with pytest.raises(KeyError) as e:
        graph_rewrite((x + 1) + 2, PatternMatcher([(UPat(Ops.ADD, name="n"), outer_rule)]), name="outer")
    notes = e.value.__notes__
    assert [n.split(",")[0].split(" at ")[0] for n in notes] == [
        "in rule " + inner.rules[0].name, "in graph_rewrite 'inner'", "in rule " + outer_rule.__qualname__,
        "in graph_rewrite 'outer'"]
    assert "matching UOp(Ops.CONST, dtypes.int32, arg=2, 0 sources)" in notes[0]
    with pytest.raises(RewriteLoopError) as loop:
        graph_rewrite(x + 1, PatternMatcher([(UPat(Ops.ADD, name="n"), lambda n: n.src[1] + n.src[0])]), name="swap")
    assert "in graph_rewrite" not in "".join(getattr(loop.value, "__notes__", []))
