"""render / parse / listing: the canonical text form round-trips to the very same graph, and parse runs no code."""
from __future__ import annotations

import dataclasses
import enum
import math
import struct
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from conftest import graphs

from mtlir import DType, Ops, ParseError, StructDType, UOp, dtypes, listing, parse, register_arg_type, render
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj, Prototype, Signature
from mtlir.ir.render import arg_text, namespace, short_arg

i32 = dtypes.int32


def roundtrip(g: UOp) -> str:
    text = render(g)
    assert parse(text, verify=False) is g  # any graph, well-formed or not (the random graphs are not)
    assert render(parse(text, verify=False)) == text
    ns = namespace()
    exec(text, ns)  # the text is plain Python too
    assert ns[f"x{len(g.toposort()) - 1}"] is g
    return text


SPECIAL_FLOATS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 5e-324, -1.7976931348623157e308, 0.1, 1e22,
                  struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000ABC))[0]]
SPECIAL_STRINGS = ["", "'", '"', "'\"", "\\", "ends with \\", "a\nb\r\tc", "\x00\x7f", "ünïcödé ☃", "\ud800",
                   "setKernelBuffer:offset:atIndex:", "x0 = UOp(Ops.CONST)", "__import__('os')"]


def test_every_arg_type_round_trips() -> None:
    msl = ('kernel void k(device float* a [[buffer(0)]], constant int& n [[buffer(1)]]) {\n'
           '  a[0] = 1.0f; // "quoted" \\ \n}\n')
    kernel = Kernel("E_1", "k", msl, (KernelParam(None, 0, "float32", 4), KernelParam("n", 1, "int32")))
    args = [None, True, False, 0, 1, -1, 2**100, -(2**200), *SPECIAL_FLOATS, *SPECIAL_STRINGS, b"", bytes(range(256)),
            (), (1,), (1, (2.0, ("x", None)), True), frozenset(), frozenset({1, "a", None, 2.5}), Ops.ADD,
            dtypes.float32, dtypes.voidptr, dtypes.MTLSize.ptr(), dtypes.int8.ptr().ptr(), StructDType("P", ("a", "b")),
            DType("odd", 3, "3s", "uint"), kernel, Obj("pipeline", "pipeline:E_1", (kernel,)), Obj("queue", "queue"),
            Prototype(dtypes.void, (dtypes.id, dtypes.SEL, dtypes.MTLSize.ptr())), Signature(dtypes.bool, ()),
            DeviceSpec("apple7", residency_set=False), (Obj("buffer", "buffer:1", (64,)), DeviceSpec())]
    nodes = [UOp(Ops.NOOP, dtypes.void, (), a) for a in args] + [UOp(Ops.NOOP, dtypes.void, (), 1, tag=a) for a in args]
    # all distinct (0.0 / -0.0, True / 1, ...) but for the two NaNs (one node, as arg and as tag) and the node of
    # arg 1 with tag None, built twice
    assert len(set(nodes)) == len(nodes) - 3
    text = roundtrip(UOp.sink(*nodes))
    assert "float('nan')" in text and "float('-inf')" in text and "-0.0" in text


def test_nan_bits_and_zero_signs_survive() -> None:
    g = UOp.sink(UOp.const(dtypes.float32, -0.0), UOp.const(dtypes.float32, 0.0))
    back = parse(render(g))
    assert [math.copysign(1, s.arg) for s in back.src] == [-1.0, 1.0]
    nan = parse(render(UOp.const(dtypes.float64, float("nan"))))
    assert nan.arg != nan.arg


def test_shared_nodes_are_printed_once() -> None:
    x = UOp.variable("x", 0, 10)
    shared = x * 2
    g = UOp.sink(shared + shared, shared, UOp.sink(shared))
    text = roundtrip(g)
    assert len(text.splitlines()) == len(g.toposort()) == 6
    assert text.count("Ops.MUL") == 1 and "(x2, x2)" in text
    assert text.splitlines()[0] == "x0 = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ('x', 0, 10))"


