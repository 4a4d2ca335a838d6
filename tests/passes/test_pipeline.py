"""Pipelines: the string parses into passes and prints back; the registry; lower()'s options (print_after_all,
stages, timings, the target check); verifiers after each pass name the pass and the node."""
from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any, Literal, Optional

import pytest
from lowering_cases import small_queue

from mtlir.ir.dtypes import dtypes
from mtlir.metal import DeviceSpec
from mtlir.ir.ops import Ops
from mtlir.passes import DEFAULT_PIPELINE, default_pipeline, lower
from mtlir.passes.abi import Abi
from mtlir.passes.encode.encode import Encode
from mtlir.passes.linearize import Linearize
from mtlir.passes.pipeline import PASSES, Pass, PassContext, PassPipeline, PipelineError, register
from mtlir.passes.symbolic import Symbolic
from mtlir.passes.verify import VerifyError
from mtlir.program.instructions import Alu, Range
from mtlir.program.program import Program
from mtlir.ir.uop import UOp


@pytest.mark.parametrize("text", [
    DEFAULT_PIPELINE,
    "encode,symbolic,abi{target=x86_64},linearize",
    "encode{max-range=4},symbolic,abi{target=arm64},linearize",
    "encode",
])
def test_pipeline_strings_print_back_identically(text: str) -> None:
    assert str(PassPipeline.parse(text)) == text
    assert str(PassPipeline.parse("symbolic,symbolic", start="messages")) == "symbolic,symbolic"


def test_parse_builds_the_passes_with_their_options() -> None:
    p = PassPipeline.parse("encode{max-range=4},abi{target=x86_64}")
    assert p.passes == (Encode(max_range=4), Abi("x86_64"))
    assert p.option("abi", "target") == "x86_64" and p.option("linearize", "target") is None
    assert str(PassPipeline.parse("encode{max-range=16384}")) == "encode"  # a default prints as nothing
    assert str(PassPipeline.parse(" encode , abi{ target=arm64 } ")) == "encode,abi{target=arm64}"
    assert default_pipeline("x86_64") == PassPipeline.parse(DEFAULT_PIPELINE.replace("arm64", "x86_64"))


def test_registry_names_every_pass() -> None:
    assert set(PASSES) >= {"encode", "symbolic", "abi", "linearize"}
    for name, cls in PASSES.items():
        assert cls.name == name and cls.__doc__


@pytest.mark.parametrize("text, message", [
    ("", "empty pipeline"),
    ("encode,frobnicate", "unknown pass 'frobnicate'"),
    ("abi", "abi"),  # target is required
    ("abi{target=ppc}", "unknown target 'ppc'"),
    ("abi{arch=arm64}", "pass 'abi' has no option 'arch'"),
    ("encode{max-range=many}", "expected an integer, got 'many'"),
    ("encode{max-range=0}", "max-range 0 must be in [1, 16384]"),
    ("encode{max-range}", "must be written key=value"),
    ("encode,,symbolic", "cannot read a pass"),
    ("encode;symbolic", "expected ','"),
    ("encode,", "ends with ','"),
    # braces: where the problem is, not an error from deep inside a pass's constructor
    ("abi{target=arm64,linearize", "unclosed '{' at character 3 (the options of pass 'abi')"),
    ("encode,abi{target=arm64", "unclosed '{' at character 10"),
    ("abi{{target=x86_64}}", "unexpected '{' at character 4"),
    ("encode{max-range=4,symbolic,abi{target=arm64},linearize",
     "unclosed '{' at character 6 (the options of pass 'encode'): another '{' opens at character 31"),
    ("encode},symbolic", "unexpected '}' at character 6"),
    ("{target=arm64}", "unexpected '{' at character 0"),
    ("abi{target=x86_64 target=arm64}", "pass 'abi': option 'target' is given twice"),
    ("abi", "pass 'abi' needs option target (e.g. abi{target=...})"),
    # each pass gets the stage it takes
    ("encode,encode", "pass 'encode' (pass 2 of the pipeline) takes a queue graph (SUBMIT), but it would get typed "
                      "messages (MSG, what encode produces): it must come before pass 1 (encode)"),
    ("symbolic,encode,abi{target=arm64},linearize", "pass 'symbolic' (pass 1 of the pipeline) takes typed messages "
                                                    "(MSG, what encode produces) or C calls (CALL, what abi produces), "
                                                    "but it would get a queue graph (SUBMIT): run encode before it"),
    ("linearize", "pass 'linearize' (pass 1 of the pipeline) takes C calls (CALL, what abi produces), but it would get "
                  "a queue graph (SUBMIT): run encode, abi{target=...} before it"),
    ("encode,linearize", "pass 'linearize' (pass 2 of the pipeline) takes C calls"),
    ("encode,abi{target=arm64},lower-timeline", "unknown pass 'lower-timeline'"),  # folded into timeline_read
    ("encode,abi{target=arm64},abi{target=arm64}", "it must come before pass 2 (abi{target=arm64})"),
    (DEFAULT_PIPELINE + ",symbolic", "pass 'symbolic' (pass 5 of the pipeline) comes after linearize"),
])
def test_bad_pipelines_are_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(PipelineError) as e:
        PassPipeline.parse(text)
    assert message in str(e.value)


