"""UOp: hash-consing identity, arg keys, the weak intern table, determinism, toposort, builders, evaluate, and
Python's implicit conversions (bool, int, index, float, == against a number)."""
from __future__ import annotations

import copy
import dataclasses
import gc
import os
import pickle
import struct
import subprocess
import sys
import weakref
from collections.abc import Iterator

import networkx as nx
import pytest
from hypothesis import given, settings
from conftest import dags, graphs

from mtlir import GroupOp, Ops, UOp, dtypes
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj
from mtlir.ir.uop import argkey, live_nodes

i32 = dtypes.int32


# ---- identity

def test_same_node_twice_is_the_same_object() -> None:
    x = UOp.variable("x", 0, 10)
    assert UOp.variable("x", 0, 10) is x
    assert (x + 1) is (x + 1)
    assert UOp(Ops.ADD, i32, (x, UOp.const(i32, 1))) is x + 1
    assert UOp(Ops.ADD, i32, [x, UOp.const(i32, 1)]) is x + 1  # a list of sources is a tuple
    assert hash(x + 1) == hash(x + 1) and (x + 1) == (x + 1)


def test_any_field_makes_another_node() -> None:
    x = UOp.variable("x", 0, 10)
    base = UOp(Ops.ADD, i32, (x, x))
    assert UOp(Ops.MUL, i32, (x, x)) is not base
    assert UOp(Ops.ADD, dtypes.int64, (x, x)) is not base
    assert UOp(Ops.ADD, i32, (x,)) is not base
    assert UOp(Ops.ADD, i32, (x, x), 0) is not base
    assert UOp(Ops.ADD, i32, (x, x), tag="t") is not base
    assert base.replace(tag="t") is UOp(Ops.ADD, i32, (x, x), tag="t")


def test_float_args_by_bits() -> None:
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert UOp.const(dtypes.float32, -0.0).arg == 0.0 and str(UOp.const(dtypes.float32, -0.0).arg) == "-0.0"
    nan2 = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]  # another NaN payload
    assert UOp.const(dtypes.float32, float("nan")) is UOp.const(dtypes.float32, float("nan"))
    assert UOp.const(dtypes.float32, nan2) is UOp.const(dtypes.float32, float("nan"))
    assert UOp.const(dtypes.float32, 1.0) is not UOp.const(dtypes.float32, 1.0 + 2**-52)


def test_args_of_different_types_never_merge() -> None:
    nodes = {UOp(Ops.NOOP, dtypes.void, (), a) for a in (1, True, 1.0)}
    assert len(nodes) == 3
    assert [type(n.arg) for n in sorted(nodes, key=lambda n: type(n.arg).__name__)] == [bool, float, int]
    # inside tuples, frozensets, frozen dataclasses and tags too
    assert UOp(Ops.NOOP, arg=(1, 2)) is not UOp(Ops.NOOP, arg=(True, 2))
    assert UOp(Ops.NOOP, arg=((0.0,),)) is not UOp(Ops.NOOP, arg=((-0.0,),))
    assert UOp(Ops.NOOP, arg=frozenset({1})) is not UOp(Ops.NOOP, arg=frozenset({1.0}))
    assert UOp(Ops.NOOP, arg=Obj("buffer", "b", (1,))) is not UOp(Ops.NOOP, arg=Obj("buffer", "b", (True,)))
    assert UOp(Ops.NOOP, arg=Obj("buffer", "b", (1,))) is UOp(Ops.NOOP, arg=Obj("buffer", "b", (1,)))
    assert UOp(Ops.NOOP, arg=KernelParam(None, 0, elements=1)) is not UOp(Ops.NOOP, arg=KernelParam(None, 0,
                                                                                                   elements=None))
    assert UOp(Ops.NOOP, arg=DeviceSpec("Apple9", 1)) is not UOp(Ops.NOOP, arg=DeviceSpec("Apple9", True))
    assert UOp(Ops.NOOP, tag=1) is not UOp(Ops.NOOP, tag=True)
    assert argkey((1, (2.0, "a"))) == argkey((1, (2.0, "a")))


