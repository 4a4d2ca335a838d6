"""mtlir.passes: the lowering of queue graphs to Programs, one module per pass.

``lower(graph, target="arm64")`` runs the default pipeline ``encode,lower-timeline,symbolic,abi{target=…},linearize``
and returns a ``Lowered`` (``.program``, ``.stages``, ``.timings``, ``.diagnostics``). ``PASSES`` maps each pass
name to its class; ``Pipeline.parse(text)`` reads a pipeline string. docs/lowering.md describes every pass.

>>> from mtlir.frontend.trace import load_trace
>>> trace = load_trace("examples/traces/mlp.apple7.json")
>>> print(lower(trace.queue(), target="arm64").program.listing())
"""
from __future__ import annotations

from typing import TextIO

from mtlir.metal import TARGETS
from mtlir.passes.abi import Abi, AbiError
from mtlir.passes.encode.encode import Encode, EncodeError
from mtlir.passes.linearize import Linearize, LinearizeError
from mtlir.passes.pipeline import (PASSES, STAGES, Lowered, Pass, PassContext, PassTiming, Pipeline, PipelineError,
                                   graph_stage, register)
from mtlir.passes.symbolic import Symbolic, simplify
from mtlir.passes.timeline import LowerTimeline, timeline_read_program
from mtlir.passes.verify import VerifyError
from mtlir.ir.uop import UOp

__all__ = ["lower", "default_pipeline", "DEFAULT_PIPELINE", "Lowered", "Pipeline", "Pass", "PassContext", "PASSES",
           "PassTiming", "register", "PipelineError", "VerifyError", "EncodeError", "AbiError", "LinearizeError",
           "Encode", "LowerTimeline", "Symbolic", "Abi", "Linearize", "simplify", "timeline_read_program", "STAGES",
           "graph_stage"]

DEFAULT_PIPELINE = "encode,lower-timeline,symbolic,abi{target=arm64},linearize"


def default_pipeline(target: str = "arm64", start: str = "queue") -> Pipeline:
    """The default pipeline for ``target`` (``arm64`` or ``x86_64``) from a graph of stage ``start``: from a queue
    graph ``encode,lower-timeline,symbolic,abi{target=…},linearize``; from typed messages the same without encode
    (e.g. the timeline read); from calls ``symbolic,linearize``. Raises ``PipelineError`` for another target."""
    if target not in TARGETS:
        raise PipelineError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")
    if start == "calls":
        return Pipeline((Symbolic(), Linearize()), start)
    passes = (LowerTimeline(), Symbolic(), Abi(target), Linearize())
    return Pipeline((Encode(), *passes) if start == "queue" else passes, start)


def lower(graph: UOp, target: str | None = None, pipeline: str | Pipeline | None = None, *,
          print_after_all: bool = False, keep_stages: bool = True, out: TextIO | None = None) -> Lowered:
    """Lower a queue graph (a SUBMIT, e.g. ``Trace.queue(device)`` or ``Queue.submit()``) to a Program.

    ``target``: ``arm64`` or ``x86_64`` (default: the pipeline's abi target, else arm64). ``pipeline``: a pipeline
    string or ``Pipeline`` (default: ``default_pipeline(target)``). ``print_after_all`` prints every stage to
    ``out`` (default stderr); ``keep_stages`` keeps them in ``Lowered.stages`` (for pictures).

    The graph's stage (``graph_stage``: a queue graph, typed messages, or calls) is where the pipeline starts: a
    pipeline string is parsed for it, a ``Pipeline`` must start there, and without a pipeline the default one
    starts there.

    Raises ``PipelineError`` for a bad pipeline, one that does not start at the graph's stage, or a ``target`` that
    disagrees with the pipeline's ``abi{target=…}``; ``EncodeError`` naming the command for a queue that cannot be
    lowered; ``AbiError`` naming selector and argument; ``VerifyError`` naming the pass and the node of a malformed
    stage."""
    if not isinstance(graph, UOp):
        raise PipelineError(f"lower takes a queue graph (a UOp), got {type(graph).__name__}")
    stage = graph_stage(graph)
    if pipeline is None:
        pipe = default_pipeline(target or "arm64", stage)
    else:
        pipe = Pipeline.parse(pipeline, stage) if isinstance(pipeline, str) else pipeline
        if pipe.start != stage:
            raise PipelineError(f"the pipeline {pipe} starts from stage {pipe.start!r}, but the graph is at stage "
                                f"{stage!r} (mtlir.passes.graph_stage)")
        abi_target = pipe.option("abi", "target")
        if target is not None and abi_target is not None and abi_target != target:
            raise PipelineError(f"the pipeline lowers for abi{{target={abi_target}}} but the target is {target}")
        if target is not None and target not in TARGETS:
            raise PipelineError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")
    return pipe.run(graph, print_after_all=print_after_all, keep_stages=keep_stages, out=out)