def test_lower_keeps_stages_times_passes_and_prints_after_all() -> None:
    out = io.StringIO()
    g = small_queue(DeviceSpec("Apple7"), symbolic=True)
    lowered = lower(g, target="x86_64", print_after_all=True, out=out)
    assert [name for name, _ in lowered.stages] == ["input", "encode", "barriers", "abi", "linearize"]
    assert lowered.stages[0][1] is g and isinstance(lowered.stages[-1][1], Program)
    assert lowered.stages[-1][1] is lowered.program
    assert [t.name for t in lowered.timings] == [name for name, _ in lowered.stages[1:]]
    assert all(t.seconds >= 0 and t.verify_seconds >= 0 for t in lowered.timings)
    assert lowered.seconds == pytest.approx(sum(t.seconds + t.verify_seconds for t in lowered.timings))
    text = out.getvalue()
    for header in ("encode", "barriers", "abi{target=x86_64}", "linearize"):
        assert f"// -----// IR after {header} //----- //" in text
    assert "[encoder executeCommandsInBuffer:withRange: icb, 0, 3]" in text and "unchanged" not in text
    assert str(lowered.pipeline) == "encode,barriers,abi{target=x86_64},linearize"
    assert not any(lowered.unchanged(i) for i in range(len(lowered.stages)))
    assert lower(g, target="x86_64", keep_stages=False).stages == []


def test_a_stage_a_pass_left_as_it_was_says_unchanged() -> None:
    """symbolic has nothing to fold after encode: it returns the very graph, which the stages, ``Lowered.unchanged``
    and --print-after-all (its header only) say; the Program is the default pipeline's."""
    out = io.StringIO()
    g = small_queue(DeviceSpec("Apple7"), symbolic=True)
    lowered = lower(g, pipeline="encode,symbolic,abi{target=arm64},linearize", print_after_all=True, out=out)
    assert [lowered.unchanged(i) for i in range(len(lowered.stages))] == [False, False, True, False, False]
    assert lowered.stages[2][1] is lowered.stages[1][1]
    text = out.getvalue()
    after_symbolic = text.split("// -----// IR after symbolic (unchanged) //----- //\n")[1]
    assert after_symbolic.startswith("// -----// IR after abi{target=arm64} //----- //")
    assert text.count("(unchanged)") == 1 and "// -----// IR after symbolic //" not in text
    assert lowered.program.listing() == lower(g, target="arm64").program.listing()


def test_print_after_all_goes_to_stderr_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    lower(small_queue(DeviceSpec("Apple9")), print_after_all=True)
    captured = capsys.readouterr()
    assert captured.out == "" and "IR after encode" in captured.err


def test_lower_checks_the_target_against_the_pipeline() -> None:
    g = small_queue(DeviceSpec("Apple9"))
    assert lower(g, pipeline=DEFAULT_PIPELINE.replace("arm64", "x86_64")).program.target == "x86_64"
    assert lower(g, target="x86_64", pipeline=DEFAULT_PIPELINE.replace("arm64", "x86_64")).program.target == "x86_64"
    with pytest.raises(PipelineError, match="abi{target=arm64} but the target is x86_64"):
        lower(g, target="x86_64", pipeline=DEFAULT_PIPELINE)
    with pytest.raises(PipelineError, match="unknown target"):
        lower(g, target="sparc")
    with pytest.raises(PipelineError, match="takes a queue graph"):
        lower("not a graph")  # type: ignore[arg-type]