def test_bad_input_is_refused_with_a_clear_error() -> None:
    @dataclasses.dataclass
    class Mutable:
        x: int

    with pytest.raises(TypeError, match="not hashable"):
        UOp(Ops.NOOP, arg=[1, 2])
    with pytest.raises(TypeError, match="mutable dataclass"):
        UOp(Ops.NOOP, arg=Mutable(1))
    with pytest.raises(TypeError, match="src must be a tuple of UOps, got a UOp"):
        UOp(Ops.NEG, i32, UOp.const(i32, 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="source 1 is a int"):
        UOp(Ops.ADD, i32, (UOp.const(i32, 1), 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an Ops"):
        UOp("ADD", i32)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a DType"):
        UOp(Ops.ADD, "int32")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unknown field"):
        UOp.const(i32, 1).replace(value=2)
    with pytest.raises(AttributeError, match="immutable"):
        UOp.const(i32, 1).arg = 2  # type: ignore[misc]


def test_replace_returns_the_node_itself_when_nothing_changes() -> None:
    v = UOp.variable("x", 0, 10)
    x = v + 1
    assert x.replace() is x
    assert x.replace(src=x.src, arg=None, dtype=i32) is x
    assert x.replace(op=Ops.SUB) is v - 1


def test_pickle_and_copy_keep_identity() -> None:
    g = UOp.sink(UOp.variable("x", 0, 10) * 3, UOp(Ops.OBJECT, dtypes.id, (), Obj("queue", "queue")))
    assert pickle.loads(pickle.dumps(g)) is g
    assert copy.copy(g) is g and copy.deepcopy(g) is g


# ---- the weak intern table

def test_freed_nodes_leave_the_intern_table() -> None:
    gc.collect()
    before = live_nodes()

    def build() -> weakref.ref[UOp]:
        x = UOp.variable("fresh_for_weak_table", 0, 5)
        for i in range(1000):
            x = x * (i + 7)
        return weakref.ref(x)

    ref = build()
    assert ref() is None  # freed as soon as nobody holds it, without a gc pass
    assert live_nodes() == before
    held = UOp.variable("held", 0, 1) + 1
    assert live_nodes() > before
    assert UOp.variable("held", 0, 1) + 1 is held


# ---- determinism

_DETERMINISM_SCRIPT = r"""
from mtlir import UOp, Ops, dtypes, render, listing, to_dot, graph_rewrite, PatternMatcher, UPat
from mtlir.metal import Obj
x = UOp.variable("x", 0, 10)
leaves = [UOp(Ops.OBJECT, dtypes.id, (), Obj("buffer", f"buffer:{i}", (i,))) for i in range(20)]
tagged = [UOp(Ops.NOOP, dtypes.void, (l, x), frozenset({"a", "b", "c", s, 1.5, None})) for s, l in zip("pqrstuvw", leaves)]
g = UOp.sink(*tagged, *[(x + i) * 2 for i in range(30)], x.eq(3))
pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("a"), UPat.cvar("c"))), lambda a, c: a + a)])
out = graph_rewrite(g, pm)
print(render(g)); print(listing(out)); print(to_dot(out).source)
print([u.op.name for u in out.toposort()])
"""


def test_output_is_the_same_under_any_pythonhashseed() -> None:
    outs = set()
    for seed in ("0", "1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", _DETERMINISM_SCRIPT], env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        outs.add(proc.stdout)
    assert len(outs) == 1
    assert "frozenset({" in next(iter(outs))


# ---- toposort

@pytest.fixture
def default_recursion_limit() -> Iterator[None]:
    """Python's default recursion limit (1000) for the test: an earlier test may have imported a library that
    raises it for the whole process (tinygrad sets 10000 when imported)."""
    was = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        yield
    finally:
        sys.setrecursionlimit(was)


@pytest.mark.usefixtures("default_recursion_limit")
def test_toposort_of_a_100k_chain_and_a_20k_wide_sink_at_the_default_recursion_limit() -> None:
    assert sys.getrecursionlimit() == 1000
    x = UOp.variable("x", 0, 10)
    c = x
    for _ in range(100_000):
        c = c + 1
    order = c.toposort()
    assert len(order) == 100_002 and order[-1] is c and order[0] is x
    wide = UOp.sink(*[x + i for i in range(20_000)])
    order = wide.toposort()
    assert len(order) == 1 + 1 + 2 * 20_000  # the sink, x, the ADDs and their constants
    assert order[-1] is wide
    assert len({id(u) for u in order}) == len(order)


def test_toposort_is_depth_first_left_to_right() -> None:
    a, b, c = (UOp.variable(n, 0, 1) for n in "abc")
    g = UOp.sink(a + b, c, a)
    assert g.toposort() == [a, b, a + b, c, g]


@settings(max_examples=60, deadline=None)
@given(dags())
def test_toposort_matches_networkx(g: UOp) -> None:
    order = g.toposort()
    pos = {u: i for i, u in enumerate(order)}
    assert len(pos) == len(order)
    ref = nx.DiGraph()
    ref.add_node(g)
    stack = [g]
    while stack:
        u = stack.pop()
        for s in u.src:
            if s not in ref:
                stack.append(s)
            ref.add_edge(s, u)
    assert set(order) == nx.ancestors(ref, g) | {g}  # exactly the reachable nodes
    assert all(pos[s] < pos[u] for s, u in ref.edges)  # every source before its user
    assert nx.is_directed_acyclic_graph(ref)
    assert all(s._rank < u._rank for s, u in ref.edges)


@settings(max_examples=40, deadline=None)
@given(graphs())
def test_toposort_of_random_graphs_of_every_op(g: UOp) -> None:
    order = g.toposort()
    pos = {u: i for i, u in enumerate(order)}
    assert all(pos[s] < pos[u] for u in order for s in u.src)
    assert order[-1] is g


# ---- builders

def test_const_and_variable() -> None:
    assert UOp.const(i32, 3.0).arg == 3 and type(UOp.const(i32, 3.0).arg) is int
    assert UOp.const(dtypes.float32, 3).arg == 3.0 and type(UOp.const(dtypes.float32, 3).arg) is float
    assert UOp.const(dtypes.bool, 1).arg is True
    with pytest.raises(ValueError, match="not an integer"):
        UOp.const(i32, 2.5)
    v = UOp.variable("n", 1, 32)
    assert (v.op, v.dtype, v.arg) == (Ops.DEFINE_VAR, i32, ("n", 1, 32))
    with pytest.raises(ValueError, match="min 5 > max 4"):
        UOp.variable("n", 5, 4)


@pytest.mark.parametrize("call, error, message", [
    (lambda: UOp.variable("m", 1.5, 2), TypeError, "variable 'm': min bound 1.5 is a float, not an int"),
    (lambda: UOp.variable("m", 1, 2.0), TypeError, "max bound 2.0 is a float"),
    (lambda: UOp.variable("m", True, 2), TypeError, "min bound True is a bool"),
    (lambda: UOp.variable("", 1, 2), ValueError, "the name must be a non-empty string"),
    (lambda: UOp.variable(3, 1, 2), TypeError, "the name is a str"),
    (lambda: UOp.variable("m", 1, 2**40), ValueError, "variable 'm': bounds [1, 1099511627776] do not fit its dtype "
                                                      "int32"),
    (lambda: UOp.variable("u", -1, 2, dtypes.uint32), ValueError, "do not fit its dtype uint32"),
])
def test_variables_refuse_bad_bounds(call, error: type, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as e:
        call()
    assert message in str(e.value)
    assert UOp.variable("m", 1, 2**40, dtypes.int64).arg == ("m", 1, 2**40)


@pytest.mark.parametrize("call, message", [
    (lambda n: n + 1.5, "ADD of int32: the float constant 1.5 does not mix with an integer expression"),
    (lambda n: 1.5 * n, "the float constant 1.5 does not mix"),
    (lambda n: n < 0.5, "CMPLT of int32: the float constant 0.5"),
    (lambda n: n + "a", "ADD of int32: operand 'a' is a str, not a UOp, int or float"),
    (lambda n: n * None, "operand None is a NoneType"),
    (lambda n: n + UOp.const(dtypes.float32, 1.0), "ADD: the operands are int32 and float32; an integer and a float "
                                                   "do not mix"),
    (lambda n: UOp.const(dtypes.float32, 1.0) - n, "SUB: the operands are float32 and int32"),
    (lambda n: n + 2**31, "ADD of int32: the constant 2147483648 does not fit int32"),
    (lambda n: (n < 3).where(n, 2.5), "the float constant 2.5 does not mix"),
    (lambda n: (n < 3).where(n, UOp.const(dtypes.float32, 1.0)), "WHERE: the branches are int32 and float32"),
])
def test_operators_build_well_typed_nodes_only(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError) as e:
        call(UOp.variable("n", 1, 32))
    assert message in str(e.value)


def test_operators_still_take_what_they_always_did() -> None:
    n, f = UOp.variable("n", 1, 32), UOp.const(dtypes.float32, 2.0)
    assert (f * 2).src[1] is UOp.const(dtypes.float32, 2.0) and (f + 0.5).dtype is dtypes.float32
    assert (n + True).src[1] is UOp.const(i32, 1) and (n << UOp.const(dtypes.uint8, 2)).dtype is i32
    assert (n + -2**31).src[1].arg == -2**31 and (UOp.const(dtypes.uint64, 1) + (2**64 - 1)).dtype is dtypes.uint64
    assert (n < 3).where(n, 2).src[2] is UOp.const(i32, 2) and (n < 3).where(1, 2).dtype is i32


def test_integer_constants_wrap_as_a_c_conversion() -> None:
    assert UOp.const(dtypes.uint32, -1).arg == 2**32 - 1 and UOp.const(dtypes.int8, 300).arg == 44
    assert UOp.const(dtypes.int8, 128).arg == -128 and UOp.const(i32, 2**31).arg == -2**31
    assert UOp.const(dtypes.uint64, 2**64 + 5).arg == 5 and UOp.const(dtypes.uint8, 256.0).arg == 0
    assert UOp.const(dtypes.bool, 2).arg is True and UOp.const(dtypes.bool, 0).arg is False
    for dt in (dtypes.id, dtypes.SEL, dtypes.voidptr, dtypes.float32.ptr()):  # 64-bit unsigned
        assert UOp.const(dt, -1).arg == 2**64 - 1
    assert UOp.const(dtypes.uint32, -1) is UOp.const(dtypes.uint32, 2**32 - 1)  # one node for one value


def test_evaluate_wraps_constants_built_directly() -> None:
    raw = UOp(Ops.CONST, dtypes.uint32, (), -1)  # not through UOp.const: the value is as given
    assert raw.evaluate() == 2**32 - 1 and (raw + 0).evaluate() == 2**32 - 1


def test_operators_build_nodes_and_never_fold() -> None:
    x = UOp.variable("x", 0, 10)
    y = x + 1 + 1
    assert y.op is Ops.ADD and y.src[0].op is Ops.ADD and y.src[1].arg == 1
    assert (2 + x).src == (UOp.const(i32, 2), x)
    for node, op in ((x - 1, Ops.SUB), (x * 2, Ops.MUL), (x // 2, Ops.IDIV), (x % 2, Ops.MOD), (x << 1, Ops.SHL),
                     (x >> 1, Ops.SHR), (x & 1, Ops.AND), (x | 1, Ops.OR), (x ^ 1, Ops.XOR), (-x, Ops.NEG),
                     (x.maximum(1), Ops.MAX), (x.minimum(1), Ops.MIN)):
        assert node.op is op and node.dtype is i32
    for node, op in ((x < 1, Ops.CMPLT), (x <= 1, Ops.CMPLE), (x.eq(1), Ops.CMPEQ), (x.ne(1), Ops.CMPNE)):
        assert node.op is op and node.dtype is dtypes.bool
    assert (x > 1).src == (UOp.const(i32, 1), x) and (x > 1).op is Ops.CMPLT
    w = (x < 3).where(x, 0)
    assert w.op is Ops.WHERE and w.dtype is i32 and w.src[2].arg == 0


def test_memory_loop_and_struct_builders() -> None:
    buf = UOp(Ops.BUFFER, dtypes.float32.ptr(), (), 64, tag="buffer:0")
    addr = buf.index(3)
    assert addr.op is Ops.INDEX and addr.dtype is dtypes.float32.ptr() and addr.src[1].dtype is dtypes.int64
    ld = addr.load()
    assert ld.op is Ops.LOAD and ld.dtype is dtypes.float32
    st = addr.store(1.5)
    assert st.op is Ops.STORE and st.dtype is dtypes.void and st.src[1].arg == 1.5
    assert ld.after() is ld and ld.after(st).src == (ld, st) and ld.after(st).dtype is dtypes.float32
    r = UOp.range(10, 2)
    assert (r.op, r.arg, r.src[0].arg, r.dtype) == (Ops.RANGE, 2, 10, dtypes.int64)
    assert r.end(st).src == (r, st) and r.end(st).op is Ops.END
    with pytest.raises(TypeError, match="closes a RANGE"):
        ld.end(st)
    size = UOp.struct(dtypes.MTLSize, 4, 1, 1)
    assert size.dtype is dtypes.MTLSize and len(size.src) == 3 and size.gep(0).op is Ops.GEP
    with pytest.raises(ValueError, match="takes 2 fields, got 3"):
        UOp.struct(dtypes.NSRange, 1, 2, 3)
    x = UOp.variable("x", 0, 1)
    assert x.cast(i32) is x and x.cast(dtypes.int64).op is Ops.CAST and x.bitcast(dtypes.uint32).op is Ops.BITCAST


def test_groups_cover_the_alu_ops() -> None:
    assert GroupOp.Commutative <= GroupOp.Binary and GroupOp.Comparison <= GroupOp.Binary
    assert GroupOp.ALU == GroupOp.Unary | GroupOp.Binary | GroupOp.Ternary


# ---- evaluate

def test_evaluate_has_c_semantics() -> None:
    x = UOp.variable("x", -100, 100)
    assert x.alu(Ops.IDIV, 3).evaluate({"x": -7}) == -2 and x.alu(Ops.MOD, 3).evaluate({"x": -7}) == -1
    assert ((x + 1) * 2).evaluate({"x": 4}) == 10
    assert (UOp.const(dtypes.uint8, 250) + 10).evaluate() == 4  # wraps to the dtype
    assert (UOp.const(dtypes.int8, 127) + 1).evaluate() == -128
    assert (x < 3).where(x, 0).evaluate({"x": 2}) == 2
    with pytest.raises(KeyError, match="'x' has no value"):
        (x + 1).evaluate()
    with pytest.raises(ValueError, match="outside its bounds"):
        x.evaluate({"x": 101})
    with pytest.raises(ValueError, match="cannot evaluate"):
        UOp(Ops.BUFFER, dtypes.float32.ptr(), (), 4).index(0).load().evaluate()


def test_repr_of_a_big_graph_is_short() -> None:
    x = UOp.variable("x", 0, 1)
    for _ in range(500):
        x = x + 1
    assert len(repr(x)) < 200 and "rank=500" in repr(x)
    assert repr(UOp.const(i32, 1)) == "x0 = UOp(Ops.CONST, dtypes.int32, (), 1)\n"


def test_kernel_args_hash_consed() -> None:
    k = Kernel("E_1", "E_1", "kernel void E_1(device float* a) {}\n", (KernelParam(None, 0),))
    a = UOp(Ops.KERNEL, dtypes.void, (), k)
    assert UOp(Ops.KERNEL, dtypes.void, (), Kernel(k.key, k.function, k.msl, k.params)) is a  # built again


def test_evaluate_bitcast_keeps_the_bits() -> None:
    assert UOp.const(dtypes.float32, 1.0).bitcast(dtypes.uint32).evaluate() == 0x3F800000
    assert UOp.const(dtypes.uint32, 0x3F800000).bitcast(dtypes.float32).evaluate() == 1.0
    assert UOp.const(i32, -1).bitcast(dtypes.uint32).evaluate() == 0xFFFFFFFF
    assert UOp.const(dtypes.uint64, 2**63).bitcast(dtypes.int64).evaluate() == -(2**63)
    with pytest.raises(ValueError, match="cannot bitcast int32 .4 bytes. to int64"):
        UOp.const(i32, 1).bitcast(dtypes.int64).evaluate()


def test_to_numpy_gives_each_element_types_numpy_dtype() -> None:
    import ml_dtypes
    import numpy as np
    assert dtypes.to_numpy(dtypes.float16) == np.float16 and dtypes.to_numpy(dtypes.uint8) == np.uint8
    assert dtypes.to_numpy(dtypes.bool) == np.bool_ and dtypes.to_numpy(dtypes.int64) == np.int64
    bf = dtypes.to_numpy(dtypes.bfloat16)
    assert bf == np.dtype(ml_dtypes.bfloat16) and bf.itemsize == dtypes.bfloat16.itemsize == 2
    assert np.frombuffer(b"\xc0\x3f", dtype=bf).astype(np.float32)[0] == 1.5  # float32 1.5 is 0x3fc00000
    assert dtypes.bfloat16.is_float and dtypes.by_name("bfloat16") is dtypes.bfloat16
    for bad in (dtypes.void, dtypes.id, dtypes.MTLSize, dtypes.float32.ptr()):
        with pytest.raises(TypeError, match="is not an element type"):
            dtypes.to_numpy(bad)


def test_dtype_reprs_build_the_dtype_again() -> None:
    from mtlir.ir.dtypes import DType, StructDType
    for dt in (*dtypes.all, dtypes.voidptr, dtypes.MTLSize.ptr(), DType("odd", 3, "3s", "uint"),
               StructDType("P", ("a", "b"))):
        assert eval(repr(dt), {"dtypes": dtypes, "DType": DType, "StructDType": StructDType}) is dt


# ---- Python's implicit conversions: right for one value, a TypeError naming the expression otherwise

N4K = UOp.variable("n", 1, 4096)


def test_python_max_min_over_a_symbolic_size_is_an_error_naming_the_expression() -> None:
    # max(n // 128, 1) used to be the constant 1: a grid of one threadgroup for every n
    with pytest.raises(TypeError) as e:
        max(N4K // 128, 1)
    assert "bool() of the bool expression (n // 128) < 1: it can be True or False for n in [1, 4096]" in str(e.value)
    assert "x.maximum(y) for max(x, y)" in str(e.value) and "cond.where(a, b)" in str(e.value)
    with pytest.raises(TypeError, match=r"\(n // 128\) < 1"):
        min(1, N4K // 128)
    with pytest.raises(TypeError, match="m < n: it can be True or False for m in"):
        sorted([N4K, UOp.variable("m", 0, 9)])
    with pytest.raises(TypeError, match=r"bool\(\) of the bool expression n < 100"):
        if N4K < 100:
            pass
    with pytest.raises(TypeError, match="x.minimum"):
        _ = N4K and 1
    # what to write instead builds MAX / MIN / WHERE nodes that decide per submit
    assert (N4K // 128).maximum(1).evaluate({"n": 4096}) == 32 and (N4K // 128).maximum(1).evaluate({"n": 5}) == 1
    assert (N4K < 100).where(N4K, 100).evaluate({"n": 4000}) == 100


def test_a_condition_the_bounds_decide_has_its_value() -> None:
    # `if n < 0:` used to take its branch: n in [1, 4096] is never below 0
    assert bool(N4K < 0) is False and bool(N4K >= 1) is True and not N4K.eq(0)
    big = UOp.variable("m", 128, 4096)
    assert max(big // 128, 1) is big // 128 and min(big, 1) == 1  # the bounds decide each comparison
    assert bool(UOp.const(i32, 0)) is False and bool(UOp.const(i32, 3) - 3) is False and bool(UOp.const(i32, 2))
    assert bool(UOp.const(dtypes.float32, 0.5) < 1.0) is True  # no variables: evaluated
    assert bool(UOp.const(dtypes.uint8, 255) + 1) is False    # C semantics: wraps to 0


@pytest.mark.parametrize("convert, what", [
    (int, "int"), (float, "float"), (lambda u: range(u), "index"), (lambda u: [0, 1][u], "index"),
    (bool, "bool"),
])
def test_conversions_of_a_symbolic_value_name_it(convert, what: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError) as e:
        convert(N4K // 2)
    assert f"{what}() of the int32 expression n // 2: it can be a value in [0, 2048] for n in [1, 4096]" \
        in str(e.value)


def test_a_float_condition_of_a_variable_names_it() -> None:
    f = UOp.variable("f", 0, 4, dtypes.float32)
    with pytest.raises(TypeError, match=r"bool\(\) of the bool expression f < 1.0: its value depends on f in \[0, 4\]"):
        max(f, 1.0)


def test_conversions_of_a_single_value_are_right() -> None:
    c = UOp.const(i32, 5) * 3
    assert int(c) == 15 and float(c) == 15.0 and list(range(UOp.const(i32, 3))) == [0, 1, 2] and [7, 8][c - 14] == 8
    assert int(UOp.variable("k", 4, 4)) == 4 and int(UOp.const(dtypes.uint32, -1)) == 2**32 - 1
    assert float(UOp.const(dtypes.float32, 2.0) + 1.5) == 3.5 and int(UOp.const(dtypes.float32, 2.5)) == 2
    with pytest.raises(TypeError, match=r"index\(\) of the float32 expression 2.5: a float32 is not an integer"):
        range(UOp.const(dtypes.float32, 2.5))
    with pytest.raises(ZeroDivisionError):
        int(UOp.const(i32, 1) // 0)


def test_a_node_that_is_not_a_value_has_no_truth_value() -> None:
    buf = UOp(Ops.BUFFER, dtypes.float32.ptr(), (), 64)
    for node, message in ((UOp.sink(N4K), r"bool\(\) of the SINK<void> node: it is not a value"),
                          (buf, r"bool\(\) of the BUFFER<float32\*> node"),
                          (buf.index(0).load() + 1.0, "ADD<float32> node: it depends on the LOAD<float32> node")):
        with pytest.raises(TypeError, match=message):
            bool(node)
    with pytest.raises(TypeError, match="node is not None"):
        int(buf.index(0).load())
    assert buf is not None  # what to write instead


@pytest.mark.parametrize("compare, message", [
    (lambda: N4K == 0, r"the int32 expression n == 0: == on a UOp compares nodes.*x.eq\(0\)"),
    (lambda: 0 == N4K, r"n == 0"),
    (lambda: N4K != 0, r"n != 0: != on a UOp compares nodes, so against a number it would be True.*x.ne\(0\)"),
    (lambda: UOp.const(i32, 3) == 3, r"the int32 expression 3 == 3.*int\(x\) == 3"),
    (lambda: N4K == 1.5, r"n == 1.5"),
    (lambda: 3 in [N4K], r"n == 3"),
])
def test_equality_against_a_number_is_an_error(compare, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match=message):
        compare()


def test_equality_and_hash_are_identity_for_dict_and_set_keys() -> None:
    m = UOp.variable("m", 0, 9)
    table = {N4K: "n", m: "m", N4K + 1: "n+1"}
    assert table[UOp.variable("n", 1, 4096)] == "n" and table[N4K + 1] == "n+1" and (m + 1) not in table
    assert N4K in {N4K} and N4K in [m, N4K] and N4K != m and not (N4K == m) and N4K != "n" and N4K is not None
    assert N4K.eq(0).op is Ops.CMPEQ and N4K.ne(0).op is Ops.CMPNE
    with pytest.raises(TypeError):
        len(N4K)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        iter(N4K)  # type: ignore[call-overload]


def test_python_division_where_c_division_would_answer_differently_raises() -> None:
    """IDIV/MOD truncate toward zero (C); Python's // and % floor. Where the ranges of the operands show the two may
    differ (a negative dividend, a divisor that can be 0 or negative), the operator raises instead of building C's
    answer: the ceiling idiom -(-n // 128) would silently be n // 128 (for n = 200: 1, not 2)."""
    n = UOp.variable("n", 1, 4096)
    x = UOp.variable("x", -100, 100)
    with pytest.raises(TypeError, match=r"-n // 128: Python's // floors, the graph's IDIV truncates toward zero"
                                        r".*the dividend -n can be -4096..-1 and the divisor is 128.*\(n \+ 127\) // 128"):
        -(-n // 128)
    with pytest.raises(TypeError, match=r"x % 3: .* the dividend x can be -100..100"):
        x % 3
    with pytest.raises(TypeError, match=r"n // x: the divisor can be 0 for x in \[-100, 100\]"):
        n // x
    with pytest.raises(TypeError, match=r"n // \(-x - 101\): .*the divisor -x - 101 can be -201..-1"):
        n // (-x - 101)
    with pytest.raises(TypeError, match=r"7 // -2: .*the dividend is 7 and the divisor is -2"):
        UOp.const(dtypes.int32, 7) // -2
    # where the two agree: sizes (dividend >= 0, divisor >= 1), one sign on both sides, a divisor of +-1
    assert ((n + 127) // 128).evaluate({"n": 200}) == 2 and (n % 7).evaluate({"n": 200}) == 4
    assert ((-n) // -3).evaluate({"n": 7}) == 2 == (-7) // -3
    assert (x // 1).evaluate({"x": -7}) == -7 and (x // -1).evaluate({"x": -7}) == 7
    assert x.alu(Ops.IDIV, 2).evaluate({"x": -7}) == -3  # C's division, asked for explicitly
    assert ((n - n % 128) // 128).evaluate({"n": 300}) == 2  # x - x % c is never below 0 for x >= 0
    f = UOp.variable("f", 0, 10).cast(dtypes.float32)
    assert (f // 2.0).op is Ops.IDIV  # floats are not checked
