"""UPat and PatternMatcher: what a pattern matches, captures, rule checks, rule locations, lookup by op."""
from __future__ import annotations

import functools
import subprocess
import sys
from typing import Any

import pytest

from mtlir import Ops, PatternMatcher, RuleError, UOp, UPat, dtypes

i32 = dtypes.int32
x = UOp.variable("x", 0, 10)
y = UOp.variable("y", 0, 10)


def test_op_dtype_and_arg() -> None:
    assert UPat(Ops.ADD).match(x + 1)
    assert not UPat(Ops.MUL).match(x + 1)
    assert UPat({Ops.ADD, Ops.MUL}).match(x * 2) and UPat((Ops.ADD, Ops.MUL)).match(x + 2)
    assert UPat(dtype=i32).match(x) and not UPat(dtype=dtypes.int64).match(x)
    assert UPat(dtype={dtypes.int64, i32}).match(x)
    one = UOp(Ops.NOOP, dtypes.void, (), 1)
    assert UPat(arg=1).match(one) and not UPat(arg=True).match(one) and not UPat(arg=1.0).match(one)
    assert UPat.const(dtypes.float32, 0.0).match(UOp.const(dtypes.float32, 0.0))
    assert not UPat.const(dtypes.float32, 0.0).match(UOp.const(dtypes.float32, -0.0))
    assert UPat.const(dtypes.float32, float("nan")).match(UOp.const(dtypes.float32, float("nan")))
    assert UPat(arg=None).match(x + 1) and not UPat(arg=None).match(x)


def test_captures_and_repeated_names() -> None:
    (m,) = UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("c")), name="root").match(x + 1)
    assert m == {"root": x + 1, "a": x, "c": UOp.const(i32, 1)}
    same = UPat(Ops.SINK, src=(UPat.var("a"), UPat.var("a")))
    assert same.match(UOp.sink(x, x)) and not same.match(UOp.sink(x, y))


def test_source_forms() -> None:
    # binary commutative ops match their sources swapped; others do not
    pat = UPat(Ops.ADD, src=(UPat.cvar("c"), UPat.var("a")))
    assert pat.match(x + 1) == [{"c": UOp.const(i32, 1), "a": x}]
    assert not UPat(Ops.SUB, src=(UPat.cvar("c"), UPat.var("a"))).match(x - 1)
    # both orders are offered when both fit
    assert len(UPat(Ops.ADD, src=(UPat.var("p"), UPat.var("q"))).match(x + y)) == 2
    # a list: any order, any op
    perm = UPat(Ops.SINK, src=[UPat(Ops.CONST, name="c"), UPat(Ops.DEFINE_VAR, name="v"), UPat(Ops.ADD, name="s")])
    assert perm.match(UOp.sink(x + 1, UOp.const(i32, 5), x)) == [{"s": x + 1, "c": UOp.const(i32, 5), "v": x}]
    # one UPat: every source
    each = UPat(Ops.SINK, src=UPat(Ops.DEFINE_VAR))
    assert each.match(UOp.sink(x, y)) and not each.match(UOp.sink(x, x + 1)) and each.match(UOp.sink())
    # lengths: exact unless allow_any_len
    assert not UPat(Ops.SINK, src=(UPat.var("a"),)).match(UOp.sink(x, y))
    assert UPat(Ops.SINK, src=(UPat.var("a"),), allow_any_len=True).match(UOp.sink(x, y)) == [{"a": x}]
    assert UPat(Ops.SINK, src=()).match(UOp.sink()) and not UPat(Ops.SINK, src=()).match(UOp.sink(x))
    # nested
    nested = UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("b"))), UPat.cvar("c")))
    assert nested.match((x + 1) * 3) == [{"a": x, "b": UOp.const(i32, 1), "c": UOp.const(i32, 3)}]