def test_a_partial_pipeline_has_no_program() -> None:
    lowered = lower(small_queue(DeviceSpec("Apple9")), pipeline="encode,symbolic")
    assert isinstance(lowered.result, UOp) and lowered.result.op is Ops.SINK
    with pytest.raises(PipelineError, match="did not produce a Program"):
        lowered.program
    with pytest.raises(PipelineError, match="comes after linearize"):
        lower(small_queue(DeviceSpec("Apple9")), pipeline=DEFAULT_PIPELINE + ",symbolic")


def test_the_graph_stage_is_where_the_pipeline_starts() -> None:
    from mtlir.passes.pipeline import graph_stage
    from mtlir.passes.timeline import timeline_read_program
    from mtlir.passes.timeline import timeline_read
    g = small_queue(DeviceSpec("Apple9"))
    encoded = lower(g, pipeline="encode").result
    assert isinstance(encoded, UOp)
    assert graph_stage(g) == "queue" and graph_stage(encoded) == "messages"
    assert graph_stage(timeline_read(DeviceSpec())) == "messages"
    calls = lower(encoded, pipeline="abi{target=arm64}").result  # a string is parsed for the graph's stage
    assert isinstance(calls, UOp) and graph_stage(calls) == "calls"
    assert isinstance(lower(calls).result, Program)  # the default pipeline from calls: linearize
    assert lower(encoded, target="x86_64").program.target == "x86_64"
    with pytest.raises(PipelineError, match="takes typed messages .* but it would get C calls .*: the graph is past "
                                            "it"):
        lower(calls, pipeline="abi{target=arm64},linearize")
    with pytest.raises(PipelineError, match="starts from stage 'queue', but the graph is at stage 'messages'"):
        lower(encoded, pipeline=default_pipeline("arm64"))
    with pytest.raises(PipelineError, match="takes a queue graph"):
        PassPipeline((Abi("arm64"), Encode()), start="messages")
    assert "timeline" in timeline_read_program(DeviceSpec("Apple7"), "x86_64").results


def test_the_default_pipeline_folds_only_a_graph_that_has_something_to_fold() -> None:
    """From typed messages or C calls (graphs built by other means) symbolic runs first where one of its rules
    rewrites a node, and nowhere else; the Program is what symbolic run everywhere would give."""
    from mtlir.passes.timeline import timeline_read
    assert default_pipeline("arm64", timeline_read(DeviceSpec("Apple7"))) == \
        PassPipeline((Abi("arm64"), Linearize()), start="messages")
    encoded = lower(small_queue(DeviceSpec("Apple7"), symbolic=True), pipeline="encode").result
    assert isinstance(encoded, UOp)
    n = next(u for u in encoded.toposort() if u.op is Ops.DEFINE_VAR and u.arg[0] == "n")
    padded = _substitute(encoded, n, n + 0)  # n + 0 everywhere n was: symbolic folds it back
    assert str(default_pipeline("x86_64", encoded)) == "abi{target=x86_64},linearize"
    assert default_pipeline("x86_64", padded).passes[0] == Symbolic()
    assert lower(padded, target="x86_64").program.listing() == lower(encoded, target="x86_64").program.listing()
    calls = lower(padded, pipeline="abi{target=arm64}").result
    assert isinstance(calls, UOp)
    assert str(default_pipeline("arm64", calls)) == "symbolic,linearize"
    folded = lower(calls, pipeline="symbolic").result
    assert isinstance(folded, UOp) and str(default_pipeline("arm64", folded)) == "linearize"


@register
@dataclass(frozen=True)
class _BreakOneMessage(Pass):
    """A test pass that gives the first computeCommandEncoder message a non-object receiver."""

    name = "test-break-receiver"

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        bad = next(u for u in graph.toposort() if u.op is Ops.MSG and u.arg == "computeCommandEncoder")
        broken = bad.replace(src=(UOp.const(dtypes.uint64, 7), *bad.src[1:]))
        return graph.substitute({bad: broken}) if hasattr(graph, "substitute") else _substitute(graph, bad, broken)


