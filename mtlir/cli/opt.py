"""``mtlir opt FILE -p PIPELINE`` (mlir-opt and xdsl-opt's style): read a graph in the text form
(``mtlir.ir.render``: one ``xN = UOp(...)`` assignment per node, the graph last), run the passes of ``PIPELINE``
(a pass pipeline string, ``mtlir.passes.pipeline``) from the stage the graph is in (a queue graph, typed messages
or C calls: ``graph_stage``), and print the result in the text form (a Program as its listing, with its ICB
tables). ``FILE`` ``-`` reads stdin. ``--print-after-all`` prints every stage to stderr. This is what the golden
tests of single passes run: input text in, expected text out (``tests/cli/golden/``).
"""
from __future__ import annotations

import argparse
import sys
from typing import TextIO

from mtlir.cli.report import EXIT_MATCH, UsageError

__all__ = ["run_opt", "cmd_opt"]


def run_opt(text: str, pipeline: str, *, print_after_all: bool = False, log: TextIO | None = None) -> str:
    """``text`` (a graph in the text form) after the passes of ``pipeline``, in the text form (a Program: its
    listing and ICB tables, ``mtlir.program.tables.describe``). Raises ``ParseError`` for text that is not a
    graph's, ``PipelineError`` for a pipeline that cannot run on its stage, and what the passes raise."""
    from mtlir.ir.render import parse, render
    from mtlir.ir.uop import UOp
    from mtlir.passes.pipeline import PassPipeline, graph_stage
    from mtlir.program.tables import describe
    graph = parse(text)
    pipe = PassPipeline.parse(pipeline, start=graph_stage(graph))
    lowered = pipe.run(graph, print_after_all=print_after_all, keep_stages=False, out=log)
    result = lowered.result
    return render(result).rstrip("\n") if isinstance(result, UOp) else describe(result)


def cmd_opt(args: argparse.Namespace, out: TextIO, log: TextIO) -> int:
    """``mtlir opt``: read ``args.file``, run ``args.pipeline``, print the result on ``out``."""
    try:
        text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"FILE {args.file}: cannot read the graph: {getattr(e, 'strerror', None) or e}") from None
    print(run_opt(text, args.pipeline, print_after_all=args.print_after_all, log=log), file=out)
    return EXIT_MATCH
