"""Passes, the registry, and pass pipelines: a pipeline string names passes and their options.

A pass is a small frozen dataclass with a kebab-case ``name`` and its options as fields (xDSL's style). A pass
pipeline (``PassPipeline``; not Metal's pipeline states, which are the kernels' ``pipeline:KEY`` placeholders) is
written ``encode,symbolic,abi{target=arm64},linearize``: passes separated by commas, options in braces as
``key=value`` separated by spaces (option names kebab-case). A value is converted by the option's annotation:
``bool`` (``true``/``false``), ``int``, ``float`` (finite), ``str`` (a word: no space, comma or brace), a
``Literal`` of strings (one of them), or one of these ``| None`` / ``Optional[...]`` (``none`` is None); a value
that does not convert is a ``PipelineError`` naming the pass, the option and its annotation, and ``register``
refuses a pass with an option of any other annotation.
``str(PassPipeline.parse(text))`` prints it back: options that differ from their defaults, and required options,
always. After every pass its verifier (``passes.verify``) checks the graph for that stage. A pass that returns the
very graph it was given (graphs are hash-consed, so an unchanged graph is the same object) leaves its stage
unchanged: ``print_after_all`` and ``Lowered.unchanged`` say so.

Stages: a graph goes from a queue graph (``"queue"``: SUBMITs) through typed messages (``"messages"``: MSGs, after
``encode``) and C calls (``"calls"``: CALLs, after ``abi``) to a ``Program`` (``"program"``, after ``linearize``).
Each pass declares the stages it ``takes`` and the one it ``produces``, and a pipeline is checked when it is built:
``encode,encode``, ``symbolic,encode``, ``linearize`` alone or ``encode,linearize`` raise ``PipelineError`` naming
the pass, what it needs and which passes must come first.
"""
from __future__ import annotations

import dataclasses
import math
import re
import sys
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TextIO

from mtlir.program.program import Program
from mtlir.errors import InputError
from mtlir.ir.uop import UOp, gc_paused

__all__ = ["Pass", "PassContext", "PipelineError", "PassPipeline", "PASSES", "register", "Lowered", "PassTiming",
           "STAGES", "graph_stage"]

# the stages of a lowering, in order, and how messages name them
STAGES = ("queue", "messages", "calls", "program")
_STAGE_TEXT = {"queue": "a queue graph (SUBMIT)", "messages": "typed messages (MSG, what encode produces)",
               "calls": "C calls (CALL, what abi produces)", "program": "a Program (what linearize produces)"}
_ADVANCE = {"queue": "encode", "messages": "abi{target=...}", "calls": "linearize"}  # stage -> the pass leaving it


class PipelineError(InputError, ValueError):
    """A pass pipeline (``PassPipeline``) string or option that cannot be used; the message names the pass and the
    option."""


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
    takes: ClassVar[tuple[str, ...]] = ("queue", "messages", "calls")  # the stages (STAGES) it can run on
    produces: ClassVar[str | None] = None                               # the stage it leaves; None: unchanged

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