def test_the_text_is_canonical() -> None:
    a = UOp.sink(UOp.variable("a", 0, 1) + 1, UOp(Ops.NOOP, arg=frozenset({"q", "b", "zz", "a"})))
    assert render(a) == render(a)
    assert "frozenset({'a', 'b', 'q', 'zz'})" in render(a)
    assert render(UOp(Ops.BUFFER, dtypes.float32.ptr(), (), 64, tag="buffer:0")) == \
        "x0 = UOp(Ops.BUFFER, dtypes.float32.ptr(), (), 64, tag='buffer:0')\n"
    assert render(UOp(Ops.NOOP, tag=1)) == "x0 = UOp(Ops.NOOP, dtypes.void, (), None, tag=1)\n"
    assert arg_text(-0.0) == "-0.0" and arg_text((1,)) == "(1,)" and arg_text(float("inf")) == "float('inf')"


@settings(max_examples=120, deadline=None)
@given(graphs())
def test_random_graphs_of_every_op_round_trip(g: UOp) -> None:
    roundtrip(g)


def test_every_op_round_trips() -> None:
    x = UOp.variable("x", 0, 10)
    nodes = [UOp(op, dtypes.int32 if i % 2 else dtypes.void, (x,) * (i % 4), (op.name, i)) for i, op in enumerate(Ops)]
    roundtrip(UOp.sink(*nodes))


# ---- registered arg types

class Mode(enum.Enum):
    FAST = 1
    SAFE = 2


class Pair(NamedTuple):
    first: int
    second: float


class Items(tuple):  # type: ignore[type-arg]
    __slots__ = ()


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    sizes: tuple[int, ...] = ()
    mode: Mode = Mode.FAST


def test_registered_arg_types_round_trip() -> None:
    for cls in (Mode, Pair, Items, Spec):
        assert register_arg_type(cls) is cls
        assert register_arg_type(cls) is cls  # again: a no-op
    g = UOp.sink(*(UOp(Ops.NOOP, dtypes.void, (), a) for a in (Mode.SAFE, Pair(1, -0.0), Pair(1, 0.0),
                                                                 Items((Pair(2, 1.5), "s")), Spec("a", (1, 2), Mode.SAFE))))
    text = roundtrip(g)
    assert "Mode.SAFE" in text and "Pair(first=1, second=-0.0)" in text and "Items((Pair(first=2" in text


def test_register_arg_type_refuses_bad_classes() -> None:
    @dataclasses.dataclass
    class Mutable:
        a: int

    with pytest.raises(TypeError, match="frozen dataclass"):
        register_arg_type(Mutable)
    with pytest.raises(TypeError, match="not a class"):
        register_arg_type(3)  # type: ignore[arg-type]

    @dataclasses.dataclass(frozen=True)
    class Kernel:  # same name as mtlir.metal.Kernel
        a: int

    with pytest.raises(ValueError, match="another class named 'Kernel'"):
        register_arg_type(Kernel)


def test_an_unregistered_arg_type_is_a_clear_error() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unknown:
        a: int

    with pytest.raises(TypeError, match=r"node x0 \(Ops.NOOP\).*register_arg_type"):
        render(UOp.sink(UOp(Ops.NOOP, arg=Unknown(1))))


# ---- parse refuses anything else

