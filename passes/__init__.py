"""mtlir.passes: the lowering of queue graphs to Programs, one module per pass.

``lower(graph, target="arm64")`` runs the default pass pipeline (``default_pipeline``; for a queue graph
``encode,barriers,abi{target=…},linearize``) and returns a ``Lowered`` (``.program``, ``.stages``, ``.timings``,
``.diagnostics``); a Program that uses the timeline carries its lowered timeline read (``Program.timeline_read``).
``PASSES`` maps each pass name to its class (``symbolic`` too, which the default pipeline runs only where it has
work); ``PassPipeline.parse(text)`` reads a pipeline string. docs/lowering.md describes every pass.

>>> from mtlir.frontend.trace import load_trace
>>> trace = load_trace("examples/traces/mlp.apple7.json")
>>> print(lower(trace.queue(), target="arm64").program.listing())
"""
from __future__ import annotations

from typing import TextIO

from mtlir.metal import TARGETS, DeviceSpec
from mtlir.metal import AbiError
from mtlir.passes.abi import Abi
from mtlir.passes.barriers import Barriers
from mtlir.passes.encode.encode import Encode
from mtlir.passes.encode.commands import EncodeError
from mtlir.passes.linearize import Linearize, LinearizeError
from mtlir.passes.pipeline import (PASSES, STAGES, Lowered, Pass, PassContext, PassPipeline, PassTiming, PipelineError,
                                   graph_stage, register)
from mtlir.passes.symbolic import Symbolic, simplifiable, simplify
from mtlir.passes.timeline import timeline_event, timeline_read_program
from mtlir.passes.verify import VerifyError
from mtlir.program.program import Program
from mtlir.ir.uop import UOp

__all__ = ["lower", "default_pipeline", "DEFAULT_PIPELINE", "Lowered", "PassPipeline", "Pass", "PassContext",
           "PASSES", "PassTiming", "register", "PipelineError", "VerifyError", "EncodeError", "AbiError",
           "LinearizeError", "Encode", "Barriers", "Symbolic", "Abi", "Linearize", "simplify", "timeline_read_program", "STAGES",
           "graph_stage"]

DEFAULT_PIPELINE = "encode,barriers,abi{target=arm64},linearize"


def default_pipeline(target: str = "arm64", graph: UOp | None = None) -> PassPipeline:
    """The default pass pipeline for ``target`` (``arm64`` or ``x86_64``) from ``graph`` (default: a queue graph),
    starting at its stage (``graph_stage``), each pass only where the graph has something it changes:

    - from a queue graph: ``encode,barriers,abi{target=…},linearize`` (``barriers``: an ICB command gets
      ``setBarrier`` only where it depends on an earlier one, passes/barriers.py), without ``barriers`` when the
      graph's device has no ICB (``DeviceSpec.icb`` False: the direct path, nothing to place). No ``symbolic``:
      encode simplifies every value it reads with symbolic's rules and builds nothing they fold, so the pass would
      return the graph it was given;
    - from typed messages (a graph built by other means, e.g. ``timeline_read``): ``abi{target=…},linearize``;
    - from C calls: ``linearize``;

    the last two with ``symbolic`` first where ``simplifiable(graph)``. Raises ``PipelineError`` for another
    target."""
    if target not in TARGETS:
        raise PipelineError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")
    stage = "queue" if graph is None else graph_stage(graph)
    if stage == "queue":
        icb = graph is None or not isinstance(graph.arg, DeviceSpec) or graph.arg.icb
        return PassPipeline((Encode(), *((Barriers(),) if icb else ()), Abi(target), Linearize()))
    fold: tuple[Pass, ...] = (Symbolic(),) if graph is not None and simplifiable(graph) else ()
    rest: tuple[Pass, ...] = (Abi(target), Linearize()) if stage == "messages" else (Linearize(),)
    return PassPipeline((*fold, *rest), stage)


def lower(graph: UOp, target: str | None = None, pipeline: str | PassPipeline | None = None, *,
          print_after_all: bool = False, keep_stages: bool = True, out: TextIO | None = None) -> Lowered:
    """Lower a queue graph (a SUBMIT, e.g. ``Trace.queue(device)`` or ``Queue.submit()``) to a Program.

    ``target``: ``arm64`` or ``x86_64`` (default: the pipeline's abi target, else arm64). ``pipeline``: a pipeline
    string or ``PassPipeline`` (default: ``default_pipeline(target, graph)``). ``print_after_all`` prints every
    stage to ``out`` (default stderr); ``keep_stages`` keeps them in ``Lowered.stages`` (for pictures).

    The graph's stage (``graph_stage``: a queue graph, typed messages, or calls) is where the pipeline starts: a
    pipeline string is parsed for it, a ``PassPipeline`` must start there, and without a pipeline the default one
    starts there. A Program that has a queue's timeline gets the Program that reads it, lowered for the same device
    and target: ``Program.timeline_read`` (what the runtime's ``Session`` waits with); the event it reads is the
    Program's timeline (``passes.timeline.timeline_event``: the default queue's, else the first queue's own in the
    SINK's order, never a shared event).

    Raises ``PipelineError`` for a bad pipeline, one that does not start at the graph's stage, or a ``target`` that
    disagrees with the pipeline's ``abi{target=…}``; ``EncodeError`` naming the command for a queue that cannot be
    lowered; ``AbiError`` naming selector and argument; ``VerifyError`` naming the pass and the node of a malformed
    stage."""
    if not isinstance(graph, UOp):
        raise PipelineError(f"lower takes a queue graph (a UOp), got {type(graph).__name__}")
    stage = graph_stage(graph)
    if pipeline is None:
        pipe = default_pipeline(target or "arm64", graph)
    else:
        pipe = PassPipeline.parse(pipeline, stage) if isinstance(pipeline, str) else pipeline
        if pipe.start != stage:
            raise PipelineError(f"the pipeline {pipe} starts from stage {pipe.start!r}, but the graph is at stage "
                                f"{stage!r} (mtlir.passes.graph_stage)")
        abi_target = pipe.option("abi", "target")
        if target is not None and abi_target is not None and abi_target != target:
            raise PipelineError(f"the pipeline lowers for abi{{target={abi_target}}} but the target is {target}")
        if target is not None and target not in TARGETS:
            raise PipelineError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")
    lowered = pipe.run(graph, print_after_all=print_after_all, keep_stages=keep_stages, out=out)
    program = lowered.result
    event = timeline_event(graph, program) if isinstance(program, Program) else None
    if isinstance(program, Program) and event is not None:  # the Program's timeline: passes/timeline.py chooses it
        program.timeline_read = timeline_read_program(program.device, program.target, event)
    return lowered