def test_alternatives() -> None:
    pat = UPat(Ops.ADD, name="n") | UPat(Ops.MUL, name="n")
    assert pat.match(x + 1) and pat.match(x * 2) and not pat.match(x - 1)
    assert pat.op_keys() == frozenset({Ops.ADD, Ops.MUL})
    assert (pat | UPat(Ops.SUB)).op_keys() == frozenset({Ops.ADD, Ops.MUL, Ops.SUB})
    assert UPat.any(UPat(Ops.ADD), UPat()).op_keys() is None
    inner = UPat(Ops.NEG, src=(UPat.cvar("c") | UPat(Ops.DEFINE_VAR, name="c"),))
    assert inner.match(-x) == [{"c": x}] and inner.match(-UOp.const(i32, 1))
    with pytest.raises(TypeError):
        UPat.any()


def test_bad_patterns_are_refused() -> None:
    with pytest.raises(TypeError, match="Ops"):
        UPat("ADD")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="DType"):
        UPat(Ops.ADD, dtype="int32")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="UPats"):
        UPat(Ops.ADD, src=(x,))  # type: ignore[arg-type]


def test_rule_functions_get_captures_and_ctx() -> None:
    seen: list[Any] = []

    def with_ctx(a: UOp, ctx: list[Any]) -> UOp:
        ctx.append(a)
        return a

    pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(i32, 0))), with_ctx),
                         (UPat(Ops.MUL, src=(UPat.var("a"), UPat.const(i32, 1))), lambda a: a)])
    assert pm.rewrite(x + 0, seen) is x and seen == [x]
    assert pm.rewrite(x * 1) is x
    assert pm.rewrite(x * 2) is None and pm.rewrite(x - 0) is None
    got = pm.rewrite_with_rule(x * 1)
    assert got is not None and got[0] is x and got[1].pat.op_keys() == frozenset({Ops.MUL})
    # a rule returning the node itself does not count, the next rule is tried
    pm2 = PatternMatcher([(UPat(Ops.ADD, name="n"), lambda n: n), (UPat(Ops.ADD, name="n"), lambda n: n.src[0])])
    assert pm2.rewrite(x + 1) is x


def test_rule_checks_at_construction() -> None:
    with pytest.raises(RuleError, match=r"captures \['b'\]"):
        PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))), lambda a: a)])
    with pytest.raises(RuleError, match=r"\['z'\] are never captured"):
        PatternMatcher([(UPat(Ops.ADD, name="a"), lambda a, z: a)])
    with pytest.raises(RuleError, match="pair"):
        PatternMatcher([UPat(Ops.ADD)])  # type: ignore[list-item]
    with pytest.raises(RuleError, match="not callable"):
        PatternMatcher([(UPat(Ops.ADD), 3)])  # type: ignore[list-item]
    # **kwargs takes anything, defaults need no capture
    pm = PatternMatcher([(UPat(Ops.ADD, name="a"), lambda **kw: kw["a"].src[0]),
                         (UPat(Ops.MUL, name="a"), lambda a, unused=None: a.src[0])])
    assert pm.rewrite(x + 1) is x and pm.rewrite(x * 2) is x


def test_rule_returning_a_non_uop_is_an_error() -> None:
    pm = PatternMatcher([(UPat(Ops.ADD), lambda: 3)])
    with pytest.raises(RuleError, match="returned a int"):
        pm.rewrite(x + 1)


def _fold(a: UOp) -> UOp:
    return a


def test_rule_location_from_the_code_object() -> None:
    pm = PatternMatcher([(UPat(Ops.ADD, name="a"), _fold), (UPat(Ops.MUL, name="a"), functools.partial(_fold))])
    line = _fold.__code__.co_firstlineno
    assert pm.rules[0].location == f"{__file__}:{line}" and pm.rules[0].name == "_fold"
    assert pm.rules[1].location == f"{__file__}:{line}"
    assert "_fold" in repr(pm.rules[0])


def test_rule_location_for_code_fed_to_python_stdin() -> None:
    code = ("from mtlir import PatternMatcher, UPat, Ops\n"
            "\n"
            "def my_rule(a):\n"
            "    return None\n"
            "pm = PatternMatcher([(UPat(Ops.ADD, name='a'), my_rule), (UPat(Ops.MUL, name='a'), lambda a: None)])\n"
            "print(pm.rules[0].location, pm.rules[1].location)\n")
    proc = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["<stdin>:3", "<stdin>:5"]