# option name -> (converter from the pipeline text, what it expects, the annotation as text), per registered pass
_Converter = Callable[[str], Any]
_OPTION_TYPES: dict[type[Pass], dict[str, tuple[_Converter, str, str]]] = {}
_OPTION_KINDS = "bool, int, float, str, a Literal of strings, or one of these | None (Optional[...])"


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: add a pass to the registry under its ``name``. Raises ``PipelineError`` for a name used
    twice or not in kebab-case, and for an option (a dataclass field) whose annotation a pipeline string cannot give
    (``_OPTION_KINDS``: ``bool``, ``int``, ``float``, ``str``, a ``Literal`` of strings, or one of them ``| None``),
    naming the option and its annotation."""
    if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", cls.name or ""):
        raise PipelineError(f"pass class {cls.__name__}: name {cls.name!r} is not kebab-case")
    if cls.name in PASSES and PASSES[cls.name] is not cls:
        raise PipelineError(f"two passes named {cls.name!r}: {PASSES[cls.name].__name__} and {cls.__name__}")
    _OPTION_TYPES[cls] = _option_types(cls)
    PASSES[cls.name] = cls
    return cls


def _option_types(cls: type[Pass]) -> dict[str, tuple[_Converter, str, str]]:
    """The converter of each option of ``cls`` (``register``). Raises ``PipelineError`` naming the pass, the option
    and its annotation when an annotation cannot be resolved or converted."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception as e:  # a name the annotation uses that its module does not define
        raise PipelineError(f"pass {cls.name!r} ({cls.__name__}): cannot resolve the annotations of its options: "
                            f"{e}") from None
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints.get(f.name, f.type)
        conv = _converter(tp)
        if conv is None:
            raise PipelineError(f"pass {cls.name!r} ({cls.__name__}): option {f.name.replace('_', '-')!r} is "
                                f"{_type_text(tp)}, which a pipeline string cannot give: an option is {_OPTION_KINDS}")
        out[f.name] = (*conv, _type_text(tp))
    return out


