"""``mtlir translate TRACE.json [--kernel NAME] [--no-bounds-checks]``: the OpenCL C that the simulated device
compiles for the trace's kernels (``mtlir.runtime.sim.msl.translate.translate``), for users who want to see what
it runs.

Each kernel's MSL library is translated whole, as Metal compiles a library: one ``// kernel KEY (function F)``
header line, then its translation. ``--kernel`` picks one kernel by its key or its MSL function name;
``--no-bounds-checks`` leaves out the bounds checks the simulated device adds to every buffer access (easier to
read, not what runs). An unknown ``--kernel`` is a ``UsageError`` (exit 2) naming the kernels there are; MSL the
translator cannot translate raises what ``translate`` raises (``UnsupportedKernelError``: exit 4;
``KernelCompileError``: exit 2).
"""
from __future__ import annotations

import argparse
from typing import TextIO

from mtlir.cli.report import EXIT_MATCH, UsageError

__all__ = ["cmd_translate"]


def cmd_translate(args: argparse.Namespace, out: TextIO) -> int:
    """``mtlir translate``: print the OpenCL C translation of the trace's kernels (or of ``--kernel``)."""
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
    for i, k in enumerate(kernels):
        source = translate(k.msl, bounds_checks=not args.no_bounds_checks).source
        print(f"{'' if i == 0 else chr(10)}// kernel {k.key} (function {k.function})", file=out)
        out.write(source if source.endswith("\n") else source + "\n")
    return EXIT_MATCH
