"""Passes, the registry, and pipelines: a pipeline string names passes and their options.

A pass is a small frozen dataclass with a kebab-case ``name`` and its options as fields (xDSL's style). A pipeline
is written ``encode,lower-timeline,symbolic,abi{target=arm64},linearize``: passes separated by commas, options in
braces as ``key=value`` separated by spaces (option names kebab-case; values: words, integers, ``true``/``false``).
``str(Pipeline.parse(text))`` prints it back: options that differ from their defaults, and required options,
always. After every pass its verifier (``passes.verify``) checks the graph for that stage.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import re
import sys
import time
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any, ClassVar, TextIO

from mtlir.program import Program
from mtlir.uop import UOp

__all__ = ["Pass", "PassContext", "PipelineError", "Pipeline", "PASSES", "register", "Lowered", "PassTiming"]


class PipelineError(ValueError):
    """A pipeline string or option that cannot be used; the message names the pass and the option."""


@dataclass
class PassContext:
    """What passes share during one pipeline run: ``diagnostics`` (notes the pipeline keeps, e.g. why a batch
    went on the direct path), counters for fresh names, and the ``target`` of the abi pass once it ran."""

    diagnostics: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    target: str = ""

    def fresh(self, prefix: str) -> int:
        """A number not handed out before for ``prefix`` in this run (0, 1, 2, ...)."""
        n = self.counters.get(prefix, 0)
        self.counters[prefix] = n + 1
        return n


@dataclass(frozen=True)
class Pass:
    """Base of every pass. Subclasses set ``name`` (kebab-case), declare options as dataclass fields, and
    implement ``apply`` (the transformation) and ``verify`` (the checks on its result)."""

    name: ClassVar[str] = ""

    def apply(self, graph: UOp, ctx: PassContext) -> UOp | Program:
        """The transformed graph (or the Program, for ``linearize``)."""
        raise NotImplementedError

    def verify(self, result: UOp | Program) -> None:
        """Check ``result`` is well formed for this stage; raises ``passes.verify.VerifyError``."""
        from mtlir.passes.verify import verify_graph
        if not isinstance(result, UOp):
            raise PipelineError(f"pass {self.name!r} produced a {type(result).__name__}, not a graph")
        verify_graph(result, self.name)

    def options(self) -> dict[str, Any]:
        """The options to print: those differing from their default, and every required option."""
        out = {}
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            has_default = f.default is not dataclasses.MISSING
            if not has_default or val != f.default:
                out[f.name] = val
        return out

    def __str__(self) -> str:
        opts = self.options()
        if not opts:
            return self.name
        return self.name + "{" + " ".join(f"{k.replace('_', '-')}={_format(v)}" for k, v in opts.items()) + "}"


PASSES: dict[str, type[Pass]] = {}


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: add a pass to the registry under its ``name``. Raises ``PipelineError`` for a name used
    twice or not in kebab-case."""
    if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", cls.name or ""):
        raise PipelineError(f"pass class {cls.__name__}: name {cls.name!r} is not kebab-case")
    if cls.name in PASSES and PASSES[cls.name] is not cls:
        raise PipelineError(f"two passes named {cls.name!r}: {PASSES[cls.name].__name__} and {cls.__name__}")
    PASSES[cls.name] = cls
    return cls


