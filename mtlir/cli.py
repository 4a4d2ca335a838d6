"""The command line: ``mtlir lower`` (the listing of one submit) and ``mtlir run`` (the main job).

``mtlir lower TRACE.json [--arch apple7|apple8|apple9|mac2] [--no-residency-set] [--no-icb] [--target arm64|x86_64]
[--pipeline P] [--print-after-all] [--viz DIR] [--json]`` lowers a recorded kernel queue and prints the Program.
With ``--json`` it prints one JSON object, ``{"messages": [...], ...}``: the messages one submit sends, in order,
recorded by running the Program against a ``RecordingBridge`` (loops unrolled, no link-time messages, no waits).

``mtlir run TRACE.json [--device auto|sim|metal] [--arch ...] [--target ...] [--faithful] [--viz DIR] [--repeat N]
[--json]`` lowers, links, submits N times, reads the output and compares it with the trace's expected output as
float32 (rtol 1e-4, atol 1e-5). ``--json``: one object ``{"match", "max_abs_err", "kernels",
"messages_per_submit", "submits", ...}`` on stdout, everything else on stderr.

Exit codes: 0 match (or a successful ``lower``), 1 mismatch, 2 bad input (trace, flags, pipeline, ABI, link),
3 GPU execution error (a command buffer in status Error, a Metal validation error, a wait past its timeout),
4 a kernel the simulated device cannot run yet, 5 an internal error. Errors are one line on stderr;
``--debug`` adds the traceback. With ``--json`` an error still writes one object to stdout:
``{"error": message, "error_type": name, "exit_code": code}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn, TextIO

__all__ = ["main", "build_parser", "format_message", "lower_trace", "default_pipeline", "record_one_submit",
           "EXIT_MATCH", "EXIT_MISMATCH", "EXIT_BAD_INPUT", "EXIT_GPU_ERROR", "EXIT_UNSUPPORTED", "EXIT_INTERNAL"]

EXIT_MATCH, EXIT_MISMATCH, EXIT_BAD_INPUT, EXIT_GPU_ERROR, EXIT_UNSUPPORTED, EXIT_INTERNAL = range(6)
RTOL, ATOL = 1e-4, 1e-5
ARCHS = {"apple7": "Apple7", "apple8": "Apple8", "apple9": "Apple9", "mac2": "Mac2"}


class UsageError(ValueError):
    """A bad flag or a flag combination that cannot work (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``mtlir`` with its two commands."""
    p = _Parser(prog="mtlir", description="Lower GPU queue operations to the Objective-C messages of Apple Metal "
                                          "and run them on real or simulated Metal.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("trace", type=Path, help="a recorded kernel queue (JSON, examples/traces/*.json)")
        sp.add_argument("--arch", choices=sorted(ARCHS), help="GPU family (default: the trace's arch)")
        sp.add_argument("--target", choices=["arm64", "x86_64"], help="ABI of objc_msgSend (default: this machine's)")
        sp.add_argument("--viz", type=Path, metavar="DIR", help="write one SVG per stage into DIR")
        sp.add_argument("--json", action="store_true", help="one JSON object on stdout, everything else on stderr")
        sp.add_argument("--debug", action="store_true", help="show the traceback of an error")
        sp.add_argument("--executor", choices=["compiled", "interpreter"], default="compiled",
                        help="how the Program runs (default: compiled replay)")

    lo = sub.add_parser("lower", help="print the Program (or the messages) of one submit")
    common(lo)
    lo.add_argument("--no-residency-set", action="store_true", help="a device without MTLResidencySet (macOS < 15)")
    lo.add_argument("--no-icb", action="store_true", help="a device without indirect command buffers (direct path)")
    lo.add_argument("--pipeline", metavar="P", help="the pass pipeline (default: the standard one for --target)")
    lo.add_argument("--print-after-all", action="store_true", help="print every stage to stderr")
    lo.set_defaults(func=cmd_lower)

    run = sub.add_parser("run", help="lower, link, submit, and check the output against the trace")
    common(run)
    run.add_argument("--device", choices=["auto", "sim", "metal"], default="auto",
                     help="auto: metal on macOS with Metal, else the simulated device")
    run.add_argument("--faithful", action="store_true",
                     help="simulated device: behave as Metal without its validation layer (default: strict)")
    run.add_argument("--repeat", type=int, default=1, metavar="N", help="number of submits (default 1)")
    run.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds to wait for the GPU")
    run.set_defaults(func=cmd_run, no_residency_set=False, no_icb=False, pipeline=None, print_after_all=False)
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


def default_pipeline(target: str) -> str:
    """The standard pass pipeline for ``target``."""
    return f"encode,lower-timeline,symbolic,abi{{target={target}}},linearize"


def lower_trace(trace: Any, device: Any, target: str, *, pipeline: str | None = None, print_after_all: bool = False,
                log: TextIO | None = None, keep_stages: bool = True) -> Any:
    """Lower a loaded trace (``mtlir.trace.Trace``) for ``device`` (a ``DeviceSpec``) and ``target``: the
    ``Lowered`` of ``pipeline`` (default: ``default_pipeline(target)``). Raises what the passes raise."""
    from mtlir.passes import lower
    return lower(trace.queue(device), target=target, pipeline=pipeline, print_after_all=print_after_all, out=log,
                 keep_stages=keep_stages)


def _lower(args: argparse.Namespace, log: TextIO) -> tuple[Any, Any, str]:
    """Load the trace and lower it: (trace, Lowered, target)."""
    from mtlir.metal import DeviceSpec
    from mtlir.trace import load_trace
    target = _target(args)
    trace = load_trace(args.trace)
    device = DeviceSpec(ARCHS[args.arch] if args.arch else trace.arch, residency_set=not args.no_residency_set,
                        icb=not args.no_icb)
    lowered = lower_trace(trace, device, target, pipeline=args.pipeline, print_after_all=args.print_after_all,
                          log=log, keep_stages=args.viz is not None)
    if args.viz is not None:
        _write_pictures(lowered.stages, args.viz, log)
    return trace, lowered, target


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


def record_one_submit(program: Any, values: dict[str, int], target: str) -> list[dict[str, Any]]:
    """The messages one submit of ``program`` sends, recorded on a standalone ``RecordingBridge``."""
    from mtlir.runtime import RecordingBridge, Session
    with Session(program, RecordingBridge(target=target)) as s:
        return s.record_submit(**values)


# ---- commands


def cmd_lower(args: argparse.Namespace, out: TextIO, log: TextIO) -> int:
    """``mtlir lower``: the listing (or with --json the messages) of one submit."""
    trace, lowered, target = _lower(args, log)
    program = lowered.program
    if args.json:
        messages = record_one_submit(program, trace.values, target)
        doc = {"messages": messages, "count": len(messages), "workload": trace.workload,
               "arch": program.device.family, "target": target, "residency_set": program.device.residency_set,
               "icb": program.device.icb, "kernels": len(trace.dispatches), "pipeline": str(lowered.pipeline)}
        json.dump(doc, out)
        out.write("\n")
    else:
        print(program.listing() if hasattr(program, "listing") else "\n".join(map(repr, program.instrs)), file=out)
        for d in lowered.diagnostics:
            print(f"mtlir: note: {d}", file=log)
    return EXIT_MATCH


def _make_bridge(kind: str, target: str, faithful: bool, program: Any) -> tuple[Any, str]:
    """The Bridge for ``--device`` (auto: metal on macOS with Metal, else sim) and the device's name."""
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
        return mtl.MetalBridge(), "metal"
    from mtlir.runtime.sim.device import SimDevice
    dev = program.device
    return (SimDevice(target, strict=not faithful, family=dev.family, residency_sets=dev.residency_set, icb=dev.icb),
            "sim (faithful)" if faithful else "sim")


def cmd_run(args: argparse.Namespace, out: TextIO, log: TextIO) -> int:
    """``mtlir run``: lower, link, submit ``--repeat`` times, compare the output with the trace's."""
    import numpy as np

    from mtlir.runtime import Session
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: at least one submit")
    trace, lowered, target = _lower(args, log)
    program = lowered.program
    values = trace.values
    messages = record_one_submit(program, values, target)  # what one submit sends, as `lower --json` records it
    bridge, device_name = _make_bridge(args.device, target, args.faithful, program)
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
    gpu = [t for rec in s.completed for t in rec.gpu_times]
    host_s = s.host_s_per_submit
    expected = o.expected_array().astype(np.float32)
    err = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    max_abs_err = float(np.nanmax(err)) if err.size else 0.0
    match = bool(np.allclose(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True))
    kernels = len(trace.dispatches)
    listing = log if args.json else out
    print(f"; one submit of {trace.workload} ({program.device.family}, {target}, {device_name}): "
          f"{len(messages)} messages", file=listing)
    for m in messages:
        print(format_message(m), file=listing)
    print(f"kernels: {kernels}, messages per submit: {len(messages)}, submits: {s.submits}, "
          f"host time per submit: {host_s * 1e6:.1f} us ({args.executor}), "
          f"result: {'match' if match else 'MISMATCH'} (max abs err {max_abs_err:.3g})", file=listing)
    if args.json:
        doc = {"match": match, "max_abs_err": max_abs_err, "kernels": kernels, "messages_per_submit": len(messages),
               "submits": s.submits, "workload": trace.workload, "arch": program.device.family, "target": target,
               "device": device_name, "executor": args.executor, "host_s_per_submit": host_s,
               "gpu_s_per_submit": (sum(e - b for b, e in gpu) / len(s.completed)) if s.completed else None,
               "lower_s": lowered.seconds}
        json.dump(doc, out)
        out.write("\n")
    return EXIT_MATCH if match else EXIT_MISMATCH


# ---- errors and exit codes


def _exit_code(e: BaseException) -> int | None:
    """The exit code of an expected error; None for an internal error."""
    from mtlir.metal import AbiError
    from mtlir.runtime.errors import (BridgeError, GPUExecutionError, KernelCompileError, LinkError,
                                      MetalValidationError, UnsupportedKernelError)
    if isinstance(e, UnsupportedKernelError):
        return EXIT_UNSUPPORTED
    if isinstance(e, (GPUExecutionError, MetalValidationError, TimeoutError)):
        return EXIT_GPU_ERROR
    if isinstance(e, (UsageError, AbiError, LinkError, KernelCompileError, BridgeError, OSError)):
        return EXIT_BAD_INPUT
    bad_input = []
    for mod, name in (("mtlir.trace", "TraceError"), ("mtlir.queue", "QueueError"),
                      ("mtlir.passes.pipeline", "PipelineError"), ("mtlir.passes.verify", "VerifyError")):
        try:
            bad_input.append(getattr(__import__(mod, fromlist=[name]), name))
        except Exception:  # a module that does not import cannot have raised e
            pass
    if isinstance(e, tuple(bad_input)):
        return EXIT_BAD_INPUT
    return None


def main(argv: list[str] | None = None, *, out: TextIO | None = None, log: TextIO | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code (module docstring).
    ``out``/``log`` default to stdout/stderr."""
    out = out or sys.stdout
    log = log or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args, out, log))
    except KeyboardInterrupt:
        print("mtlir: interrupted", file=log)
        return 130
    except BrokenPipeError:  # stdout closed early (`mtlir lower ... | head`): stop quietly, as a SIGPIPE would
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # every error becomes one line and an exit code
        code = _exit_code(e)
        if debug:
            traceback.print_exc(file=log)
        kind = "internal error" if code is None else "error"
        text = " ".join(str(e).split()) or type(e).__name__
        print(f"mtlir: {kind}: {type(e).__name__}: {text}" if code is None else f"mtlir: {kind}: {text}", file=log)
        code = EXIT_INTERNAL if code is None else code
        if "--json" in argv:  # the one JSON object stdout promises, saying what went wrong
            json.dump({"error": text, "error_type": type(e).__name__, "exit_code": code}, out)
            out.write("\n")
        return code


if __name__ == "__main__":
    sys.exit(main())