def _substitute(root: UOp, old: UOp, new: UOp) -> UOp:
    memo: dict[UOp, UOp] = {old: new}
    for u in root.toposort():
        if u not in memo:
            memo[u] = u.replace(src=tuple(memo[s] for s in u.src))
    return memo[root]


def test_verifier_names_the_pass_and_the_node() -> None:
    with pytest.raises(VerifyError) as e:
        lower(small_queue(DeviceSpec("Apple9")), pipeline="encode,test-break-receiver")
    assert e.value.pass_name == "test-break-receiver"
    assert e.value.node is not None and e.value.node.arg == "computeCommandEncoder"
    text = str(e.value)
    assert text.startswith("after pass 'test-break-receiver': the receiver of 'computeCommandEncoder' is a uint64")
    assert "<-- here" in text  # the neighbourhood is reprinted with the node marked


def test_verifier_after_encode_refuses_leftover_queue_ops() -> None:
    from mtlir.passes.verify import verify_graph
    g = small_queue(DeviceSpec("Apple9"))
    with pytest.raises(VerifyError, match="after pass 'encode': KERNEL is a queue op, which encode lowers"):
        verify_graph(UOp.sink(g.src[0], arg=g.arg), "encode")
    with pytest.raises(VerifyError, match="the root after encode is a SINK whose arg is the DeviceSpec"):
        verify_graph(UOp.sink(UOp.const(dtypes.int32, 1)), "encode")
    lowered = lower(g, pipeline="encode")
    with pytest.raises(VerifyError, match="after pass 'abi': MSG 'commandBuffer' is left after abi"):
        verify_graph(lowered.result, "abi")  # type: ignore[arg-type]


@pytest.mark.parametrize("node, message", [
    (UOp(Ops.ADD, dtypes.int32, (UOp.variable("n", 1, 8), UOp.const(dtypes.float32, 1.5))),
     "ADD<int32> of sources int32, float32: an integer and a float do not mix"),
    (UOp(Ops.CONST, dtypes.int32, (), 2.5), "CONST<int32> 2.5 is a float, not an int"),
    (UOp(Ops.CONST, dtypes.uint8, (), 300), "CONST<uint8> 300 does not fit its dtype [0, 255]"),
    (UOp(Ops.CMPLT, dtypes.bool, (UOp.variable("n", 1, 8), UOp.const(dtypes.float32, 1.5))),
     "CMPLT compares a int32 with a float32"),
    (UOp(Ops.NEG, dtypes.int32, ()), "NEG takes 1 source, has 0"),
    (UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("n", 1, 2**40)), "variable 'n': bounds [1, 1099511627776] do not fit"),
])
def test_verifier_checks_value_nodes_a_rule_may_make(node: UOp, message: str) -> None:
    """SPEC (passes/verify.py) runs mtlir/ir/spec.py's rules after every pass: a rule that returns an ill-typed
    value node is named with the pass."""
    from mtlir.passes.verify import verify_graph
    with pytest.raises(VerifyError) as e:
        verify_graph(UOp.sink(node), "mypass")
    assert "after pass 'mypass'" in str(e.value) and message in str(e.value)


def test_verifier_in_a_pipeline_walks_new_nodes_but_still_sees_leftovers_in_old_subgraphs() -> None:
    # inside checked_once a node verified after an earlier pass is not walked again, but an MSG left under an old
    # node (a pass that kept it) is still found, and so is a bad old root
    from mtlir.passes.verify import checked_once, verify_graph
    encoded = lower(small_queue(DeviceSpec("Apple9")), pipeline="encode").result
    assert isinstance(encoded, UOp)
    with checked_once():
        verify_graph(encoded, "encode")
        kept = UOp.sink(encoded, UOp.const(dtypes.int32, 7), arg=encoded.arg)  # new root, old subgraph
        with pytest.raises(VerifyError, match="after pass 'abi': MSG 'commandBuffer' is left after abi"):
            verify_graph(kept, "abi")
        with pytest.raises(VerifyError, match="after pass 'abi': MSG 'commandBuffer' is left after abi"):
            verify_graph(encoded, "abi")  # the old root itself
        verify_graph(kept, "linearize-free-stage")  # no postcondition: the old subgraph is not walked again


