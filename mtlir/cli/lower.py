"""``mtlir lower`` and the steps ``mtlir run`` shares with it: the target, loading and lowering the trace, the
pictures of ``--viz``, the messages of one submit, the listing.

``mtlir lower TRACE.json [--arch apple7|apple8|apple9|mac2] [--no-residency-set] [--no-icb] [--target arm64|x86_64]
[--pipeline P] [--print-after-all] [--viz DIR] [--html FILE] [--setup] [--json]`` lowers a recorded kernel queue and
prints the Program. With ``--json`` it prints one JSON object, ``{"messages": [...], "setup": [...], "icbs": [...],
...}``: the messages one submit sends, in order, recorded by running the Program against a ``RecordingBridge`` (loops
unrolled, no link-time messages, no waits), the messages link sends once (``record_setup``; ``--setup`` lists them
instead of the Program) and each ICB's commands. ``--html`` writes the page of the lowering (``mtlir.cli.page``).

Both commands lower through a ``lower_trace`` they are given (``LowerTrace``; ``mtlir.cli.main.main`` passes
``lower_trace`` below, a test may pass another).
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from mtlir.cli.report import EXIT_MATCH, UsageError

__all__ = ["ARCHS", "LowerTrace", "lower_trace", "format_message", "record_one_submit", "program_values",
           "cmd_lower", "pictures_failed"]

ARCHS = {"apple7": "Apple7", "apple8": "Apple8", "apple9": "Apple9", "mac2": "Mac2"}

# lower_trace(trace, device, target, *, pipeline=, print_after_all=, log=, keep_stages=) -> Lowered
LowerTrace = Callable[..., Any]


def _target(args: argparse.Namespace) -> str:
    """``--target``, else the pipeline's abi target, else this machine's ABI."""
    from mtlir.passes.pipeline import PassPipeline
    if args.pipeline:
        ptarget = PassPipeline.parse(args.pipeline).option("abi", "target")
        if args.target and ptarget and ptarget != args.target:
            raise UsageError(f"--pipeline has abi{{target={ptarget}}} but --target is {args.target}")
        if not args.target and ptarget:
            return str(ptarget)
    if args.target:
        return str(args.target)
    from mtlir.runtime.metal.bridge import host_target
    t = host_target()
    if t is None:
        raise UsageError("cannot tell this machine's ABI (neither arm64 nor x86_64): give --target")
    return t


def lower_trace(trace: Any, device: Any, target: str, *, pipeline: str | None = None, print_after_all: bool = False,
                log: TextIO | None = None, keep_stages: bool = True) -> Any:
    """Lower a loaded trace (``mtlir.frontend.trace.Trace``) for ``device`` (a ``DeviceSpec``) and ``target``: the
    ``Lowered`` of ``pipeline`` (default: ``mtlir.passes.default_pipeline(target, graph)``). Raises what the passes
    raise."""
    from mtlir.passes import lower
    return lower(trace.queue(device), target=target, pipeline=pipeline, print_after_all=print_after_all, out=log,
                 keep_stages=keep_stages)


def _lower(args: argparse.Namespace, log: TextIO, target: str, lower: LowerTrace, caps: Any = None) -> tuple[Any, Any]:
    """Load the trace and lower it for ``target`` with ``lower`` (``lower_trace`` or a stand-in): (trace, Lowered).
    The device has residency sets and ICBs unless a flag turns them off or ``caps`` (a probed ``DeviceCaps``) says
    it lacks them. The lowering's diagnostics (e.g. a batch moved to the direct path) go to ``log`` as notes."""
    from mtlir.metal import DeviceSpec
    from mtlir.frontend.trace import load_trace
    try:
        trace = load_trace(args.trace)
    except OSError as e:  # missing, a folder, unreadable: name the argument
        raise UsageError(f"TRACE {args.trace}: cannot read the trace: {e.strerror or e}") from None
    residency_set = not args.no_residency_set and (caps is None or caps.residency_sets)
    icb = not args.no_icb and (caps is None or caps.icb)
    device = DeviceSpec(ARCHS[args.arch] if args.arch else trace.arch, residency_set=residency_set, icb=icb)
    lowered = lower(trace, device, target, pipeline=args.pipeline, print_after_all=args.print_after_all, log=log,
                    keep_stages=args.viz is not None or getattr(args, "html", None) is not None)
    for d in lowered.diagnostics:
        print(f"mtlir: note: {d}", file=log)
    for bid in getattr(trace, "unused_buffers", ()):
        print(f"mtlir: note: the trace's buffer {bid} is bound by no dispatch: it is not created", file=log)
    if args.viz is not None:
        _write_pictures(lowered.stages, args.viz, log)
    return trace, lowered


