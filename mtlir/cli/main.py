"""The command line: ``mtlir lower`` (the listing of one submit) and ``mtlir run`` (the main job).

``mtlir lower TRACE.json [--arch apple7|apple8|apple9|mac2] [--no-residency-set] [--no-icb] [--target arm64|x86_64]
[--pipeline P] [--print-after-all] [--viz DIR] [--json]`` lowers a recorded kernel queue and prints the Program.
With ``--json`` it prints one JSON object, ``{"messages": [...], ...}``: the messages one submit sends, in order,
recorded by running the Program against a ``RecordingBridge`` (loops unrolled, no link-time messages, no waits).

``mtlir run TRACE.json [--device auto|sim|metal] ...`` (the main job) lowers, links, submits ``--repeat`` times and
compares the output with the trace's; ``mtlir.cli.run`` describes it. ``mtlir opt FILE -p PIPELINE`` runs passes on
a graph in the text form (``mtlir.cli.opt``). ``mtlir record SCRIPT.py -o TRACE.json``
records a tinygrad program's kernel queue as a trace (``mtlir.cli.record``; needs tinygrad).

Exit codes (``exit_code``): 0 match (or a successful ``lower``), 1 mismatch, 2 bad input, 3 GPU execution error (a
command buffer in status Error, a Metal validation error, a wait past its timeout), 4 a kernel the simulated
device cannot run (the translator refuses it, or OpenCL does not build its translation), 5 an internal error.
The codes come from the error family of ``mtlir.errors``: bad input is an ``InputError`` (``TraceError``,
``QueueError``, ``PipelineError``, a ``LoweringError``, ``KernelCompileError``, ``UsageError``, ...), a
``LinkError``, a ``BridgeError`` or an ``OSError``; a GPU execution error a ``DeviceError`` or a ``TimeoutError``;
a kernel the simulated device cannot run an ``UnsupportedError`` (``mtlir.cli.report.exit_code``). Errors are one
line on stderr (an internal error adds its notes, ``mtlir: note: in pass 'encode' ...``); ``--debug`` adds the
traceback. With ``--json`` an error still writes one object to stdout:
``{"error": message, "error_type": name, "exit_code": code}``; while a ``--json`` command runs, file descriptor 1
points at stderr, so nothing but that object (not even a native library's output) reaches stdout. A stdout that
cannot be written (``> /dev/full``) is one line on stderr and exit 2; a kernel that never ends fails the run at
``--timeout`` (exit 3) and the program then leaves with ``os._exit`` (``main``). ``--arch`` takes any case;
``--repeat`` and ``--timeout`` are checked by argparse; only the trace variables the Program has are bound.

This module holds the parser and ``main``, which gives the commands their collaborators. The commands are in
``mtlir.cli.lower`` (with the steps both share) and ``mtlir.cli.run``; errors, exit codes and the stdout of
``--json`` are in ``mtlir.cli.report``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TextIO

from mtlir.cli.lower import ARCHS, LowerTrace, cmd_lower, lower_trace
from mtlir.cli.opt import cmd_opt
from mtlir.cli.record import add_parser as add_record_parser, cmd_record
from mtlir.cli.translate import cmd_translate
from mtlir.cli.report import (EXIT_BAD_INPUT, EXIT_INTERNAL, UsageError, _interrupted, _output_error, _report,
                              _silence_stdout, _stdout_for_json, same_path)
from mtlir.errors import MtlirError
from mtlir.cli.run import MakeBridge, cmd_list_devices, cmd_run, make_bridge, metal_available, metal_bridge

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` (exit 2, one line) carrying the usage line of the (sub)command that
    failed, instead of printing and exiting. ``commands`` holds the subcommands' parsers, by name, so an argument
    one of them does not know is reported with that subcommand's usage (``parse``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: dict[str, _Parser] = {}

    def error(self, message: str) -> NoReturn:
        """``message`` as a ``UsageError``: ``run: the following arguments are required: trace (usage: mtlir run
        ...)`` for a subcommand, without the program's name (the report puts ``mtlir: error:`` in front)."""
        usage = " ".join(self.format_usage().split())
        command = self.prog.partition(" ")[2]
        raise UsageError(f"{command + ': ' if command else ''}{message} ({usage})")

    def parse(self, argv: list[str]) -> argparse.Namespace:
        """``parse_args(argv)``, except that arguments the subcommand does not know are reported by the
        subcommand's parser (its usage, not the program's)."""
        args, extras = self.parse_known_args(argv)
        if extras:
            parser = self.commands.get(getattr(args, "command", None) or "", self)
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return args


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