def test_linearize_verifier_checks_the_program() -> None:
    from mtlir.passes.verify import verify_program
    p = lower(small_queue(DeviceSpec("Apple9"))).program
    verify_program(p)
    bad = Program([Alu(1, Ops.ADD, dtypes.int32, (0, 0))], 2)
    with pytest.raises(VerifyError, match="instruction 0 .*reads r0 before anything defines it"):
        verify_program(bad)
    unclosed = Program([Range(1, 0, 5)], 2, consts={0: 3})
    with pytest.raises(VerifyError, match="RANGE without END"):
        verify_program(unclosed)
    assert isinstance(Linearize().apply(lower(small_queue(DeviceSpec("Apple9")), pipeline="encode,abi{target=arm64}")
                                        .result, PassContext()), Program)  # type: ignore[arg-type]


def test_verify_queue_checks_hand_built_queue_graphs() -> None:
    from mtlir.metal import Obj
    from mtlir.passes.verify import verify_queue
    from mtlir.frontend.nodes import buffer
    g = small_queue(DeviceSpec("Apple7"), symbolic=True, timestamps=True)
    verify_queue(g)
    ex, x = g.src[1], buffer("x", 8192)
    cases = [
        (g.replace(arg="Apple7"), "a SUBMIT's arg is the DeviceSpec"),
        (g.replace(src=(*g.src, UOp.const(dtypes.int32, 1))), "a SUBMIT's sources are queue ops, not CONST"),
        (g.replace(src=(ex.replace(src=ex.src[:-1]),)), "kernel 'saxpy' takes 2 buffers and 1 variables"),
        (g.replace(src=(UOp(Ops.TIMESTAMP, dtypes.void, (), -1),)), "a TIMESTAMP's arg is its slot"),
        (g.replace(src=(UOp(Ops.SIGNAL, dtypes.void, (UOp(Ops.OBJECT, dtypes.id, (), Obj("fence", "fence")),
                                                      UOp.const(dtypes.uint64, 1))),)), "the event placeholder"),
        (g.replace(src=(ex.replace(src=(*ex.src[:3], UOp(Ops.BUFFER_VIEW, dtypes.id, (x,), (8000, 256)),
                                        *ex.src[4:])),)), "the view [8000, 8256) runs past the end"),
        (UOp.sink(g, UOp.const(dtypes.int32, 1)), "a queue graph is a SUBMIT (or a SINK of SUBMITs: several queues), "
                                                   "not SINK"),
    ]
    for bad, message in cases:
        with pytest.raises(VerifyError) as e:
            verify_queue(bad)
        assert e.value.pass_name == "input" and message in str(e.value), str(e.value)


def test_every_public_callable_of_the_core_and_the_passes_has_a_docstring() -> None:
    """Public functions, classes and methods of mtlir/ (but the CLI) and passes/ say what they do."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    missing = []
    for path in sorted([*root.glob("mtlir/**/*.py"), *root.glob("passes/**/*.py")]):
        if "cli" in path.relative_to(root).parts:
            continue
        stack: list[tuple[ast.AST, str]] = [(ast.parse(path.read_text()), "")]
        while stack:
            node, prefix = stack.pop()
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, (ast.FunctionDef, ast.ClassDef)) and not ch.name.startswith("_"):
                    if ast.get_docstring(ch) is None:
                        missing.append(f"{path.relative_to(root)}:{ch.lineno} {prefix}{ch.name}")
                    if isinstance(ch, ast.ClassDef):
                        stack.append((ch, f"{prefix}{ch.name}."))
    assert missing == []


def test_print_after_all_spells_out_the_messages_and_the_icb_commands() -> None:
    """Issue 15: the MSGS/CALLS nodes print their messages and the ICB placeholder its command table, not
    ``MessageList(<8 messages>)`` / ``CommandList(<2 commands>)``; the Program's listing is followed by the table."""
    out = io.StringIO()
    lower(small_queue(DeviceSpec("Apple7"), symbolic=True), target="arm64", print_after_all=True, out=out)
    text = out.getvalue()
    after_encode = text.split("// -----// IR after abi")[0]
    assert "; messages of %" in after_encode and "waitForFence: %" in after_encode
    assert "executeCommandsInBuffer:withRange: %" in after_encode
    assert "; ICB icb: 3 commands" in after_encode and "patched per submit" in after_encode
    after_abi = text.split("// -----// IR after abi{target=arm64} //----- //")[1].split("// -----// IR after lin")[0]
    assert "objc_msgSend [%" in after_abi and "waitForFence: %" in after_abi
    after_linearize = text.split("// -----// IR after linearize //----- //")[1]
    assert "; ICB icb: 3 commands" in after_linearize and "pipeline:saxpy" in after_linearize


