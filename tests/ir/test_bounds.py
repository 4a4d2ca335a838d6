"""Value ranges (mtlir.ir.bounds): exact on simple expressions, sound on random ones (every value the expression takes
at values inside the variables' bounds lies in the range), and the dispatch-size checks built on them."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtlir.ir.bounds import BoundsError, WrapError, bounds, exact_bounds, expr_text, single_value
from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import DeviceSpec, Kernel, KernelParam
from mtlir.ir.ops import Ops
from mtlir.passes import lower
from mtlir.passes.encode.commands import EncodeError
from mtlir.frontend.nodes import QueueError, buffer
from mtlir.frontend.queue import Queue
from mtlir.ir.uop import UOp

N = UOp.variable("n", 1, 32)
M = UOp.variable("m", -8, 8)
i32, u32, u64 = dtypes.int32, dtypes.uint32, dtypes.uint64
K = Kernel("k", "k", "", (KernelParam(None, 0),))


@pytest.mark.parametrize("expr, lo, hi", [
    (N, 1, 32), (N - 5, -4, 27), ((N + 31) // 32, 1, 1), (N % 7 + 1, 1, 7), ((N - 5).maximum(1), 1, 27),
    (N * M, -256, 256), (-M, -8, 8), (N << 2, 4, 128), (N >> 1, 0, 16), (N & 3, 0, 3), (M.alu(Ops.IDIV, 3), -2, 2),
    (M.alu(Ops.MOD, 3), -2, 2), (N.minimum(M), -8, 8), ((N < 3).where(N, 7), 1, 32), (N < 40, 1, 1), (N.eq(0), 0, 0),
    (UOp.const(u32, 5) - 6, 0, 2**32 - 1),            # wraps: the whole range of the dtype
    ((N - 5).cast(u64), 0, 2**64 - 1),                # a negative value cast to unsigned wraps
    ((N + 1).cast(u64), 2, 33), (UOp.const(dtypes.int8, 100) + N, -128, 127),
    (N.alu(Ops.IDIV, N - 16), -32, 32),                         # division by a range through 0 leaves out the undefined 0
])
def test_ranges(expr: UOp, lo: int, hi: int) -> None:
    assert bounds(expr) == (lo, hi)
    assert (expr.vmin, expr.vmax) == (lo, hi)


def test_exact_bounds_agree_where_nothing_wraps() -> None:
    for expr in (N - 5, (N + 31) // 32, N * M, -M, N << 2, N & 3, M.alu(Ops.MOD, 3), (N < 3).where(N, 7), N < 40,
                 (N + 1).cast(u64), (N - N % 4), UOp.variable("m", 1, 65536).cast(dtypes.int64) * 65536,
                 UOp.const(u32, 2**32 - 1) + 0, M.bitcast(u32)):
        assert exact_bounds(expr) == bounds(expr), expr_text(expr)


_BIG = UOp.variable("m", 1, 65536)


@pytest.mark.parametrize("expr, message, hint", [
    (_BIG * 65536, r"^m \* 65536 can be 4294967296, above int32's largest value 2147483647 \(its range without "
                   r"wrapping is \[65536, 4294967296\]\)$", r"compute it in int64 \(m.cast\(dtypes.int64\) first\)"),
    ((_BIG * 65536).alu(Ops.IDIV, 2) + 1, r"^m \* 65536 can be 4294967296", "int64"),  # the innermost node is named
    (_BIG << 16, r"^m << 16 can be 4294967296", "int64"),
    (_BIG + (2**31 - 1), r"^m \+ 2147483647 can be 2147549183", "int64"),
    # -INT_MIN
    (-(UOp.variable("k", -8, 7) * 2**28), r"^-\(k \* 268435456\) can be 2147483648, above int32's largest", "int64"),
    (UOp.const(u32, 5) - N, r"^5 - n can be -27, below uint32's smallest value 0", r"compute it in int64"),
    (N.cast(u64) * 2**60, r"^n \* 1152921504606846976 can be 36893488147419103232, above uint64's",
     r"no integer dtype is wider than uint64: narrow the variables' bounds"),
    ((N - 5).cast(u64), r"^the cast of n - 5 to uint64 can be -4, below uint64's smallest value 0",
     "the cast would wrap silently"),
    (UOp.variable("m", 0, 300, dtypes.int64).cast(dtypes.uint8), r"^the cast of m to uint8 can be 300", "narrow"),
    (UOp(Ops.CONST, i32, (), 2**31), r"^2147483648 can be 2147483648, above int32's", "int64"),
    (UOp.const(i32, 1) << N, r"^1 << n: the shift count n can be 32, outside \[0, 32\) \(undefined in C\)",
     r"keep the count in \[0, 32\)"),
])
def test_exact_bounds_refuse_a_node_that_would_wrap(expr: UOp, message: str, hint: str) -> None:
    with pytest.raises(WrapError, match=message) as e:
        exact_bounds(expr)
    assert e.value.hint and __import__("re").search(hint, e.value.hint), e.value.hint
    assert isinstance(e.value, BoundsError)


def test_a_division_of_a_wrapped_value_names_the_wrap() -> None:
    with pytest.raises(TypeError, match=r"^\(m \* 65536\) // 2: m \* 65536 can be 4294967296, above int32's largest "
                                        r"value 2147483647 .* for m in \[1, 65536\]; int32 arithmetic would wrap"):
        (_BIG * 65536) // 2  # noqa: B018 (used to blame the signs of the wrapped range)
    assert (_BIG.cast(dtypes.int64) * 65536 // 2).vmax == 2**31


def test_not_arithmetic_is_an_error_naming_the_node() -> None:
    with pytest.raises(BoundsError, match=r"BUFFER<float32\*> cannot be computed"):
        bounds(UOp(Ops.BUFFER, dtypes.float32.ptr(), (), 4).index(0).load())
    with pytest.raises(BoundsError, match="CONST<float32>"):
        bounds(UOp.const(dtypes.float32, 1.0))


def test_expr_text() -> None:
    assert expr_text((N + 31) // 32) == "(n + 31) // 32"
    assert expr_text((N - 5).cast(u64)) == "n - 5"
    assert expr_text((N < 3).where(N, 7)) == "(n < 3) ? n : 7"


_OPS = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.MIN, Ops.AND, Ops.OR, Ops.XOR, Ops.IDIV, Ops.MOD, Ops.SHL,
        Ops.SHR, Ops.CMPLT, Ops.CMPNE]
A, B = UOp.variable("a", -50, 50), UOp.variable("b", 0, 3000)


def _expr(dt: DType) -> st.SearchStrategy[UOp]:
    leaf = st.sampled_from([A.cast(dt), B.cast(dt)]) | st.integers(-70, 70).map(lambda v: UOp.const(dt, v))

    def extend(children: st.SearchStrategy[UOp]) -> st.SearchStrategy[UOp]:
        def build(t: tuple[Ops, UOp, UOp]) -> UOp:
            op, x, y = t
            if op in (Ops.SHL, Ops.SHR):
                y = y & 7
            out = x.alu(op, y)
            return out.cast(dt) if out.dtype is not dt else out
        binary = st.tuples(st.sampled_from(_OPS), children, children).map(build)
        where = st.tuples(children, children, children).map(lambda t: (t[0] < 0).where(t[1], t[2]))
        return binary | where | children.map(lambda x: -x) | children.map(lambda x: x.cast(dtypes.int8).cast(dt))
    return st.recursive(leaf, extend, max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([i32, dtypes.int64, u32, dtypes.uint8]).flatmap(_expr), st.integers(-50, 50),
       st.integers(0, 3000))
def test_random_expressions_stay_in_their_range(e: UOp, a: int, b: int) -> None:
    lo, hi = bounds(e)
    try:
        assert exact_bounds(e) == (lo, hi)  # where nothing can wrap, the strict form gives the same range
    except WrapError:
        pass
    try:
        v = e.evaluate({"a": a, "b": b})
    except ZeroDivisionError:
        return  # C leaves it undefined: no value to check
    assert lo <= v <= hi, (expr_text(e), v, lo, hi)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([i32, dtypes.int64, u32, dtypes.uint8]).flatmap(_expr), st.integers(-50, 50),
       st.integers(0, 3000))
def test_a_single_value_is_the_value_at_every_binding(e: UOp, a: int, b: int) -> None:
    # bool(), int() and range() of a UOp return single_value's answer: it must hold for every value of the variables
    for node in (e, e < 0):
        try:
            v = node.evaluate({"a": a, "b": b})
        except ZeroDivisionError:
            continue  # C leaves it undefined (and single_value of such an expression without variables raises)
        found, value = single_value(node)
        if found:
            assert value == v and type(value) is type(v), (expr_text(node), v, value)
            assert bool(node) is bool(v) and int(node) == int(v)
        else:
            with pytest.raises(TypeError, match=r"bool\(\) of the .* expression"):
                bool(node)


def test_single_value() -> None:
    assert single_value(N < 40) == (True, True) and single_value((N + 31) // 32) == (True, 1)
    assert single_value(UOp.const(i32, 7) * 6) == (True, 42) and single_value(N.eq(0)) == (True, False)
    assert single_value(N // 2) == (False, None) and single_value(N - N) == (False, None)  # not tight: no value
    assert single_value(UOp(Ops.BUFFER, dtypes.float32.ptr(), (), 4).index(0).load()) == (False, None)
    assert single_value(UOp.const(dtypes.float32, 1.5) + 1.0) == (True, 2.5)


# ---- sizes that can fall below 1 or exceed 2**32-1 are refused, naming the command, the axis and the bounds


@pytest.mark.parametrize("grid, message", [
    ((N - 5,), r"command 0 \(k\): grid.x: size n - 5 can be -4, below 1 \(for n in \[1, 32\]\)"),
    ((1, N % 4), r"command 0 \(k\): grid.y: size n % 4 can be 0, below 1"),
    ((1, 1, N.cast(dtypes.int64) * 2**28), r"grid.z: size n \* 268435456 can be 8589934592, above 2\*\*32-1"),
    ((2**32,), r"grid.x: size 4294967296 is above 2\*\*32-1"),
])
def test_queue_refuses_sizes_outside_1_to_2_32(grid: tuple[UOp | int, ...], message: str) -> None:
    with pytest.raises(QueueError, match=message):
        Queue(DeviceSpec()).exec(K, [buffer("x", 64)], [], grid=grid)
    with pytest.raises(QueueError, match=message.replace("grid", "threadgroup")):
        Queue(DeviceSpec()).exec(K, [buffer("x", 64)], [], grid=(1,), threadgroup=grid)


def test_queue_accepts_sizes_that_stay_in_range() -> None:
    Queue(DeviceSpec()).exec(K, [buffer("x", 64)], [], grid=((N - 5).maximum(1), (N + 31) // 32, N % 4 + 1))


@pytest.mark.parametrize("icb", [True, False])
def test_encode_refuses_a_hand_built_size_that_can_fall_below_1(icb: bool) -> None:
    kernel = UOp(Ops.KERNEL, dtypes.void, (), K)
    grid = UOp.struct(dtypes.MTLSize, (N - 5).cast(u64), 1, 1)
    ex = UOp(Ops.EXEC, dtypes.void, (kernel, grid, UOp.struct(dtypes.MTLSize, 32, 1, 1), buffer("x", 64)))
    g = UOp(Ops.SUBMIT, dtypes.void, (ex,), DeviceSpec("Apple7", icb=icb))
    with pytest.raises(EncodeError, match=r"command 0 \(k\): grid.x: size n - 5 can be -4, below 1 "
                                          r"\(for n in \[1, 32\]\)"):
        lower(g, target="arm64")