def _fault(text: str) -> Any:
    """``--inject-fault``: a fault of the simulated device (``mtlir.runtime.sim.injection.Fault.parse``)."""
    from mtlir.errors import ArgumentError
    from mtlir.runtime.sim.injection import Fault
    try:
        return Fault.parse(text)
    except ArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_int(need: str) -> Callable[[str], int]:
    """An argparse type: an int of at least 1; below, the error says ``need`` (``--repeat``: "at least one submit";
    the benchmarks' ``--rounds`` and ``--long-repeat`` use it too)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{value}: {need}")
        return value
    return parse


def _opencl_device(text: str) -> str:
    """``--opencl-device``: a device index or a non-empty part of a device's name (an empty one matched every
    device and silently picked the first)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: an empty name: give an index or a part of a device's name "
                                         "(mtlir run --list-devices lists them)")
    return text


def _viz_dir(text: str) -> Path:
    """``--viz DIR``: a non-empty path (``--viz ''`` was ``Path('')``, the current folder, and wrote the pictures
    there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: an empty path: give a folder for the pictures (it is made "
                                         "when missing)")
    return Path(text)


class _JoinPipeline(argparse.Action):
    """``-p``/``--pipeline`` given several times: the pipelines joined in order with ``,`` (``-p encode -p
    barriers`` is ``-p encode,barriers``, mlir-opt's way with several pass flags; the last one alone used to win
    silently). An empty value is refused (argparse's error: a ``UsageError``, exit 2)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        text = str(values).strip()
        if not text:
            raise argparse.ArgumentError(self, "an empty pipeline: give passes, e.g. encode,abi{target=arm64}")
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{before},{text}" if before else text)


class _Version(argparse.Action):
    """``--version``: ``mtlir X.Y`` on stdout, or with ``--json`` the object ``{"version": "X.Y"}`` (argparse's own
    action printed to stdout, which a ``--json`` command points at stderr, so stdout got nothing). Raises
    ``_VersionRequested`` for ``main`` to print, as argparse's action exits."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version (with --json as {\"version\": ...}) and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        raise _VersionRequested()


class _VersionRequested(MtlirError):  # noqa: N818  (a signal inside main, never seen outside it)
    """``--version`` was given: ``main`` prints the version and exits 0."""


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, an output path that cannot be written: ``--html FILE`` and ``--profile FILE`` need
    an existing, writable folder and must not name a folder; ``--viz DIR`` must not be a file and the nearest
    existing folder above it must be writable (the pictures' folders are made); no two of them may name the same
    path, nor the input TRACE (one output overwrote the other, or the trace, and the command still exited 0).
    Raises ``UsageError`` naming the flag(s) (a run of a large trace used to end with that error after all its
    work)."""
    _distinct_paths([(flag, getattr(args, dest, None)) for flag, dest in
                     (("TRACE", "trace"), ("--html", "html"), ("--profile", "profile"), ("--viz", "viz"))])
    for flag, what, path in (("--html", "the page", getattr(args, "html", None)),
                             ("--profile", "the profile", getattr(args, "profile", None))):
        if path is None:
            continue
        folder = path.parent
        if path.is_dir():
            raise UsageError(f"{flag} {path}: is a folder, not a file")
        if not folder.is_dir():
            why = "is not a folder" if folder.exists() else "does not exist"
            raise UsageError(f"{flag} {path}: cannot write {what}: the folder {folder} {why}")
        if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise UsageError(f"{flag} {path}: cannot write {what}: permission denied")
    viz = getattr(args, "viz", None)
    if viz is None:
        return
    if viz.exists() and not viz.is_dir():
        raise UsageError(f"--viz {viz}: is a file, not a folder: give a folder for the pictures")
    above = next(p for p in (viz, *viz.absolute().parents) if p.exists())
    if not above.is_dir():
        raise UsageError(f"--viz {viz}: cannot write the pictures: {above} is a file, not a folder")
    if not os.access(above, os.W_OK):
        raise UsageError(f"--viz {viz}: cannot write the pictures: permission denied in {above}")


def _distinct_paths(paths: list[tuple[str, Path | None]]) -> None:
    """Raise ``UsageError`` when two of ``paths`` (flag, path; None: not given) name the same path, naming both
    flags; the first entry is the input (``TRACE``): an output naming it would overwrite it."""
    given = [(flag, path) for flag, path in paths if path is not None]
    for i, (flag, path) in enumerate(given):
        for other, opath in given[:i]:
            if same_path(path, opath):
                if other == "TRACE":
                    raise UsageError(f"{flag} {path} is the input trace: writing it would overwrite the trace; give "
                                     "the output its own path")
                raise UsageError(f"{other} {opath} and {flag} {path} name the same path: one output would "
                                 "overwrite the other; give each output its own path")


def _list_devices_alone(args: argparse.Namespace, run: _Parser) -> None:
    """``run --list-devices`` takes no TRACE and no flag but ``--json`` and ``--debug``: it runs nothing, so a
    flag given with it would be ignored silently. Raises ``UsageError`` naming what was given."""
    if args.trace is not None:
        run.error(f"--list-devices lists the OpenCL devices and takes no TRACE (got {str(args.trace)!r})")
    given = [a.option_strings[0] for a in run._actions if a.option_strings and a.dest not in
             {"help", "list_devices", "json", "debug"} and getattr(args, a.dest, a.default) != a.default]
    if given:
        run.error(f"--list-devices takes no other flag than --json and --debug (got {', '.join(given)})")


def build_parser() -> _Parser:
    """The argparse parser of ``mtlir`` with its two commands."""
    p = _Parser(prog="mtlir", description="Lower GPU queue operations to the Objective-C messages of Apple Metal "
                                          "and run them on real or simulated Metal.")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp: argparse.ArgumentParser, trace_nargs: str | None = None) -> None:
        sp.add_argument("trace", type=Path, nargs=trace_nargs,
                        help="a recorded kernel queue (JSON, examples/traces/*.json)")
        sp.add_argument("--arch", type=_arch, metavar="{apple7,apple8,apple9,mac2}",
                        help="GPU family, any case (default: the trace's arch)")
        sp.add_argument("--target", choices=["arm64", "x86_64"], help="ABI of objc_msgSend (default: this machine's)")
        sp.add_argument("--viz", type=_viz_dir, metavar="DIR",
                        help="write one SVG per stage into DIR (made, with the folders above it, when missing)")
        sp.add_argument("--html", type=Path, metavar="FILE", help="write one self-contained HTML page of the lowering "
                                                                  "(every stage, setup, ICB, messages) to FILE")
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
    lo.add_argument("--pipeline", action=_JoinPipeline, metavar="P",
                    help="the pass pipeline, passes separated by ',' (default: the standard one for --target); given "
                         "several times, the pipelines run one after the other")
    lo.add_argument("--print-after-all", action="store_true", help="print every stage to stderr")
    lo.add_argument("--setup", action="store_true", help="list the messages link sends once instead of one submit's")

    run = sub.add_parser("run", help="lower, link, submit, and check the output against the trace")
    common(run, trace_nargs="?")  # optional only for --list-devices: main requires it otherwise
    run.add_argument("--device", choices=["auto", "sim", "metal"], default="auto",
                     help="auto: metal on macOS with Metal, else the simulated device")
    run.add_argument("--faithful", action="store_true",
                     help="simulated device: behave as Metal without its validation layer (default: strict)")
    run.add_argument("--repeat", type=positive_int("at least one submit"), default=1, metavar="N",
                     help="number of submits (default 1)")
    run.add_argument("--timeout", type=_positive_seconds, default=60.0, metavar="S",
                     help="seconds to wait for the GPU (default 60); past it the run fails with exit 3")
    run.add_argument("--profile", type=Path, metavar="FILE",
                     help="write a profile of the run (Chrome trace event JSON: Perfetto, chrome://tracing) to FILE")
    run.add_argument("--opencl-device", type=_opencl_device, metavar="NAME|INDEX",
                     help="simulated device: run the kernels on this OpenCL device, an index or a substring of its "
                          "platform or device name (default: the first; mtlir run --list-devices lists them)")
    run.add_argument("--inject-fault", type=_fault, action="append", default=[], metavar="K:NAME",
                     help="simulated device: make the K-th command buffer the run commits (0 the first "
                          "submit's first; K counts on through later submits) fail with that "
                          "MTLCommandBufferError (Timeout, PageFault, NotPermitted, OutOfMemory, InvalidResource, "
                          "or its code), K:hang for a kernel that never finishes, alloc:buffer|icb|pipeline[:N] for "
                          "an allocation that returns nil; may be given several times (docs/reliability.md)")
    run.add_argument("--order-seed", type=int, metavar="N",
                     help="simulated device: run the ICB commands between two barriers shuffled from seed N (an int "
                          ">= 0) instead of last first, and the command queues in a shuffled order (docs/simulator.md)")
    run.add_argument("--check-kernels", action="store_true",
                     help="simulated device: run every kernel, without mtlir's bounds checks, on Oclgrind first; an "
                          "out-of-bounds access or a data race it reports is an error naming the kernel, the MSL line "
                          "and the problem (exit 3; needs Debian's package oclgrind, make oclgrind)")
    run.add_argument("--list-devices", action="store_true",
                     help="list the OpenCL devices the simulated device can run kernels on, and exit (no TRACE)")
    run.set_defaults(pipeline=None, print_after_all=False)
    tr = sub.add_parser("translate", help="print the OpenCL C the simulated device runs for the trace's kernels")
    tr.add_argument("trace", type=Path, help="a recorded kernel queue (JSON, examples/traces/*.json)")
    tr.add_argument("--kernel", metavar="NAME", help="only this kernel (its key or its MSL function name)")
    tr.add_argument("--no-bounds-checks", action="store_true",
                    help="leave out the bounds checks added to every buffer access (easier to read; not what runs)")
    tr.add_argument("--debug", action="store_true", help="show the traceback of an error")
    p.commands["translate"] = tr
    opt = sub.add_parser("opt", help="run passes on a graph in the text form and print the result (as mlir-opt)")
    opt.add_argument("file", type=Path, metavar="FILE", help="a graph in the text form (mtlir.ir.render); - for stdin")
    opt.add_argument("-p", "--pipeline", action=_JoinPipeline, required=True, metavar="P",
                     help="the passes, separated by ',', e.g. encode,abi{target=arm64}; -p given several times "
                          "runs them in order (-p encode -p barriers is -p encode,barriers)")
    opt.add_argument("--print-after-all", action="store_true", help="print every stage to stderr")
    opt.add_argument("--debug", action="store_true", help="show the traceback of an error")
    p.commands.update(lower=lo, run=run, opt=opt, record=add_record_parser(sub))
    return p