@register
@dataclass(frozen=True)
class _RaisingPass(Pass):
    """A test pass whose rewrite rule raises a KeyError on the first message."""

    name = "test-raise-in-rule"

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        from mtlir import PatternMatcher, UPat, graph_rewrite
        def boom(m: UOp) -> UOp:
            raise KeyError("boom")
        return graph_rewrite(graph, PatternMatcher([(UPat(Ops.MSG, name="m"), boom)]), name=self.name)


def test_an_exception_a_pass_raises_keeps_its_type_and_names_the_pass_the_rule_and_the_node() -> None:
    with pytest.raises(KeyError) as e:  # not wrapped: a caller's ``except KeyError`` still works
        lower(small_queue(DeviceSpec("Apple9")), pipeline="encode,test-raise-in-rule")
    assert type(e.value) is KeyError and e.value.args == ("boom",)
    notes = getattr(e.value, "__notes__", [])
    assert len(notes) == 3, notes
    assert notes[0].startswith("in rule _RaisingPass.apply.<locals>.boom at ") and "test_pipeline.py:" in notes[0]
    assert "matching UOp(Ops.MSG, dtypes." in notes[0]
    assert notes[1] == "in graph_rewrite 'test-raise-in-rule'"
    assert notes[2] == "in pass 'test-raise-in-rule' (pass 2 of 2 of pipeline 'encode,test-raise-in-rule')"


# ---- options converted by their annotation (session 6, finding 7)

@register
@dataclass(frozen=True)
class _OptionsPass(Pass):
    """A test pass with an option of every kind a pipeline string can give."""

    name = "test-options"
    scale: float = 1.0
    count: int | None = None
    label: Optional[str] = "x"  # the typing spelling is converted too
    flag: bool = False
    mode: Literal["fast", "exact"] = "fast"

    def apply(self, graph: UOp, ctx: PassContext) -> UOp:
        return graph


def test_options_are_converted_by_their_annotation_and_print_back() -> None:
    """A float option arrived as the string '0.5', an ``int | None`` as '3', and ``scale=abc`` was accepted."""
    text = "encode,test-options{scale=0.5 count=3 label=none flag=true mode=exact}"
    p = PassPipeline.parse(text).passes[1]
    assert isinstance(p, _OptionsPass)
    assert (p.scale, p.count, p.label, p.flag, p.mode) == (0.5, 3, None, True, "exact")
    assert type(p.scale) is float and type(p.count) is int
    assert str(PassPipeline.parse(text)) == text and PassPipeline.parse(str(PassPipeline.parse(text))) == \
        PassPipeline.parse(text)
    q = PassPipeline.parse("encode,test-options{scale=2 count=none label=hi}").passes[1]
    assert q == _OptionsPass(scale=2.0, count=None, label="hi") and str(q) == "test-options{scale=2.0 label=hi}"
    assert str(_OptionsPass(scale=1e-7)) == "test-options{scale=1e-07}" and PassPipeline.parse(
        "encode," + str(_OptionsPass(scale=1e-7))).passes[1] == _OptionsPass(scale=1e-7)


@pytest.mark.parametrize("option, message", [
    ("scale=abc", "pass 'test-options' option 'scale' is float: expected a finite number, got 'abc'"),
    ("scale=nan", "option 'scale' is float: expected a finite number, got 'nan'"),
    ("count=3.5", "option 'count' is int | None: expected an integer or none, got '3.5'"),
    ("count=None", "option 'count' is int | None: expected an integer or none, got 'None'"),
    ("flag=yes", "option 'flag' is bool: expected true or false, got 'yes'"),
    ("mode=slow", "option 'mode' is Literal['fast', 'exact']: expected one of fast, exact, got 'slow'"),
])
def test_an_option_value_that_does_not_convert_names_the_pass_the_option_and_the_type(option: str,
                                                                                     message: str) -> None:
    with pytest.raises(PipelineError) as e:
        PassPipeline.parse(f"encode,test-options{{{option}}}")
    assert message in str(e.value)


