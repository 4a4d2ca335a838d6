"""``mtlir opt FILE -p PIPELINE`` (mlir-opt and xdsl-opt's style): read a graph in the text form
(``mtlir.ir.render``: one ``xN = UOp(...)`` assignment per node, the graph last), run the passes of ``PIPELINE``
(a pass pipeline string, ``mtlir.passes.pipeline``) from the stage the graph is in (a queue graph, typed messages
or C calls: ``graph_stage``), and print the result in the text form (a Program as its listing, with its ICB
tables). ``FILE`` ``-`` reads stdin; a trace (JSON, ``mtlir.frontend.trace``) is read as its queue graph, so
``mtlir opt TRACE.json -p encode`` prints encode's output in the text form, which ``opt`` reads back.
``--print-after-all`` prints every stage to stderr. This is what the golden
tests of single passes run: input text in, expected text out (``tests/cli/golden/``).
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from mtlir.cli.report import EXIT_MATCH, UsageError

if TYPE_CHECKING:
    from mtlir.ir.uop import UOp as UOpT

__all__ = ["run_opt", "cmd_opt"]


def _stage_ops() -> frozenset[object]:
    """The ops that put a graph in a stage passes take (``graph_stage``)."""
    from mtlir.ir.ops import Ops
    return frozenset({Ops.SUBMIT, Ops.MSG, Ops.MSGS, Ops.CALL, Ops.CALLS})


def run_opt(text: str, pipeline: str, *, print_after_all: bool = False, log: TextIO | None = None) -> str:
    """``text`` (a graph in the text form, or a trace's JSON: its queue graph) after the passes of ``pipeline``, in
    the text form (a Program: its listing and ICB tables, ``mtlir.program.tables.describe``). Raises
    ``ParseError`` for text that is not a graph's, ``TraceError`` for a trace that is not valid, ``PipelineError`` for a pipeline that cannot run on its stage, and what the passes raise."""
    from mtlir.ir.render import parse, render
    from mtlir.ir.uop import UOp
    from mtlir.passes.pipeline import PassPipeline, graph_stage
    from mtlir.program.tables import describe
    graph = _trace_graph(text) if text.lstrip().startswith("{") else parse(text)
    ops = {u.op for u in graph.toposort()}
    if not ops & _stage_ops():  # graph_stage would call it typed messages: it is no stage at all
        names = ", ".join(sorted(o.name for o in ops))
        raise UsageError(f"the graph holds no queue, command or message nodes (SUBMIT, MSG, MSGS, CALL, CALLS), only "
                         f"{names}: there is nothing for the passes to lower")
    pipe = PassPipeline.parse(pipeline, start=graph_stage(graph))
    lowered = pipe.run(graph, print_after_all=print_after_all, keep_stages=False, out=log)
    result = lowered.result
    return render(result).rstrip("\n") if isinstance(result, UOp) else describe(result)


def _trace_graph(text: str) -> UOpT:
    """The queue graph of a trace given as JSON text (``TraceError`` naming the field when it is not one)."""
    from mtlir.frontend.trace import loads_trace
    return loads_trace(text, "FILE").queue()


def cmd_opt(args: argparse.Namespace, out: TextIO, log: TextIO) -> int:
    """``mtlir opt``: read ``args.file``, run ``args.pipeline``, print the result on ``out``."""
    try:
        text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"FILE {args.file}: cannot read the graph: {getattr(e, 'strerror', None) or e}") from None
    print(run_opt(text, args.pipeline, print_after_all=args.print_after_all, log=log), file=out)
    return EXIT_MATCH