def _type_text(tp: Any) -> str:
    """An annotation as one writes it: ``float``, ``int | None``, ``Literal['a', 'b']``."""
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def _boolean(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError
    return text == "true"


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError
    return value


def _converter(tp: Any) -> tuple[_Converter, str] | None:
    """(text -> value, what the text must be) for annotation ``tp``; None when a pipeline string cannot give it."""
    simple: dict[Any, tuple[_Converter, str]] = {bool: (_boolean, "true or false"), int: (int, "an integer"),
                                                 float: (_number, "a finite number"), str: (str, "a word")}
    if isinstance(tp, type) and tp in simple:
        return simple[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal and args and all(isinstance(a, str) for a in args):
        def choice(text: str) -> str:
            if text not in args:
                raise ValueError
            return text
        return choice, "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        inner = _converter(rest[0]) if len(rest) == 1 else None
        if inner is None:
            return None
        conv, what = inner

        def optional(text: str) -> Any:
            return None if text == "none" else conv(text)
        return optional, f"{what} or none"
    return None


def _format(v: Any) -> str:
    """An option's value as the pipeline string writes it (``_convert`` reads it back to an equal value)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    return repr(v) if isinstance(v, float) else str(v)


def _convert(text: str, cls: type[Pass], attr: str, where: str) -> Any:
    """``text`` converted by the annotation of option ``attr`` of ``cls``. Raises ``PipelineError`` naming ``where``
    (the pass and the option), the annotation and what was expected."""
    types_ = _OPTION_TYPES.get(cls)
    if types_ is None:  # a pass class put in PASSES without register
        types_ = _OPTION_TYPES[cls] = _option_types(cls)
    conv, what, annotation = types_[attr]
    try:
        return conv(text)
    except ValueError:
        raise PipelineError(f"{where} is {annotation}: expected {what}, got {text!r}") from None


_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _options(name: str, cls: type[Pass], body: str, at: int) -> dict[str, Any]:
    """The options of pass ``name`` written in ``body`` (the text between its braces, from character ``at``)."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for item in body.replace(",", " ").split():
        key, eq, val = item.partition("=")
        attr = key.replace("-", "_")
        if not eq or not val:
            raise PipelineError(f"pass {name!r}: option {item!r} must be written key=value")
        if attr not in fields:
            raise PipelineError(f"pass {name!r} has no option {key!r} (options: "
                                f"{', '.join(k.replace('_', '-') for k in fields) or 'none'})")
        if attr in kwargs:
            raise PipelineError(f"pass {name!r}: option {key!r} is given twice (in the braces at character {at})")
        kwargs[attr] = _convert(val, cls, attr, f"pass {name!r} option {key!r}")
    missing = [k for k, f in fields.items() if k not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise PipelineError(f"pass {name!r} needs option {', '.join(k.replace('_', '-') for k in missing)} (e.g. "
                            f"{name}{{{missing[0].replace('_', '-')}=...}})")
    return kwargs


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _check_order(passes: tuple[Pass, ...], start: str) -> None:
    """Check each pass gets a stage it takes (module docstring). Raises ``PipelineError`` naming the pass, what it
    needs, what it would get, and the passes that must come before it."""
    stage, producer = start, ""
    for i, p in enumerate(passes):
        if stage == "program":
            raise PipelineError(f"pass {p.name!r} (pass {i + 1} of the pipeline) comes after linearize, which already "
                                "produced the Program")
        if stage not in p.takes:
            needs = " or ".join(_STAGE_TEXT[t] for t in p.takes)
            first = min(STAGES.index(t) for t in p.takes)
            if STAGES.index(stage) < first:
                todo = [_ADVANCE[t] for t in STAGES[STAGES.index(stage):first]]
                hint = f"run {', '.join(todo)} before it"
            else:
                hint = f"it must come before {producer}" if producer else "the graph is past it"
            raise PipelineError(f"pass {p.name!r} (pass {i + 1} of the pipeline) takes {needs}, but it would get "
                                f"{_STAGE_TEXT[stage]}: {hint}")
        if p.produces and p.produces != stage:
            stage, producer = p.produces, f"pass {i + 1} ({p})"


def graph_stage(graph: UOp) -> str:
    """The stage (``STAGES``) a graph is in: ``"queue"`` when it holds a SUBMIT (the root, or anywhere),
    ``"messages"`` when it holds an MSG, an MSGS or any other node but CALLs, ``"calls"`` when its messages are all
    CALLs already."""
    from mtlir.ir.ops import Ops
    if graph.op is Ops.SUBMIT:
        return "queue"
    ops = {u.op for u in graph.toposort()}
    if Ops.SUBMIT in ops:
        return "queue"
    if ops & {Ops.MSG, Ops.MSGS}:
        return "messages"
    return "calls" if ops & {Ops.CALL, Ops.CALLS} else "messages"


@dataclass(frozen=True)
class PassPipeline:
    """An ordered tuple of passes run on a graph of stage ``start`` (``STAGES``; a queue graph by default).
    ``PassPipeline.parse(text)`` reads a pipeline string; ``str(p)`` prints it.

    Raises ``PipelineError`` when a pass does not get a stage it takes (module docstring)."""

    passes: tuple[Pass, ...]
    start: str = "queue"

    def __post_init__(self) -> None:
        if self.start not in STAGES[:-1]:
            raise PipelineError(f"a pipeline starts from one of {', '.join(STAGES[:-1])}, not {self.start!r}")
        _check_order(self.passes, self.start)

    @staticmethod
    def parse(text: str, start: str = "queue") -> PassPipeline:
        """Parse ``text`` (module docstring) into a pipeline run on a graph of stage ``start``.

        Raises ``PipelineError`` naming the unknown pass, option or value, the character of a brace or comma out of
        place, an option given twice, a missing required option, or a pass in the wrong place."""
        if not isinstance(text, str) or not text.strip():
            raise PipelineError("empty pipeline: expected e.g. 'encode,abi{target=arm64},linearize'")
        passes: list[Pass] = []
        pos = 0
        while pos < len(text):
            pos = _skip(text, pos)
            m = _NAME.match(text, pos)
            if m is None:
                what = f"unexpected {text[pos]!r}" if pos < len(text) and text[pos] in "{}" else "cannot read a pass"
                raise PipelineError(f"pipeline {text!r}: {what} at character {pos}: {text[pos:pos + 20]!r}")
            name = m.group(0)
            cls = PASSES.get(name)
            if cls is None:
                raise PipelineError(f"unknown pass {name!r} in pipeline {text!r}: known passes are "
                                    f"{', '.join(sorted(PASSES))}")
            pos = _skip(text, m.end())
            body, at = "", pos
            if pos < len(text) and text[pos] == "{":
                close, inner = text.find("}", pos + 1), text.find("{", pos + 1)
                if 0 <= inner and (close < 0 or inner < close):
                    if not text[pos + 1:inner].strip():
                        raise PipelineError(f"pipeline {text!r}: unexpected '{{' at character {inner} (pass {name!r}: "
                                            "options are written {key=value ...}, one pair of braces)")
                    raise PipelineError(f"pipeline {text!r}: unclosed '{{' at character {pos} (the options of pass "
                                        f"{name!r}): another '{{' opens at character {inner} before a '}}'")
                if close < 0:
                    raise PipelineError(f"pipeline {text!r}: unclosed '{{' at character {pos} (the options of pass "
                                        f"{name!r})")
                body, pos = text[pos + 1:close], _skip(text, close + 1)
            try:
                passes.append(cls(**_options(name, cls, body, at)))
            except (TypeError, ValueError) as e:
                if isinstance(e, PipelineError):
                    raise
                raise PipelineError(f"pass {name!r}: {e}") from None
            if pos < len(text):
                if text[pos] != ",":
                    what = f"unexpected {text[pos]!r}" if text[pos] in "{}" else "expected ','"
                    raise PipelineError(f"pipeline {text!r}: {what} at character {pos}")
                pos += 1
                if _skip(text, pos) == len(text):
                    raise PipelineError(f"pipeline {text!r}: ends with ','")
        return PassPipeline(tuple(passes), start)

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

        ``print_after_all`` prints each stage to ``out`` (default stderr), or for a pass that returned the very graph
        it was given only its header, saying ``(unchanged)``. ``keep_stages`` keeps every stage (``("input", graph)``
        first). Raises what the passes and verifiers raise (``VerifyError`` names the pass
        and the node); an exception a pass raises keeps its type and gets a note naming the pass."""
        from mtlir.passes.verify import checked_once
        with gc_paused(), checked_once():
            return self._run(graph, print_after_all, keep_stages, out, verify)

    def _run(self, graph: UOp, print_after_all: bool, keep_stages: bool, out: TextIO | None,
             verify: bool) -> Lowered:
        from mtlir.program.tables import describe
        ctx = PassContext()
        stages: list[tuple[str, UOp | Program]] = [("input", graph)] if keep_stages else []
        timings: list[PassTiming] = []
        cur: UOp | Program = graph
        stream = out if out is not None else sys.stderr
        for i, p in enumerate(self.passes):
            if not isinstance(cur, UOp):  # a PassPipeline built around __post_init__'s check
                raise PipelineError(f"pass {p.name!r} comes after linearize, which already produced the Program")
            t0 = time.perf_counter()
            try:
                nxt = p.apply(cur, ctx)
            except Exception as e:  # same exception (callers' except clauses still work), naming the pass
                e.add_note(f"in pass {str(p)!r} (pass {i + 1} of {len(self.passes)} of pipeline '{self}')")
                raise
            t1 = time.perf_counter()
            if verify:
                p.verify(nxt)
            t2 = time.perf_counter()
            timings.append(PassTiming(p.name, t1 - t0, t2 - t1))
            unchanged, cur = nxt is cur, nxt
            if keep_stages:
                stages.append((p.name, cur))
            if print_after_all and unchanged:
                print(f"// -----// IR after {p} (unchanged) //----- //", file=stream)
            elif print_after_all:
                print(f"// -----// IR after {p} //----- //", file=stream)
                print(describe(cur), file=stream)  # the listing, its messages and ICB commands spelled out
        return Lowered(cur, stages, timings, ctx.diagnostics, self)


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
    pipeline: PassPipeline

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

    def unchanged(self, i: int) -> bool:
        """Whether stage ``i`` of ``stages`` is the very graph of stage ``i - 1``: its pass changed nothing (graphs
        are hash-consed, so the same graph is the same object). False for the input (``i == 0``)."""
        return 0 < i < len(self.stages) and self.stages[i][1] is self.stages[i - 1][1]