def test_register_refuses_an_option_a_pipeline_string_cannot_give() -> None:
    @dataclass(frozen=True)
    class ListOption(Pass):
        name = "test-list-option"
        sizes: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(PipelineError, match=r"pass 'test-list-option' \(ListOption\): option 'sizes' is "
                                            r"list\[int\], which a pipeline string cannot give"):
        register(ListOption)
    assert "test-list-option" not in PASSES


# ---- the verifier refuses what Metal has no message for, after any pass (session 6, finding 9)

def _rewrite_first(op: Ops, change: Any) -> Any:
    """A pass body replacing the first node of ``op`` that ``change`` turns into another (None: leave it)."""
    def apply(self: Pass, graph: UOp, ctx: PassContext) -> UOp:
        for u in graph.toposort():
            if u.op is op and (new := change(u)) is not None:
                return _substitute(graph, u, new)
        raise AssertionError(f"no {op.name} to change")
    return apply


def _pass(name: str, takes: tuple[str, ...], op: Ops, change: Any) -> None:
    cls = type(name, (Pass,), {"name": name, "takes": takes, "apply": _rewrite_first(op, change),
                               "__module__": __name__})
    register(dataclass(frozen=True)(cls))


def _msgs_commit_x(m: UOp) -> UOp | None:
    ml = m.arg
    if not any(sel == "commit" for sel, _ in ml):
        return None
    return m.replace(arg=type(ml)([("commitX" if sel == "commit" else sel, refs) for sel, refs in ml]))


def _call_sel_retain(c: UOp) -> UOp | None:
    if c.arg[1] != "commandBuffer":
        return None
    return c.replace(src=(c.src[0], UOp(Ops.CONST, dtypes.SEL, (), "retain"), *c.src[2:]))


def _calls_fn_x(c: UOp) -> UOp:
    return c.replace(arg=type(c.arg)([("objc_msgSendX", *e[1:]) for e in c.arg]))


_pass("test-msgs-commitx", ("messages",), Ops.MSGS, _msgs_commit_x)
_pass("test-msg-unknown", ("messages",), Ops.MSG, lambda m: m.replace(arg="fooBar"))
_pass("test-msg-arity", ("messages",), Ops.MSG,
      lambda m: m.replace(src=(*m.src, m.src[0])) if m.arg == "commandBuffer" else None)
_pass("test-call-sel", ("calls",), Ops.CALL, _call_sel_retain)
_pass("test-calls-fn", ("calls",), Ops.CALLS, _calls_fn_x)


@pytest.mark.parametrize("pipeline, op, message", [
    ("encode,barriers,test-msgs-commitx", Ops.MSGS,
     "message 'commitX' of the MSGS: selector 'commitX' is not in the selector table"),
    ("encode,test-msg-unknown", Ops.MSG, "selector 'fooBar' is not in the selector table"),
    ("encode,test-msg-arity", Ops.MSG,
     "MSG 'commandBuffer' has 1 arguments and dtype id; the selector takes 0 and returns id"),
    ("encode,abi{target=arm64},test-call-sel", Ops.CALL,
     "CALL: objc_msgSend of 'commandBuffer': its SEL operand is 'retain', so it would send that instead"),
    ("encode,abi{target=arm64},test-calls-fn", Ops.CALLS,
     "function 'objc_msgSendX' is neither objc_msgSend nor a C function of mtlir.metal.C_FUNCTIONS"),
])
def test_the_verifier_refuses_messages_metal_has_not_after_any_pass(pipeline: str, op: Ops, message: str) -> None:
    """An MSGS entry ``commitX`` passed the verifier after a custom pass (abi refused it later, naming no pass); a
    CALL whose SEL operand names another selector than its arg (the SEL is what is sent) and a CALLS of
    ``objc_msgSendX`` passed it to linearize."""
    name = pipeline.rsplit(",", 1)[1]
    with pytest.raises(VerifyError) as e:
        lower(small_queue(DeviceSpec("Apple9")), pipeline=pipeline)
    assert e.value.pass_name == name and e.value.node is not None and e.value.node.op is op
    assert message in str(e.value) and f"after pass {name!r}" in str(e.value)