def _write_pictures(stages: list[tuple[str, Any]], outdir: Path, log: TextIO) -> None:
    """One SVG per stage: ``00-input.svg``, ``01-encode.svg``, ...; a Program is drawn as its instruction chain. A
    stage whose pass returned the very graph it was given says ``(unchanged)`` in its title. The stage pictures of an
    earlier lowering in ``outdir`` (``NN-name.svg``) are removed first, so the folder shows this pipeline only.

    Each stage is drawn on its own: one that ``dot`` cannot draw (too slow, failing) does not stop the others
    from being written; then ``pictures_failed`` raises one error naming every stage without a picture (the
    first failure's class: ``GraphvizTimeoutError``, exit 4, or ``GraphvizError``, exit 2). Without Graphviz the
    first stage raises ``GraphvizNotFoundError`` (no stage could be drawn)."""
    import re
    from mtlir.program.program import Program
    from mtlir.viz import GraphvizError, GraphvizNotFoundError, to_dot, write_picture
    if outdir.exists() and not outdir.is_dir():
        raise UsageError(f"--viz {outdir}: is a file, not a folder: give a folder for the pictures")
    failed: list[tuple[str, GraphvizError]] = []
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        for old in outdir.glob("[0-9][0-9]-*.svg"):
            if re.fullmatch(r"\d\d-[\w.{}=,-]+\.svg", old.name):
                old.unlink()
        for i, (name, stage) in enumerate(stages):
            title = f"{name} (unchanged)" if i and stage is stages[i - 1][1] else name
            dot = to_dot(stage, name=title, setup=_setup_lines(stage, log) if isinstance(stage, Program) else [])
            try:
                path = write_picture(dot, outdir / f"{i:02d}-{name}.svg")
            except GraphvizNotFoundError:
                raise
            except GraphvizError as e:
                failed.append((f"{i:02d}-{name}", e))  # named by the one error raised below
                continue
            print(f"mtlir: wrote {path}", file=log)
    except OSError as e:  # a parent that is a file, no permission, a full disk: name the flag and the file
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(outdir) else ""
        raise UsageError(f"--viz {outdir}: cannot write the pictures{where}: {e.strerror or e}") from None
    if failed:
        raise pictures_failed(f"--viz {outdir}", failed, len(stages))


def pictures_failed(flag: str, failed: list[tuple[str, Any]], total: int) -> Exception:
    """One error for the stages whose picture ``dot`` could not make (``failed``: (stage, its GraphvizError)),
    naming each stage and how many of ``total`` were written; of the first failure's class (so its exit code:
    ``GraphvizTimeoutError`` 4, ``GraphvizError`` 2)."""
    stages = "; ".join(f"{stage}: {e}" for stage, e in failed)
    kind: type[Exception] = type(failed[0][1])
    return kind(f"{flag}: no picture of {len(failed)} of {total} stages ({stages}); the other "
                              f"{total - len(failed)} were written")


def _setup_lines(program: Any, log: TextIO) -> list[str]:
    """The setup messages of ``program`` as listing lines for its picture; none, with a note on ``log``, when the
    recording's host memory cannot hold the Program's buffers (a buffer of many GiB: the device says what it
    refuses when ``run`` links)."""
    try:
        return [format_message(m) for m in record_setup(program, program.target)]
    except MemoryError:
        print("mtlir: note: the Program's picture shows no setup messages: the recording could not allocate its "
              "buffers in host memory", file=log)
        return []


def format_message(m: dict[str, Any]) -> str:
    """A recorded message as one line: ``[encoder executeCommandsInBuffer:withRange: icb, [0, 5]]``."""
    args = ", ".join(json.dumps(a) if not isinstance(a, str) else a for a in m["args"])
    return f"[{m['receiver']} {m['selector']}{' ' + args if args else ''}]"