@pytest.mark.parametrize("text, message", [
    ("import os\n", "only assignments"),
    ("print(1)\n", "only assignments"),
    ("x0 = 1\n", "must be UOp"),
    ("x0 = __import__('os')\n", "must be UOp"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), __import__('os'))\n", "not a constructor"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), open('/etc/passwd').read())\n", "only calls of known constructors"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), (lambda: 1)())\n", "only calls of known constructors"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), Ops.__class__)\n", "only Ops.NAME"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), [1, 2])\n", "List is not allowed"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), 1 + 2)\n", "BinOp is not allowed"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), float('1e400'))\n", "float"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), x9)\n", "'x9' is not a node defined on an earlier line"),
    ("x0 = UOp(Ops.NOPE, dtypes.void)\n", "Ops has no member 'NOPE'"),
    ("x0 = UOp(Ops.NOOP, dtypes.int33)\n", "dtypes has no dtype 'int33'"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (1,))\n", "source 0 is a int"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), **{})\n", "kwargs"),
    ("UOp = UOp(Ops.NOOP)\n", "constructor name"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), -'a')\n", "number only"),
    ("x0 = UOp(Ops.NOOP, dtypes.void, (), Kernel(1, 2, 3, 4, 5, 6))\n", "Kernel"),
    ("x0 = UOp(Ops.NOOP\n", "not valid Python"),
    ("", "no assignment"),
    ("x0 = UOp(Ops.CONST, dtypes.int32, (), 1)\nx1 = UOp(Ops.NOOP, dtypes.void, (), exec)\n", "line 2"),
])
def test_parse_refuses_anything_but_constructors(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse(text)


def test_parse_accepts_hand_written_text() -> None:
    text = ("a = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ('n', 1, 32))\n"
            "one = UOp(Ops.CONST, dtypes.int32, (), +1)\n"
            "# a comment\n"
            "s = UOp(Ops.ADD, dtypes.int32, src=(a, one))\n")
    assert parse(text) is UOp.variable("n", 1, 32) + 1


# ---- listing and repr

def test_listing() -> None:
    x = UOp.variable("x", 0, 10)
    g = UOp.sink((x + 3) * x, UOp(Ops.MSG, dtypes.void, (x,), "setKernelBuffer:offset:atIndex:", tag="enc"))
    assert listing(g).splitlines() == [
        "%0 = DEFINE_VAR int32  ('x', 0, 10)",
        "%1 = CONST int32  3",
        "%2 = ADD int32 %0, %1",
        "%3 = MUL int32 %2, %0",
        "%4 = MSG void %0  'setKernelBuffer:offset:atIndex:'  tag='enc'",
        "%5 = SINK void %3, %4"]
    named = listing(g, names=lambda u: "the sink" if u.op is Ops.SINK else None)
    assert named.splitlines()[-1] == "%5 = SINK void %3, %4  # the sink"


def test_short_arg_cuts_long_values() -> None:
    kernel = Kernel("E_1", "k", "kernel void k(device float* a) {}\n//" + "x" * 5000,
                    (KernelParam(None, 0),))
    text = short_arg(Obj("pipeline", "pipeline:E_1", (kernel,)), 60)
    assert len(text) <= 60 and text.startswith("Obj(kind='pipeline'") and text.endswith("…")
    assert "msl" not in short_arg(kernel, 200)  # a field left out of repr stays out
    assert short_arg("a" * 100, 20) == "'aaaaaaaaaaaaaaaaa…'" and len(short_arg("a" * 100, 20)) == 20
    assert short_arg(("a" * 100,), 40) == "('aaaaaaaaaaaaaaaaa…',)"  # a field gets half the width
    assert short_arg((1, 2), 20) == "(1, 2)"


# ---- parse checks what UOp(...) does not (mtlir/ir/spec.py), naming the line

@pytest.mark.parametrize("text, message", [
    ("x0 = UOp(Ops.CONST, dtypes.int32, (), 1)\nx0 = UOp(Ops.CONST, dtypes.int32, (), 2)\n",
     "line 2, column 1: 'x0' is assigned twice (first on line 1)"),
    ("x0 = UOp(Ops.CONST, dtypes.int32, (), 99999999999999999999999)\n",
     "line 1, column 1: x0: CONST<int32> 99999999999999999999999 does not fit its dtype [-2147483648, 2147483647]"),
    ("x0 = UOp(Ops.CONST, dtypes.int32, (), 1.5)\n", "line 1, column 1: x0: CONST<int32> 1.5 is a float, not an int"),
    ("x0 = UOp(Ops.CONST, dtypes.bool, (), 1)\n", "x0: CONST<bool> 1 is a int, not a bool"),
    ("x0 = UOp(Ops.CONST, dtypes.float32, (), 1.5)\nx1 = UOp(Ops.ADD, dtypes.int32, (x0, x0))\n",
     "line 2, column 1: x1: ADD<int32> of sources float32, float32: an integer and a float do not mix"),
    ("x0 = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ('n', 10, 1))\n", "line 1, column 1: x0: variable 'n': min 10 > max 1"),
    ("x0 = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ('n', 1, 1099511627776))\n",
     "x0: variable 'n': bounds [1, 1099511627776] do not fit its dtype int32"),
    ("x0 = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ('n', 1, 4))\nx1 = UOp(Ops.ADD, dtypes.int32, (x0,))\n",
     "line 2, column 1: x1: ADD takes 2 sources, has 1"),
    ("x0 = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ('n', 1, 4))\nx1 = UOp(Ops.CMPLT, dtypes.bool, (x0, x0))\n"
     "x2 = UOp(Ops.WHERE, dtypes.int32, (x0, x0, x0))\n", "line 3, column 1: x2: WHERE's condition is bool, not int32"),
    ("x0 = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ('n', 1, 4))\nx1 = UOp(Ops.CAST, dtypes.int64, (x0, x0))\n",
     "line 2, column 1: x1: a CAST has one source, has 2"),
])
def test_parse_refuses_ill_formed_nodes_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(ParseError) as e:
        parse(text)
    assert message in str(e.value)
    if "assigned twice" not in message:
        assert parse(text, verify=False).op in (Ops.CONST, Ops.ADD, Ops.DEFINE_VAR, Ops.WHERE, Ops.CAST)


def test_parse_accepts_well_formed_value_graphs() -> None:
    n = UOp.variable("n", 1, 1024)
    g = ((n + 1) * 2).cast(dtypes.int64).__lt__(UOp.const(dtypes.int64, 7)).where(n, n - 1)
    assert parse(render(g)) is g


# ---- parse reads line by line (session 6, finding 10): the same graphs and errors, no syntax tree of the text

_PLAIN_LINE = "x0 = UOp(Ops.CONST, dtypes.int32, (), 1)\n"


@pytest.mark.parametrize("text, message", [
    (_PLAIN_LINE + "x1 = UOp(Ops.ADD, dtypes.int32, (x0))\n", "line 2, column 6: UOp(...)"),  # (x0) is no tuple
    (_PLAIN_LINE + "None = UOp(Ops.CONST, dtypes.int32, (), 2)\n", "line 2: not valid Python"),
    (_PLAIN_LINE + "x1 = UOp(Ops.CONST, dtypes.int32, (), 007)\n", "line 2: not valid Python"),
    (_PLAIN_LINE + "x1 = UOp(Ops.ADD, dtypes.int32,\n    (x0, x0))\nx2 = UOp(Ops.ADD, dtypes.int32, (x1, x9))\n",
     "line 4, column"),  # after a statement of two lines, the lines are still counted from the top
    (_PLAIN_LINE + "x1 = UOp(Ops.ADD, dtypes.int32, (x0, x0))\nx2 = UOp(Ops.ADD, dtypes.int32, (x0,\n",
     "line 3: not valid Python"),
    ("\n\n" + _PLAIN_LINE + "x1 = UOp(Ops.ADD, dtypes.int32, (x0, x0))\n" + _PLAIN_LINE,
     "line 5, column 1: 'x0' is assigned twice (first on line 3)"),
    (_PLAIN_LINE + "x1 = UOp(Ops.ADD, dtypes.int32, (x0, x0), 'a')\nx2 = UOp(Ops.CONST, dtypes.int8, (), 300)\n",
     "line 3, column 1: x2: CONST<int8> 300 does not fit its dtype"),
])
def test_parse_line_by_line_keeps_pythons_rules_and_the_line_numbers(text: str, message: str) -> None:
    with pytest.raises(ParseError) as e:
        parse(text)
    assert message in str(e.value), str(e.value)


def test_parse_reads_statements_over_several_lines_crlf_and_semicolons() -> None:
    x = UOp.const(dtypes.int32, 1)
    g = UOp(Ops.NOOP, dtypes.void, (x + x,), "a\nb", tag=("t", 1))
    text = render(g)
    assert parse(text.replace("\n", "\r\n")) is g
    assert parse(text.replace(", (x1,)", ",\n  (x1,)\n ")) is g  # a statement over three lines
    assert parse(text.replace("\n", ";", 1)) is g  # two statements on a line
    assert parse(_PLAIN_LINE + "x1 = UOp(Ops.ADD, dtypes.int32, (x0, x0,))\n") is x + x  # a trailing comma
    assert parse(_PLAIN_LINE + "x1 = UOp(Ops.NOOP, dtypes.void, (x0,), '''a\nb''')\n").arg == "a\nb"


def test_parse_holds_no_syntax_tree_of_the_whole_text() -> None:
    """100,000 lines took 10 s and ~1 GB (a syntax tree of the whole text, ~10 KB per line, kept while the graph
    was built); line by line the peak is the graph itself and one line."""
    import tracemalloc
    c = UOp.variable("n", 0, 10)
    for _ in range(4000):
        c = c + 1
    text = render(c)
    tracemalloc.start()
    try:
        got = parse(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got is c
    assert peak < 4000 * 1500, f"{peak / 4000:.0f} bytes per line"  # the whole text's tree was ~10,000 per line
