"""Bad input to the two text parsers (issue 13, "Bad input, everywhere"): the IR's text form (``mtlir.ir.render.parse``,
docs/ir.md) and pipeline strings (``PassPipeline.parse``, docs/lowering.md). Hypothesis writes any text, and
mutates real texts (a rendered queue graph, the default pipeline): the only errors allowed are ``ParseError`` and
``PipelineError`` (both ``InputError``), never another exception and never a hang; what parses must render back.
"""
from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtlir.errors import InputError
from mtlir.ir.render import ParseError, parse, render
from mtlir.passes.pipeline import PassPipeline, PipelineError

from msl_library import LIBRARY
from no_hang import no_hang


def _queue_text() -> str:
    """The text form of a small queue graph of the fuzzing's kernels: a view, a variable, a wait, a signal."""
    from mtlir.frontend.nodes import buffer, timeline_value, view
    from mtlir.frontend.queue import Queue
    from mtlir.ir.uop import UOp
    n = UOp.variable("n", 1, 64)
    a, b = buffer("a", 256), buffer("b", 256)
    step = timeline_value()
    q = Queue()
    q.wait(q.timeline, step - 1)
    q.exec(LIBRARY[0].kernel, [a, view(b, 16, 128)], [n], grid=((n + 31) // 32,), threadgroup=(32,))
    q.signal(q.timeline, step)
    return render(q.submit())


QUEUE_TEXT = _queue_text()
PIPELINE = "encode,barriers,abi{target=arm64},linearize"
TOKENS = ["UOp", "(", ")", ",", "=", "Ops.", "EXEC", "SUBMIT", "dtypes.", "uint64", "int32", ".ptr()", "x0", "x1",
          "Obj", "Kernel", "KernelParam", "DeviceSpec", "float('nan')", "frozenset({", "})", "-", "1e999", "2**64",
          "99999999999999999999999", "'", '"', "\\", "\n", " ", "\x00", "(" * 50, "[", "]", "{", "}", "lambda", ":"]


def parse_checked(text: str) -> None:
    """``parse``: a ``ParseError`` or a graph that renders back to a text that parses to the same graph."""
    try:
        with no_hang(what="parse"):
            g = parse(text)
    except ParseError as e:
        assert isinstance(e, InputError) and str(e)
        return
    assert parse(render(g)) is g


@settings(max_examples=max(200, settings().max_examples), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=80) | st.lists(st.sampled_from(TOKENS), max_size=30).map("".join))
def test_parse_any_text(text: str) -> None:
    parse_checked(text)


@settings(max_examples=max(300, settings().max_examples), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(at=st.integers(0, 10**6), cut=st.integers(0, 12), insert=st.sampled_from(TOKENS) | st.text(max_size=6))
def test_parse_mutated_graph(at: int, cut: int, insert: str) -> None:
    """The text of a real queue graph with a few characters cut out and something put in their place."""
    i = at % (len(QUEUE_TEXT) + 1)
    parse_checked(QUEUE_TEXT[:i] + insert + QUEUE_TEXT[i + cut:])


# a long run of signs overflowed the parser's stack: MemoryError escaped parse (a regression, found by this fuzzing)
@pytest.mark.parametrize("text", ["x = UOp(" * 400 + ")" * 400, "x = " + "-" * 100000 + "1",
                                  "x = UOp(Ops.CONST, dtypes.int32, (), 1)\n" * 2 + "y = x",
                                  "x = UOp(Ops.CONST, dtypes.int32, (), " + "(" * 200 + ")" * 200 + ")",
                                  "\x00", "x = UOp(Ops.CONST, dtypes.int32, (), 10**10**10)"])
def test_parse_pathological(text: str) -> None:
    """Deep nesting, a null byte, a power tower: refused as a ParseError, quickly."""
    parse_checked(text)


def pipeline_checked(text: str, start: str = "queue") -> None:
    """``PassPipeline.parse``: a ``PipelineError`` or a pipeline whose string parses back to an equal one."""
    try:
        with no_hang(what="PassPipeline.parse"):
            p = PassPipeline.parse(text, start)
    except PipelineError as e:
        assert isinstance(e, InputError) and str(e)
        return
    again = PassPipeline.parse(str(p), start)
    assert str(again) == str(p)


PIPELINE_TOKENS = ["encode", "barriers", "abi", "symbolic", "linearize", "{", "}", ",", "=", "target", "arm64",
                   "x86_64", "max-range", "max_range", "16384", "-1", "0", "2**64", "1e9", " ", "\t", "nope", "{}"]


@settings(max_examples=max(300, settings().max_examples), deadline=None)
@given(text=st.text(max_size=40) | st.lists(st.sampled_from(PIPELINE_TOKENS), max_size=12).map("".join),
       start=st.sampled_from(["queue", "messages", "calls", "program"]))
def test_pipeline_any_text(text: str, start: str) -> None:
    pipeline_checked(text, start)


@settings(max_examples=max(200, settings().max_examples), deadline=None)
@given(at=st.integers(0, 10**6), cut=st.integers(0, 6), insert=st.sampled_from(PIPELINE_TOKENS))
def test_pipeline_mutated(at: int, cut: int, insert: str) -> None:
    i = at % (len(PIPELINE) + 1)
    pipeline_checked(PIPELINE[:i] + insert + PIPELINE[i + cut:])


def test_pipeline_not_a_string() -> None:
    for bad in (None, 3, b"encode", ["encode"]):
        with pytest.raises(PipelineError):
            PassPipeline.parse(bad)  # type: ignore[arg-type]