def _version() -> str:
    """The installed distribution's version (``mtlir.__version__``: the package metadata)."""
    import mtlir
    return str(mtlir.__version__)


def main(argv: list[str] | None = None, *, out: TextIO | None = None, log: TextIO | None = None,
         lower_trace: LowerTrace = lower_trace, make_bridge: MakeBridge = make_bridge,
         metal_available: Callable[[], bool] = metal_available, metal_bridge: Callable[[], Any] = metal_bridge) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code (module docstring).
    ``out``/``log`` default to stdout/stderr. The commands get their collaborators from here: ``lower_trace``
    lowers the trace (``mtlir.cli.lower.lower_trace``), ``make_bridge`` makes the device ``run`` runs on
    (``mtlir.cli.run.make_bridge``), ``metal_available`` and ``metal_bridge`` say whether this machine has Metal
    and open it (``mtlir.cli.run``); a test passes stand-ins.

    Called with ``argv=None`` it is the program itself (the ``mtlir`` console script, ``python -m mtlir.cli.main``): when
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
                parser = build_parser()
                args = parser.parse(argv)
                if args.command == "run" and args.list_devices:  # the one form of run without a TRACE
                    _list_devices_alone(args, parser.commands["run"])
                    code = cmd_list_devices(out, args.json)
                    out.flush()
                    return code
                if args.command == "run" and args.trace is None:
                    parser.commands["run"].error("the following arguments are required: trace")
                if args.command in ("lower", "run"):
                    check_outputs(args)
                if args.command == "lower":
                    code = cmd_lower(args, out, log, lower_trace=lower_trace)
                elif args.command == "translate":
                    code = cmd_translate(args, out, log)
                elif args.command == "opt":
                    code = cmd_opt(args, out, log)
                elif args.command == "record":
                    code = cmd_record(args, out, log)
                else:
                    code = cmd_run(args, out, log, lower_trace=lower_trace, make_bridge=make_bridge,
                                   metal_available=metal_available, metal_bridge=metal_bridge)
                out.flush()  # a closed or full stdout shows here, inside the handlers below
            except _VersionRequested:
                version = _version()
                print(json.dumps({"version": version}) if json_mode else f"mtlir {version}", file=out)
                out.flush()
                code = 0
            except KeyboardInterrupt:  # Ctrl-C: one line (and with --json the one object), exit 130
                code = _interrupted(args, json_mode, out, log)
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


if __name__ == "__main__":
    sys.exit(main())
