"""``mtlir record SCRIPT.py [ARGS...] -o TRACE.json [--arch apple7|apple9] [--expected cpu|python]``: run a tinygrad
program on mtlir's METAL device and write the kernel queue it ran as a trace that ``mtlir run`` replays
(``mtlir.tinygrad.record``; docs/tinygrad.md, "Recording"). The script defines ``main()`` returning the output
Tensor.

Arguments: record's own options (``-o``, ``--arch``, ``--expected``, ``--workload``, ``--debug``) may come before or
after the script; every other argument after the script is the script's (``--`` passes all that follow to it).
Needs the optional extra tinygrad (``pip install mtlir[tinygrad]``): it is imported here, inside the command, so the
rest of the command line works without it. Exit codes as ``mtlir.cli.main``: 2 for a script that fails, has no
``main()`` or no kernel writing its output (``RecordError``), or without tinygrad.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from mtlir.cli.report import UsageError, same_path

__all__ = ["add_parser", "cmd_record", "split_script_args"]

_OWN_WITH_VALUE = ("-o", "--output", "--arch", "--expected", "--workload")
_FAMILIES = {"apple7": "Apple7", "apple8": "Apple8", "apple9": "Apple9"}


def add_parser(sub: Any) -> Any:
    """The ``record`` subcommand's parser (``sub``: the subparsers of ``mtlir``)."""
    rec = sub.add_parser("record", help="run a tinygrad script on mtlir's METAL device and write its kernel queue as "
                                        "a trace (needs tinygrad)")
    rec.add_argument("script", type=Path, help="a tinygrad program defining main() -> Tensor (examples/tinygrad/)")
    rec.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    rec.add_argument("-o", "--output", type=Path, metavar="TRACE.json", help="where to write the trace (required)")
    rec.add_argument("--arch", type=str.lower, choices=sorted(_FAMILIES), help="the GPU family the kernels are "
                     "rendered for (default apple9; apple7 renders without SIMD-group matrices, as examples/traces)")
    rec.add_argument("--expected", type=str.upper, choices=["CPU", "PYTHON"],
                     help="tinygrad device of the expected output (default: CPU with clang installed, else PYTHON)")
    rec.add_argument("--workload", help="the trace's workload name (default: the script's name)")
    rec.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return rec


def split_script_args(args: argparse.Namespace) -> None:
    """Moves record's own options found after the script (``args.args``) onto ``args``; stops at ``--``, which is
    dropped. Raises ``UsageError`` for an option of record's without its value."""
    rest = list(args.args)
    script_args: list[str] = []
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok == "--":
            script_args.extend(rest[i + 1:])
            break
        name, eq, value = tok.partition("=")
        if name in _OWN_WITH_VALUE:
            if not eq:
                if i + 1 >= len(rest):
                    raise UsageError(f"record: {name} needs a value")
                value, i = rest[i + 1], i + 1
            dest = {"-o": "output", "--output": "output"}.get(name, name.lstrip("-"))
            if dest == "arch" and value.lower() not in _FAMILIES:
                raise UsageError(f"record: --arch {value!r}: choose from {', '.join(sorted(_FAMILIES))}")
            if dest == "expected" and value.upper() not in ("CPU", "PYTHON"):
                raise UsageError(f"record: --expected {value!r}: choose from cpu, python")
            setattr(args, dest, Path(value) if dest == "output" else value.lower() if dest == "arch" else
                    value.upper() if dest == "expected" else value)
        elif tok == "--debug":
            args.debug = True
        else:
            script_args.append(tok)
        i += 1
    args.args = script_args


def cmd_record(args: argparse.Namespace, out: TextIO, log: TextIO) -> int:
    """Record ``args.script`` to ``args.output``; prints one line (dispatches, buffers, the file) to ``out``.
    Raises ``UsageError`` without ``-o``, for an ``-o`` whose folder does not exist or that names the script
    (checked before recording), or without tinygrad; ``RecordError`` as ``mtlir.tinygrad.record``."""
    split_script_args(args)
    if args.output is None:
        raise UsageError("record: -o TRACE.json is required")
    if not args.output.parent.is_dir():
        raise UsageError(f"record: -o {args.output}: no folder {args.output.parent} to write the trace in")
    if args.output.is_dir():
        raise UsageError(f"record: -o {args.output}: is a folder, not a file")
    if same_path(args.output, args.script):
        raise UsageError(f"record: -o {args.output} is the SCRIPT: writing the trace would overwrite the script; "
                         "give the trace its own path")
    try:
        import tinygrad  # noqa: F401
    except ImportError:
        raise UsageError("record: needs tinygrad (pip install 'mtlir[tinygrad]')") from None
    import mtlir.tinygrad  # noqa: F401  (registers the METAL device before tinygrad opens one)
    from mtlir.tinygrad.record import record
    family = _FAMILIES[args.arch] if args.arch else None
    trace = record(args.script, args.args, args.output, family=family, expected=args.expected,
                   workload=args.workload)
    print(f"recorded {args.script}: {len(trace['dispatches'])} dispatches, {len(trace['programs'])} programs, "
          f"{len(trace['buffers'])} buffers ({trace['arch']}) -> {args.output}", file=out)
    return 0