def test_rules_are_looked_up_by_op() -> None:
    calls: list[str] = []

    def count(n: UOp) -> None:
        calls.append("msg")

    pm = PatternMatcher([(UPat(Ops.MSG, name="n"), count) for _ in range(500)]
                        + [(UPat(Ops.ADD, name="n"), lambda n: None), (UPat(name="n"), lambda n: None)])
    assert len(pm.rules_for(Ops.ADD)) == 2 and len(pm.rules_for(Ops.MSG)) == 501 and len(pm.rules_for(Ops.SUB)) == 1
    assert pm.rewrite(x + 1) is None and calls == []  # the MSG rules were not even tried
    assert pm.rewrite(UOp(Ops.MSG, dtypes.void, (), "commit")) is None and len(calls) == 500
    assert len(pm + pm) == 2 * len(pm)


# ---- the precheck: per op, one cheap test that no rule can match (a pre-filter, never wrong the other way)

_PATS = [
    UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(i32, 0))),                      # commutative: either order
    UPat(Ops.ADD, src=(UPat(Ops.MUL, name="m"), UPat.var("b"))),
    UPat(Ops.SUB, dtype=i32, src=(UPat.cvar("c"), UPat.var("d"))),                # not commutative
    UPat(Ops.WHERE, src=(UPat(Ops.CMPLT), UPat.var("p")), allow_any_len=True),
    UPat(Ops.MAX, src=[UPat(Ops.CONST), UPat.var("q")]),                          # any order
    UPat(Ops.MIN, src=UPat(Ops.CONST)),                                            # every source
    UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("r"),)) | UPat(Ops.CONST, arg=3),)),  # alternatives
    UPat(Ops.XOR, arg=None, src=(UPat(dtype=dtypes.int64), UPat.var("t"))),
]
_NODES = [x + 0, 0 + x, x + 1, x * 2 + y, y + x * 2, x - 0, UOp.const(i32, 1) - x, x.cast(dtypes.int64) - 2,
          (x < 2).where(x, y), (x.eq(2)).where(x, y), x.maximum(1), UOp.const(i32, 1).maximum(x), x.maximum(y),
          x.minimum(1), UOp.const(i32, 1).minimum(2), -(-x), -UOp.const(i32, 3), -UOp.const(i32, 4), -x, x ^ y,
          x.cast(dtypes.int64) ^ 1, UOp.const(dtypes.int64, 5) ^ x.cast(dtypes.int64)]


@pytest.mark.parametrize("pat", _PATS, ids=lambda p: repr(p)[:60])
def test_the_precheck_never_rejects_a_match(pat: UPat) -> None:
    pm = PatternMatcher([(pat, lambda **kw: None)])
    for node in _NODES:
        pre = pm._pre.get(node.op)
        if pat.match(node):
            assert pre is None or pre(node), (pat, node)


def test_the_precheck_rejects_nodes_no_rule_can_match() -> None:
    """bench_rewrite's rules-miss case: rules for ADD that never match a chain of x + i are told apart without
    running the patterns."""
    pm = PatternMatcher([(_PATS[0], lambda a: a), (_PATS[1], lambda m, b: m)])
    pre = pm._pre[Ops.ADD]
    assert not pre(x + 1) and not pre(x + y) and pre(x + 0) and pre(0 + x) and pre(x * 2 + y) and pre(y + x * 2)
    assert pm.rewrite(x + 0) is x and pm.rewrite(x + 1) is None
    assert PatternMatcher([(_PATS[6], lambda r: r)])._pre[Ops.NEG](-x)  # a source with alternatives: only counted
    assert Ops.ADD not in PatternMatcher([(UPat(Ops.ADD) | UPat(Ops.SUB), lambda: None)])._pre  # root alternatives
