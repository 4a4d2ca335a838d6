"""``mtlir translate TRACE.json [--kernel NAME] [--no-bounds-checks]``: the OpenCL C that the simulated device
compiles for the trace's kernels (``mtlir.runtime.sim.msl.translate.translate``), for users who want to see what
it runs.

Each kernel's MSL library is translated whole, as Metal compiles a library: one ``// kernel KEY (function F)``
header line, then its translation. ``--kernel`` picks one kernel by its key or its MSL function name;
``--no-bounds-checks`` leaves out the bounds checks the simulated device adds to every buffer access (easier to
read, not what runs). An unknown ``--kernel`` is a ``UsageError`` (exit 2) naming the kernels there are; MSL the
translator cannot translate raises what ``translate`` raises (``UnsupportedKernelError``: exit 4;
``KernelCompileError``: exit 2).

Each translation is then built on the OpenCL device, as ``mtlir run`` builds it (``KernelRunner.compile``), so
MSL the translator passes through but a compiler refuses (an undeclared identifier) gives the error ``run`` gives:
``InvalidMslError`` at the MSL's line and column (exit 2), or ``KernelBuildError`` (exit 4). Nothing is printed
then. Without pyopencl or an OpenCL device the translations are printed unbuilt, with a note on stderr.
"""
from __future__ import annotations

import argparse
from typing import Any, TextIO

from mtlir.cli.report import EXIT_MATCH, UsageError

__all__ = ["cmd_translate"]


def cmd_translate(args: argparse.Namespace, out: TextIO, log: TextIO) -> int:
    """``mtlir translate``: print the OpenCL C translation of the trace's kernels (or of ``--kernel``), each built
    first (module docstring)."""
    from mtlir.frontend.trace import load_trace
    from mtlir.runtime.sim.msl.translate import translate
    try:
        trace = load_trace(args.trace)
    except OSError as e:
        raise UsageError(f"TRACE {args.trace}: cannot read the trace: {e.strerror or e}") from None
    kernels = list(trace.kernels.values())
    if args.kernel is not None:
        kernels = [k for k in kernels if args.kernel in (k.key, k.function)]
        if not kernels:
            there = ", ".join(f"{k.key} (function {k.function})" if k.key != k.function else k.key
                              for k in trace.kernels.values())
            raise UsageError(f"--kernel {args.kernel}: the trace has no kernel of that key or function name; it has "
                             f"{there}")
    runner = _runner(log)
    for k in kernels:
        translate(k.msl)  # the translator's own errors first, for every kernel, as run meets them
        if runner is not None:
            runner.compile(k.msl, k.function)
    for i, k in enumerate(kernels):
        source = translate(k.msl, bounds_checks=not args.no_bounds_checks).source
        print(f"{'' if i == 0 else chr(10)}// kernel {k.key} (function {k.function})", file=out)
        out.write(source if source.endswith("\n") else source + "\n")
    return EXIT_MATCH


def _runner(log: TextIO) -> Any:
    """The simulated device's kernel runner on the first OpenCL device (what ``run`` builds with by default), or
    None with a note on ``log`` when there is no pyopencl or no device."""
    from mtlir.errors import NoDeviceError
    from mtlir.runtime.sim.kernels.runner import KernelRunner
    try:
        return KernelRunner()
    except NoDeviceError as e:
        print(f"mtlir: note: the translations are not built (as run would build them): {e}", file=log)
        return None
