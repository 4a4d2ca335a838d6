"""The command line: ``mtlir lower`` (the listing of one submit) and ``mtlir run`` (the main job).

``mtlir lower TRACE.json [--arch apple7|apple8|apple9|mac2] [--no-residency-set] [--no-icb] [--target arm64|x86_64]
[--pipeline P] [--print-after-all] [--viz DIR] [--json]`` lowers a recorded kernel queue and prints the Program.
With ``--json`` it prints one JSON object, ``{"messages": [...], ...}``: the messages one submit sends, in order,
recorded by running the Program against a ``RecordingBridge`` (loops unrolled, no link-time messages, no waits).

``mtlir run TRACE.json [--device auto|sim|metal] [--arch ...] [--no-residency-set] [--no-icb] [--target ...]
[--faithful] [--viz DIR] [--repeat N] [--json]`` lowers, links, submits N times, reads the output and compares it
with the trace's expected output as float32 (rtol 1e-4, atol 1e-5). With ``--device metal`` the device is probed
first (``mtlir.runtime.probe``) and the submit lowered for what it offers (residency sets, ICBs); the flags can
only turn them off. ``--json``: one object ``{"match", "max_abs_err", "kernels", "messages_per_submit", "submits",
...}`` on stdout, everything else on stderr (``max_abs_err`` is null when the error is not a finite number).

Exit codes (``exit_code``): 0 match (or a successful ``lower``), 1 mismatch, 2 bad input, 3 GPU execution error (a
command buffer in status Error, a Metal validation error, a wait past its timeout), 4 a kernel the simulated
device cannot run (the translator refuses it, or OpenCL does not build its translation), 5 an internal error.
Bad input is the error family of the front end: every ``ValueError`` subclass defined in ``mtlir`` outside
``mtlir.runtime`` (``TraceError``, ``QueueError``, ``PipelineError``, ``VerifyError``, ``EncodeError``,
``AbiError``, ``LinearizeError``, ``UsageError``, ...), plus ``LinkError``, ``BridgeError``,
``KernelCompileError``, ``GraphvizNotFoundError`` and ``OSError``. Errors are one line on stderr; ``--debug`` adds
the traceback. With ``--json`` an error still writes one object to stdout:
``{"error": message, "error_type": name, "exit_code": code}``; while a ``--json`` command runs, file descriptor 1
points at stderr, so nothing but that object (not even a native library's output) reaches stdout. A stdout that
cannot be written (``> /dev/full``) is one line on stderr and exit 2; a kernel that never ends fails the run at
``--timeout`` (exit 3) and the program then leaves with ``os._exit`` (``main``). ``--arch`` takes any case;
``--repeat`` and ``--timeout`` are checked by argparse; only the trace variables the Program has are bound.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO

__all__ = ["main", "build_parser", "format_message", "lower_trace", "record_one_submit", "compare_output",
           "Comparison", "exit_code", "EXIT_MATCH", "EXIT_MISMATCH", "EXIT_BAD_INPUT", "EXIT_GPU_ERROR",
           "EXIT_UNSUPPORTED", "EXIT_INTERNAL"]

EXIT_MATCH, EXIT_MISMATCH, EXIT_BAD_INPUT, EXIT_GPU_ERROR, EXIT_UNSUPPORTED, EXIT_INTERNAL = range(6)
RTOL, ATOL = 1e-4, 1e-5
ARCHS = {"apple7": "Apple7", "apple8": "Apple8", "apple9": "Apple9", "mac2": "Mac2"}


class UsageError(ValueError):
    """A bad flag or a flag combination that cannot work (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` (exit 2, one line) carrying the usage line of the (sub)command that
    failed, instead of printing and exiting."""

    def error(self, message: str) -> NoReturn:
        usage = " ".join(self.format_usage().split())
        raise UsageError(f"{self.prog}: {message} ({usage})")


def _arch(text: str) -> str:
    """``--arch`` in any case (``apple7``, ``Apple7`` as traces and DeviceSpec spell it, ``MAC2``)."""
    key = text.lower()
    if key not in ARCHS:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(sorted(ARCHS))}, any "
                                         "case)")
    return key


def _positive_seconds(text: str) -> float:
    """``--timeout``: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the timeout must be a finite number of seconds above 0")
    return value


def _positive_int(text: str) -> int:
    """``--repeat``: an int of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least one submit")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``mtlir`` with its two commands."""
    p = _Parser(prog="mtlir", description="Lower GPU queue operations to the Objective-C messages of Apple Metal "
                                          "and run them on real or simulated Metal.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("trace", type=Path, help="a recorded kernel queue (JSON, examples/traces/*.json)")
        sp.add_argument("--arch", type=_arch, metavar="{apple7,apple8,apple9,mac2}",
                        help="GPU family, any case (default: the trace's arch)")
        sp.add_argument("--target", choices=["arm64", "x86_64"], help="ABI of objc_msgSend (default: this machine's)")
        sp.add_argument("--viz", type=Path, metavar="DIR", help="write one SVG per stage into DIR")
        sp.add_argument("--json", action="store_true", help="one JSON object on stdout, everything else on stderr")
        sp.add_argument("--debug", action="store_true", help="show the traceback of an error")
        sp.add_argument("--executor", choices=["compiled", "interpreter"], default="compiled",
                        help="how the Program runs: compiled (one generated Python function per Program, the "
                             "default) or interpreter (a loop over its instructions); both send the same messages")
        sp.add_argument("--no-residency-set", action="store_true",
                        help="a device without MTLResidencySet (macOS < 15): useResources:count:usage: instead")
        sp.add_argument("--no-icb", action="store_true",
                        help="a device without indirect command buffers (paravirtual Metal): the direct path")

    lo = sub.add_parser("lower", help="print the Program (or the messages) of one submit")
    common(lo)
    lo.add_argument("--pipeline", metavar="P", help="the pass pipeline (default: the standard one for --target)")
    lo.add_argument("--print-after-all", action="store_true", help="print every stage to stderr")
    lo.set_defaults(func=cmd_lower)

    run = sub.add_parser("run", help="lower, link, submit, and check the output against the trace")
    common(run)
    run.add_argument("--device", choices=["auto", "sim", "metal"], default="auto",
                     help="auto: metal on macOS with Metal, else the simulated device")
    run.add_argument("--faithful", action="store_true",
                     help="simulated device: behave as Metal without its validation layer (default: strict)")
    run.add_argument("--repeat", type=_positive_int, default=1, metavar="N", help="number of submits (default 1)")
    run.add_argument("--timeout", type=_positive_seconds, default=60.0, metavar="S",
                     help="seconds to wait for the GPU (default 60); past it the run fails with exit 3")
    run.set_defaults(func=cmd_run, pipeline=None, print_after_all=False)
    return p


# ---- shared steps


def _target(args: argparse.Namespace) -> str:
    """``--target``, else the pipeline's abi target, else this machine's ABI."""
    from mtlir.passes.pipeline import Pipeline
    if args.pipeline:
        ptarget = Pipeline.parse(args.pipeline).option("abi", "target")
        if args.target and ptarget and ptarget != args.target:
            raise UsageError(f"--pipeline has abi{{target={ptarget}}} but --target is {args.target}")
        if not args.target and ptarget:
            return str(ptarget)
    if args.target:
        return str(args.target)
    from mtlir.runtime.metal import host_target
    t = host_target()
    if t is None:
        raise UsageError("cannot tell this machine's ABI (neither arm64 nor x86_64): give --target")
    return t


def lower_trace(trace: Any, device: Any, target: str, *, pipeline: str | None = None, print_after_all: bool = False,
                log: TextIO | None = None, keep_stages: bool = True) -> Any:
    """Lower a loaded trace (``mtlir.trace.Trace``) for ``device`` (a ``DeviceSpec``) and ``target``: the
    ``Lowered`` of ``pipeline`` (default: ``mtlir.passes.default_pipeline(target)``). Raises what the passes
    raise."""
    from mtlir.passes import lower
    return lower(trace.queue(device), target=target, pipeline=pipeline, print_after_all=print_after_all, out=log,
                 keep_stages=keep_stages)


def _lower(args: argparse.Namespace, log: TextIO, target: str, caps: Any = None) -> tuple[Any, Any]:
    """Load the trace and lower it for ``target``: (trace, Lowered). The device has residency sets and ICBs unless
    a flag turns them off or ``caps`` (a probed ``DeviceCaps``) says it lacks them. The lowering's diagnostics
    (e.g. a batch moved to the direct path) go to ``log`` as notes."""
    from mtlir.metal import DeviceSpec
    from mtlir.trace import load_trace
    try:
        trace = load_trace(args.trace)
    except UnicodeDecodeError as e:  # a binary file: load_trace reads text
        raise UsageError(f"{args.trace}: not a JSON trace: byte {e.start} is not UTF-8 text ({e.reason})") from None
    residency_set = not args.no_residency_set and (caps is None or caps.residency_sets)
    icb = not args.no_icb and (caps is None or caps.icb)
    device = DeviceSpec(ARCHS[args.arch] if args.arch else trace.arch, residency_set=residency_set, icb=icb)
    lowered = lower_trace(trace, device, target, pipeline=args.pipeline, print_after_all=args.print_after_all,
                          log=log, keep_stages=args.viz is not None)
    for d in lowered.diagnostics:
        print(f"mtlir: note: {d}", file=log)
    for bid in getattr(trace, "unused_buffers", ()):
        print(f"mtlir: note: the trace's buffer {bid} is bound by no dispatch: it is not created", file=log)
    if args.viz is not None:
        _write_pictures(lowered.stages, args.viz, log)
    return trace, lowered


def _write_pictures(stages: list[tuple[str, Any]], outdir: Path, log: TextIO) -> None:
    """One SVG per stage: ``00-input.svg``, ``01-encode.svg``, ...; a Program is drawn as its instruction chain."""
    from mtlir.uop import UOp
    from mtlir.viz import to_dot, write_picture
    outdir.mkdir(parents=True, exist_ok=True)
    for i, (name, stage) in enumerate(stages):
        dot = to_dot(stage, name=name) if isinstance(stage, UOp) else _program_dot(stage, name)
        path = write_picture(dot, outdir / f"{i:02d}-{name}.svg")
        print(f"mtlir: wrote {path}", file=log)


def _program_dot(program: Any, name: str) -> Any:
    """A picture of a Program: its listing lines as a chain of boxes (loops as back edges)."""
    import graphviz
    dot = graphviz.Digraph(name, graph_attr={"rankdir": "TB"}, node_attr={"shape": "box", "fontname": "monospace"})
    for pc in range(len(program.instrs)):
        label = program.format(pc) if hasattr(program, "format") else repr(program.instrs[pc])
        dot.node(f"i{pc}", f"{pc}: {label}".replace("\\", "\\\\"))
        if pc:
            dot.edge(f"i{pc - 1}", f"i{pc}")
        if program.instrs[pc][0] == "END":
            dot.edge(f"i{pc}", f"i{program.instrs[pc][3] + 1}", style="dashed", constraint="false")
    return dot


def format_message(m: dict[str, Any]) -> str:
    """A recorded message as one line: ``[encoder executeCommandsInBuffer:withRange: icb, [0, 5]]``."""
    args = ", ".join(json.dumps(a) if not isinstance(a, str) else a for a in m["args"])
    return f"[{m['receiver']} {m['selector']}{' ' + args if args else ''}]"


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


# ---- commands


def cmd_lower(args: argparse.Namespace, out: TextIO, log: TextIO) -> int:
    """``mtlir lower``: the listing (or with --json the messages) of one submit."""
    target = _target(args)
    trace, lowered = _lower(args, log, target)
    program = lowered.program
    if args.json:
        messages = record_one_submit(program, program_values(program, trace, log), target, args.executor)
        doc = {"messages": messages, "count": len(messages), "workload": trace.workload,
               "arch": program.device.family, "target": target, "residency_set": program.device.residency_set,
               "icb": program.device.icb, "path": _path(program), "kernels": len(trace.dispatches),
               "pipeline": str(lowered.pipeline)}
        json.dump(doc, out, allow_nan=False)
        out.write("\n")
    else:
        print(_listing(program), file=out)
    return EXIT_MATCH


def _device_kind(kind: str, target: str, faithful: bool) -> str:
    """``--device`` resolved (auto: metal on macOS with Metal, else sim) and checked against the other flags."""
    from mtlir.runtime import metal as mtl
    if kind == "auto":
        kind = "metal" if mtl.metal_available() else "sim"
    if kind == "metal":
        if not mtl.metal_available():
            raise UsageError(f"--device metal: {mtl.NOT_AVAILABLE}")
        if faithful:
            raise UsageError("--faithful is a mode of the simulated device (--device sim)")
        if target != mtl.host_target():
            raise UsageError(f"--device metal runs this machine's ABI ({mtl.host_target()}), not --target {target}")
    return kind


def _open_metal(log: TextIO) -> tuple[Any, Any]:
    """The MetalBridge and what its device offers (``probe_device``); each missing capability is a note on
    ``log``, since the submit is then lowered without it."""
    from mtlir.runtime import metal as mtl
    from mtlir.runtime.probe import probe_device
    bridge = mtl.MetalBridge()
    caps = probe_device(bridge)
    for note in caps.notes:
        print(f"mtlir: note: {note}: lowering without it", file=log)
    return bridge, caps


def _make_bridge(kind: str, target: str, faithful: bool, program: Any, metal: Any = None) -> tuple[Any, str]:
    """The Bridge to run ``program`` on and the device's name: ``metal`` (the bridge ``_open_metal`` made) for
    ``kind == "metal"``, else a SimDevice for the device ``program`` was lowered for."""
    if kind == "metal":
        return metal, "metal"
    from mtlir.runtime.sim.device import SimDevice
    dev = program.device
    return (SimDevice(target, strict=not faithful, family=dev.family, residency_sets=dev.residency_set, icb=dev.icb),
            "sim (faithful)" if faithful else "sim")


@dataclass(frozen=True)
class Comparison:
    """The output against the expected one (float32): ``match`` (``numpy.allclose`` with rtol 1e-4, atol 1e-5, NaN
    equal to NaN), ``max_abs_err`` (inf where one side is NaN or infinite and the other not; NaN never hides an
    error), ``mismatches`` (elements outside the tolerance) and ``nan_mismatches`` (positions where exactly one
    side is NaN)."""

    match: bool
    max_abs_err: float
    mismatches: int
    nan_mismatches: int

    def json_error(self) -> float | None:
        """``max_abs_err`` for JSON, which has no NaN or infinity: the number when finite, else None (null)."""
        return self.max_abs_err if math.isfinite(self.max_abs_err) else None


def compare_output(got: Any, expected: Any) -> Comparison:
    """Compare two float arrays of one shape as float32 (``Comparison``): a NaN on one side only is a mismatch
    with an infinite error, NaN against NaN and equal infinities agree."""
    import numpy as np
    a, b = np.asarray(got, np.float32), np.asarray(expected, np.float32)
    close = np.isclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a.astype(np.float64) - b.astype(np.float64))
    err[(nan_a & nan_b) | (a == b)] = 0.0  # agreeing NaNs and equal infinities (inf - inf is NaN)
    err[np.isnan(err)] = math.inf  # NaN against a number, or inf against -inf
    return Comparison(bool(close.all()), float(err.max()) if err.size else 0.0, int((~close).sum()),
                      int((nan_a != nan_b).sum()))


def cmd_run(args: argparse.Namespace, out: TextIO, log: TextIO) -> int:
    """``mtlir run``: lower, link, submit ``--repeat`` times, compare the output with the trace's."""
    import numpy as np

    from mtlir.runtime import Session
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: at least one submit")
    target = _target(args)
    kind = _device_kind(args.device, target, args.faithful)
    metal, caps = _open_metal(log) if kind == "metal" else (None, None)
    trace, lowered = _lower(args, log, target, caps)
    program = lowered.program
    values = program_values(program, trace, log)
    # what one submit sends, as `lower --json` records it
    messages = record_one_submit(program, values, target, args.executor)
    bridge, device_name = _make_bridge(kind, target, args.faithful, program, metal)
    o = trace.output
    try:
        with Session(program, bridge, initial=trace.initial_data(), executor=args.executor,
                     timeout_s=args.timeout) as s:
            for _ in range(args.repeat):
                s.submit(**values)
            s.wait(timeout_s=args.timeout)
            got = np.frombuffer(s.read(o.placeholder, o.offset, o.nbytes), dtype=np.float32).reshape(o.shape)
    finally:
        close = getattr(bridge, "close", None)
        if close is not None:
            close()
        # a kernel that never ends (past --timeout) keeps its OpenCL queue: main() then leaves with os._exit
        args.kernel_stuck = bool(getattr(bridge, "kernel_running", False))
    gpu = [t for rec in s.completed for t in rec.gpu_times]
    host_s = s.host_s_per_submit
    cmp = compare_output(got, o.expected_array())
    kernels = len(trace.dispatches)
    listing = log if args.json else out
    dev = program.device
    print(f"; one submit of {trace.workload} ({dev.family}, {target}, {device_name}"
          f"{'' if dev.residency_set else ', no residency set'}, {_path(program)}): "
          f"{len(messages)} messages", file=listing)
    for m in messages:
        print(format_message(m), file=listing)
    nan_text = f", {cmp.nan_mismatches} NaN positions differ" if cmp.nan_mismatches else ""
    result = "match" if cmp.match else f"MISMATCH in {cmp.mismatches} of {got.size} elements"
    print(f"kernels: {kernels}, messages per submit: {len(messages)}, submits: {s.submits}, "
          f"host time per submit: {host_s * 1e6:.1f} us ({args.executor}), "
          f"result: {result} (max abs err {cmp.max_abs_err:.3g}{nan_text})", file=listing)
    if args.json:
        doc = {"match": cmp.match, "max_abs_err": cmp.json_error(), "mismatches": cmp.mismatches,
               "nan_mismatches": cmp.nan_mismatches, "kernels": kernels, "messages_per_submit": len(messages),
               "submits": s.submits, "workload": trace.workload, "arch": dev.family, "target": target,
               "residency_set": dev.residency_set, "icb": dev.icb, "path": _path(program), "device": device_name,
               "executor": args.executor, "host_s_per_submit": host_s,
               "gpu_s_per_submit": (sum(e - b for b, e in gpu) / len(s.completed)) if s.completed else None,
               "lower_s": lowered.seconds}
        json.dump(doc, out, allow_nan=False)
        out.write("\n")
    return EXIT_MATCH if cmp.match else EXIT_MISMATCH


# ---- errors and exit codes


def exit_code(e: BaseException) -> int | None:
    """The exit code of an expected error (module docstring); None for an internal error (a bug).

    4: ``UnsupportedKernelError``, ``KernelBuildError`` (the simulated device cannot run the kernel). 3:
    ``GPUExecutionError``, ``MetalValidationError``, ``TimeoutError``. 2 (bad input): the front end's error family,
    every ``ValueError`` subclass defined in ``mtlir`` outside ``mtlir.runtime`` (trace, queue, pipeline,
    verifier, encode, abi, linearize, flags), and ``LinkError``, ``BridgeError``, ``KernelCompileError`` (invalid
    MSL), ``GraphvizNotFoundError`` (``--viz`` without Graphviz), ``OSError`` (a file)."""
    from mtlir.runtime.errors import (BridgeError, GPUExecutionError, KernelBuildError, KernelCompileError, LinkError,
                                      MetalValidationError, UnsupportedKernelError)
    from mtlir.viz import GraphvizNotFoundError
    if isinstance(e, UsageError):  # also when this module runs as __main__ (python -m mtlir.cli)
        return EXIT_BAD_INPUT
    if isinstance(e, (UnsupportedKernelError, KernelBuildError)):
        return EXIT_UNSUPPORTED
    if isinstance(e, (GPUExecutionError, MetalValidationError, TimeoutError)):
        return EXIT_GPU_ERROR
    if isinstance(e, (LinkError, BridgeError, KernelCompileError, GraphvizNotFoundError, OSError)):
        return EXIT_BAD_INPUT
    if isinstance(e, ValueError) and _front_end_error(type(e)):
        return EXIT_BAD_INPUT
    return None


def _front_end_error(cls: type) -> bool:
    """A ValueError subclass of the front end (``mtlir.*``, ``mtlir.passes.*``; not the runtime's, whose
    ProgramError is a malformed Program: a bug of the lowering)."""
    return any(c is not ValueError and issubclass(c, ValueError) and c.__module__.startswith("mtlir.")
               and not c.__module__.startswith("mtlir.runtime") for c in cls.__mro__)


def _one_line(e: BaseException) -> str:
    """The error as one line: its ``summary`` when it has one (a ``KernelBuildError``), else its message with
    the whitespace collapsed, else its type's name."""
    summary = getattr(e, "summary", None)
    return summary if isinstance(summary, str) and summary else " ".join(str(e).split()) or type(e).__name__


@contextlib.contextmanager
def _stdout_for_json(out: TextIO) -> Iterator[TextIO]:
    """While a ``--json`` command runs on the process's real stdout, file descriptor 1 points at stderr, so a
    native library writing to stdout (PoCL, a stray print) cannot add to the one JSON object; the object goes to
    the original stdout through the stream this yields. Any other ``out`` is yielded unchanged."""
    if out is not sys.stdout or out.closed:
        yield out
        return
    try:
        fd = out.fileno()
    except (OSError, ValueError):  # not a real file (replaced by a test harness): nothing native can reach it
        yield out
        return
    out.flush()
    saved = os.dup(fd)
    os.dup2(sys.stderr.fileno(), fd)
    json_out = os.fdopen(os.dup(saved), "w", encoding="utf-8", closefd=True)
    try:
        yield json_out
    finally:
        try:
            out.flush()
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            try:
                json_out.close()
            except BrokenPipeError:  # the reader went away: main has returned 141 already
                pass
            except OSError as e:
                if not _output_error(e):
                    raise
                with contextlib.suppress(OSError):
                    json_out.close()  # the buffer is dropped now; main reports the write error once


def _output_error(e: BaseException) -> bool:
    """True for a failed write to stdout (``> /dev/full``: ENOSPC; EIO, EFBIG, EDQUOT, EBADF): an ``OSError``
    without a file name (errors of the files mtlir opens by name carry it)."""
    return (isinstance(e, OSError) and getattr(e, "filename", None) is None
            and e.errno in (errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT, errno.EBADF))


def _silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so the interpreter's last flush of what stdout still buffers cannot
    fail a second time after the error has been reported."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: list[str] | None = None, *, out: TextIO | None = None, log: TextIO | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code (module docstring).
    ``out``/``log`` default to stdout/stderr.

    Called with ``argv=None`` it is the program itself (the ``mtlir`` console script, ``python -m mtlir.cli``): when
    a kernel is still running on the simulated device after the run (one that never ends, past ``--timeout``), it
    flushes stdout and stderr and leaves with ``os._exit`` instead of returning, since the process could not
    release that kernel's OpenCL queue and would wait for it."""
    program = argv is None
    out = out or sys.stdout
    log = log or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    json_mode = "--json" in argv
    args: Any = None
    code = EXIT_INTERNAL
    try:
        with contextlib.ExitStack() as stack:
            try:
                if json_mode:
                    out = stack.enter_context(_stdout_for_json(out))
                args = build_parser().parse_args(argv)
                code = int(args.func(args, out, log))
                out.flush()  # a closed or full stdout shows here, inside the handlers below
            except KeyboardInterrupt:
                print("mtlir: interrupted", file=log)
                code = 130
            except BrokenPipeError:  # stdout closed early (`mtlir lower ... | head`): stop quietly, as SIGPIPE would
                if out is sys.stdout:
                    _silence_stdout()
                code = 141
            except Exception as e:  # every error becomes one line and an exit code
                code = _report(e, debug, json_mode, out, log)
    except OSError as e:  # --json: the object could not be written through the saved stdout
        if not _output_error(e):
            raise
        print(f"mtlir: error: cannot write the output to stdout: {e}", file=log)
        code = EXIT_BAD_INPUT
    if program and getattr(args, "kernel_stuck", False):
        for stream in (sys.stdout, sys.stderr, out, log):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    return code


def _report(e: Exception, debug: bool, json_mode: bool, out: TextIO, log: TextIO) -> int:
    """Print ``e`` as one line on ``log`` (and with --json as the one object on ``out``); its exit code."""
    if _output_error(e):  # stdout itself failed: say so once, write nothing more there
        print(f"mtlir: error: cannot write the output to stdout: {e}", file=log)
        if out is sys.stdout:
            _silence_stdout()
        return EXIT_BAD_INPUT
    expected = exit_code(e)
    if debug:
        traceback.print_exc(file=log)
    text = _one_line(e)
    print(f"mtlir: internal error: {type(e).__name__}: {text}" if expected is None else f"mtlir: error: {text}",
          file=log)
    failed = EXIT_INTERNAL if expected is None else expected
    if json_mode:  # the one JSON object stdout promises, saying what went wrong
        json.dump({"error": text, "error_type": type(e).__name__, "exit_code": failed}, out)
        out.write("\n")
    return failed


if __name__ == "__main__":
    sys.exit(main())