def record_setup(program: Any, target: str) -> list[dict[str, Any]]:
    """The messages ``link`` sends once for ``program`` (queue, event, buffers, libraries and pipelines, the ICB and
    each command's ``indirectComputeCommandAtIndex:``, ``setKernelBuffer:offset:atIndex:``, ``setBarrier``, the
    residency set), in order, recorded on a standalone ``RecordingBridge`` over a ``FakeDevice``; the objects are
    released afterwards (those messages are not listed)."""
    from mtlir.runtime import RecordingBridge
    from mtlir.runtime.link.link import link
    bridge = RecordingBridge(target=target)
    linked = link(program, bridge)
    setup = list(bridge.messages)
    linked.release()
    return setup


def record_one_submit(program: Any, values: dict[str, int], target: str,
                      executor: str = "compiled") -> list[dict[str, Any]]:
    """The messages one submit of ``program`` sends, recorded on a standalone ``RecordingBridge`` (run by
    ``executor``: both kinds send the same messages)."""
    from mtlir.runtime import RecordingBridge, Session
    with Session(program, RecordingBridge(target=target), executor=executor) as s:
        return s.record_submit(**values)


def program_values(program: Any, trace: Any, log: TextIO) -> dict[str, int]:
    """The trace's variable values that ``program`` has (a variable no dispatch uses is not in the Program; each
    such one is a note on ``log``)."""
    values = dict(trace.values)
    unused = [name for name in values if name not in program.variables]
    for name in unused:
        print(f"mtlir: note: the trace's variable {name!r} is used by no dispatch: it is not bound", file=log)
        del values[name]
    return values


def _path(program: Any) -> str:
    """How the Program encodes its commands: ``ICB``, or ``direct path`` (saying so when the device has ICBs: the
    lowering fell back to it, see its note)."""
    if any(o.kind == "icb" for o in program.objects.values()):
        return "ICB"
    return "direct path (the device has ICBs)" if program.device.icb else "direct path, no ICB"


def _listing(program: Any) -> str:
    """The Program's listing, its first header line saying which path the lowering took (``_path``)."""
    text = program.listing() if hasattr(program, "listing") else "\n".join(map(repr, program.instrs))
    first, sep, rest = text.partition("\n")
    if first.startswith("; "):
        dev = program.device
        first = (f"; {dev.family}, {'residency set' if dev.residency_set else 'no residency set'}, {_path(program)}, "
                 f"{program.target}: {len(program.instrs)} instructions, {program.nregs} registers")
    return first + sep + rest


def cmd_lower(args: argparse.Namespace, out: TextIO, log: TextIO, *, lower_trace: LowerTrace) -> int:
    """``mtlir lower``: the listing (or with --json the messages) of one submit, lowered by ``lower_trace``."""
    target = _target(args)
    from mtlir.cli.progress import activity, wanted
    with activity("lowering", log, wanted(log, args.json)):  # a clock on a terminal while a large queue lowers
        trace, lowered = _lower(args, log, target, lower_trace)
    program = lowered.program
    setup = record_setup(program, target) if args.json or args.setup or args.html else []
    if args.json or args.html:
        messages = record_one_submit(program, program_values(program, trace, log), target, args.executor)
    if args.html:
        from mtlir.cli.page import write_page
        path = write_page(args.html, lowered, title=f"mtlir lower {trace.workload} ({program.device.family}, "
                                                     f"{target})", setup=setup, messages=messages)
        print(f"mtlir: wrote {path}", file=log)
    if args.json:
        from mtlir.program.tables import icb_records, program_icbs
        icb = [{"name": name, "commands": icb_records(spec)} for name, spec in program_icbs(program)]
        doc = {"messages": messages, "count": len(messages), "setup": setup, "setup_count": len(setup), "icbs": icb,
               "workload": trace.workload,
               "arch": program.device.family, "target": target, "residency_set": program.device.residency_set,
               "icb": program.device.icb, "path": _path(program), "kernels": len(trace.dispatches),
               "pipeline": str(lowered.pipeline)}
        json.dump(doc, out, allow_nan=False)
        out.write("\n")
    elif args.setup:
        print(f"; link: {len(setup)} setup messages, sent once ({program.device.family}, {target})", file=out)
        for m in setup:
            print(format_message(m), file=out)
    else:
        print(_listing(program), file=out)
    return EXIT_MATCH