def _format(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _convert(text: str, typ: Any, where: str) -> Any:
    typ = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    if typ == "bool":
        if text not in ("true", "false"):
            raise PipelineError(f"{where}: expected true or false, got {text!r}")
        return text == "true"
    if typ == "int":
        try:
            return int(text)
        except ValueError:
            raise PipelineError(f"{where}: expected an integer, got {text!r}") from None
    return text


_ITEM = re.compile(r"\s*([A-Za-z0-9_-]+)\s*(?:\{([^{}]*)\})?\s*")


@dataclass(frozen=True)
class Pipeline:
    """An ordered tuple of passes. ``Pipeline.parse(text)`` reads a pipeline string; ``str(p)`` prints it."""

    passes: tuple[Pass, ...]

    @staticmethod
    def parse(text: str) -> Pipeline:
        """Parse ``text`` (module docstring). Raises ``PipelineError`` naming the unknown pass, option or value."""
        if not isinstance(text, str) or not text.strip():
            raise PipelineError("empty pipeline: expected e.g. 'encode,lower-timeline,symbolic,abi{target=arm64},"
                                "linearize'")
        passes: list[Pass] = []
        pos = 0
        while pos < len(text):
            m = _ITEM.match(text, pos)
            if m is None or m.end() == pos:
                raise PipelineError(f"pipeline {text!r}: cannot read a pass at character {pos}: {text[pos:pos + 20]!r}")
            name, body = m.group(1), m.group(2)
            cls = PASSES.get(name)
            if cls is None:
                raise PipelineError(f"unknown pass {name!r} in pipeline {text!r}: known passes are "
                                    f"{', '.join(sorted(PASSES))}")
            fields = {f.name: f for f in dataclasses.fields(cls)}
            kwargs: dict[str, Any] = {}
            for item in (body or "").replace(",", " ").split():
                key, eq, val = item.partition("=")
                attr = key.replace("-", "_")
                if not eq or not val:
                    raise PipelineError(f"pass {name!r}: option {item!r} must be written key=value")
                if attr not in fields:
                    raise PipelineError(f"pass {name!r} has no option {key!r} (options: "
                                        f"{', '.join(k.replace('_', '-') for k in fields) or 'none'})")
                kwargs[attr] = _convert(val, fields[attr].type, f"pass {name!r} option {key!r}")
            try:
                passes.append(cls(**kwargs))
            except TypeError as e:
                raise PipelineError(f"pass {name!r}: {e}") from None
            except ValueError as e:
                raise PipelineError(f"pass {name!r}: {e}") from None
            pos = m.end()
            if pos < len(text):
                if text[pos] != ",":
                    raise PipelineError(f"pipeline {text!r}: expected ',' at character {pos}")
                pos += 1
                if pos == len(text):
                    raise PipelineError(f"pipeline {text!r}: ends with ','")
        return Pipeline(tuple(passes))

    def __str__(self) -> str:
        return ",".join(str(p) for p in self.passes)

    def option(self, pass_name: str, option: str) -> Any:
        """The value of ``option`` of the first pass named ``pass_name``; None when there is no such pass."""
        for p in self.passes:
            if p.name == pass_name:
                return getattr(p, option.replace("-", "_"))
        return None

    def run(self, graph: UOp, *, print_after_all: bool = False, keep_stages: bool = True,
            out: TextIO | None = None, verify: bool = True) -> Lowered:
        """Run every pass on ``graph`` in order, verifying after each; returns a ``Lowered``.

        ``print_after_all`` prints each stage to ``out`` (default stderr). ``keep_stages`` keeps every stage
        (``("input", graph)`` first). Raises what the passes and verifiers raise (``VerifyError`` names the pass
        and the node)."""
        from mtlir.passes.verify import checked_once
        with _gc_paused(), checked_once():
            return self._run(graph, print_after_all, keep_stages, out, verify)

    def _run(self, graph: UOp, print_after_all: bool, keep_stages: bool, out: TextIO | None,
             verify: bool) -> Lowered:
        from mtlir.passes.verify import stage_text
        ctx = PassContext()
        stages: list[tuple[str, UOp | Program]] = [("input", graph)] if keep_stages else []
        timings: list[PassTiming] = []
        cur: UOp | Program = graph
        stream = out if out is not None else sys.stderr
        for p in self.passes:
            if not isinstance(cur, UOp):
                raise PipelineError(f"pass {p.name!r} comes after linearize, which already produced the Program")
            t0 = time.perf_counter()
            nxt = p.apply(cur, ctx)
            t1 = time.perf_counter()
            if verify:
                p.verify(nxt)
            t2 = time.perf_counter()
            timings.append(PassTiming(p.name, t1 - t0, t2 - t1))
            cur = nxt
            if keep_stages:
                stages.append((p.name, cur))
            if print_after_all:
                print(f"// -----// IR after {p} //----- //", file=stream)
                print(stage_text(cur), file=stream)
        return Lowered(cur, stages, timings, ctx.diagnostics, self)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (reference counting still frees everything): a lowering allocates
    a few small objects per command, and every collection rescans the whole heap, which made the cost per command
    grow with the queue (12 µs at 100,000 commands against 7 µs at 1,000)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(frozen=True)
class PassTiming:
    """Seconds one pass took (``seconds``) and its verifier after it (``verify_seconds``)."""

    name: str
    seconds: float
    verify_seconds: float


@dataclass
class Lowered:
    """The result of a pipeline run: ``result`` (the last stage), ``stages`` (pass name, graph or Program),
    ``timings`` (``PassTiming`` per pass), ``diagnostics`` (notes from the passes) and the ``pipeline``."""

    result: UOp | Program
    stages: list[tuple[str, UOp | Program]]
    timings: list[PassTiming]
    diagnostics: list[str]
    pipeline: Pipeline

    @property
    def program(self) -> Program:
        """The Program; raises ``PipelineError`` when the pipeline did not end with ``linearize``."""
        if not isinstance(self.result, Program):
            raise PipelineError(f"pipeline {self.pipeline} did not produce a Program (it must end with linearize)")
        return self.result

    @property
    def seconds(self) -> float:
        """Total seconds of every pass and verifier."""
        return sum(t.seconds + t.verify_seconds for t in self.timings)
