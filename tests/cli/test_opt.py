"""``mtlir opt FILE -p PIPELINE`` (issue 15): a graph in the text form in, the passes run, the result in the text form
out. Golden tests of single passes: each file of ``golden/`` is the previous one after one pass (queue -> encode ->
abi{target=arm64} -> linearize), so a change in one pass shows in exactly one file."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from mtlir.cli.main import main
from mtlir.cli.opt import run_opt
from mtlir.ir.render import parse, render
from mtlir.metal import DeviceSpec
from mtlir.passes import lower
from lowering_cases import small_queue

GOLDEN = Path(__file__).resolve().parent / "golden"
STEPS = [("queue.txt", "encode", "encode.txt"), ("encode.txt", "abi{target=arm64}", "abi-arm64.txt"),
         ("abi-arm64.txt", "linearize", "linearize.txt")]


def _opt(*argv: str) -> tuple[int, str, str]:
    out, log = io.StringIO(), io.StringIO()
    return main(["opt", *argv], out=out, log=log), out.getvalue(), log.getvalue()


@pytest.mark.parametrize("src,pipeline,expected", STEPS)
def test_one_pass_golden(src: str, pipeline: str, expected: str) -> None:
    code, out, log = _opt(str(GOLDEN / src), "-p", pipeline)
    assert code == 0, log
    assert out == (GOLDEN / expected).read_text()


def test_the_golden_input_is_the_queue_the_tests_build() -> None:
    """queue.txt is small_queue(Apple7, symbolic) in the text form, and the chain of single passes ends in the
    Program the whole pipeline makes."""
    q = small_queue(DeviceSpec("Apple7"), symbolic=True)
    assert parse((GOLDEN / "queue.txt").read_text()) is q
    assert (GOLDEN / "linearize.txt").read_text().startswith(lower(q, target="arm64").program.listing())


def test_a_pipeline_of_several_passes_and_a_pass_that_changes_nothing() -> None:
    encoded = (GOLDEN / "encode.txt").read_text()
    assert run_opt(encoded, "symbolic") + "\n" == encoded  # nothing to fold: printed as it was read
    assert run_opt((GOLDEN / "queue.txt").read_text(), "encode,abi{target=arm64}") + "\n" == \
        (GOLDEN / "abi-arm64.txt").read_text()
    assert parse(run_opt(encoded, "symbolic")) is parse(encoded)


def test_opt_reads_stdin_and_prints_after_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((GOLDEN / "encode.txt").read_text()))
    code, out, log = _opt("-", "-p", "abi{target=arm64}", "--print-after-all")
    assert code == 0 and out == (GOLDEN / "abi-arm64.txt").read_text()
    assert "// -----// IR after abi{target=arm64} //----- //" in log and "objc_msgSend [%" in log


def test_opt_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    code, _, log = _opt(str(GOLDEN / "queue.txt"), "-p", "linearize")
    assert code == 2 and "run encode, abi{target=...} before it" in log
    bad = tmp_path / "bad.txt"
    bad.write_text("import os\n")
    code, _, log = _opt(str(bad), "-p", "encode")
    assert code == 2 and log.count("\n") == 1
    code, _, log = _opt(str(tmp_path / "missing.txt"), "-p", "encode")
    assert code == 2 and "FILE" in log and "cannot read the graph" in log
    assert render(parse((GOLDEN / "queue.txt").read_text())) == (GOLDEN / "queue.txt").read_text()


def test_opt_reads_a_trace_and_reads_its_own_output_back(tmp_path: Path) -> None:
    """A trace is read as its queue graph, and what opt prints is text opt reads: encode, then abi and linearize on
    encode's output, gives the Program the whole pipeline gives."""
    from mtlir.cli.opt import run_opt
    trace = (Path(__file__).resolve().parents[2] / "examples" / "traces" / "mlp.apple7.json").read_text()
    encoded = run_opt(trace, "encode")
    assert encoded.startswith("x0 = UOp(") and "Ops.MSG" in encoded
    assert run_opt(encoded, "abi{target=arm64},linearize") == run_opt(trace, "encode,abi{target=arm64},linearize")


def test_a_graph_of_no_stage_is_named_so(tmp_path: Path) -> None:
    """A CONST under a SINK was said to be at the "typed messages (MSG)" stage: it holds no node any pass takes."""
    g = tmp_path / "const.txt"
    g.write_text("x0 = UOp(Ops.CONST, dtypes.int32, (), 1)\nx1 = UOp(Ops.SINK, dtypes.void, (x0,))\n")
    for pipeline in ("encode", "linearize"):
        code, out, log = _opt(str(g), "-p", pipeline)
        assert code == 2 and out == "" and "typed messages" not in log
        assert "holds no queue, command or message nodes (SUBMIT, MSG, MSGS, CALL, CALLS), only CONST, SINK" in log
