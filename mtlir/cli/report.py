"""Errors and exit codes of the command line (``mtlir.cli.main``), and the stdout of a ``--json`` command.

Exit codes (``exit_code``, from the error family of ``mtlir.errors``): 0 match (or a successful ``lower``), 1
mismatch, 2 bad input, 3 GPU execution error (a command buffer in status Error, a Metal validation error, a wait
past its timeout), 4 something valid that mtlir cannot do: a kernel the simulated device cannot run (the translator
refuses it, or OpenCL does not build its translation), a picture Graphviz's ``dot`` cannot lay out within its
timeout (``GraphvizTimeoutError``: the trace and its lowering are fine, so it is not bad input, and not a bug of
mtlir either), 5 an internal error.
Errors are one line on stderr (``_report``; ``--debug`` adds the traceback); with ``--json`` an error still writes
one object to stdout, and while a ``--json`` command runs file descriptor 1 points at stderr (``_stdout_for_json``).
A stdout that cannot be written (``> /dev/full``) is one line on stderr and exit 2 (``_output_error``).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from mtlir.errors import BridgeError, DeviceError, InputError, LinkError, UnsupportedError

__all__ = ["UsageError", "exit_code", "EXIT_CODES", "EXIT_MATCH", "EXIT_MISMATCH", "EXIT_BAD_INPUT", "EXIT_GPU_ERROR",
           "EXIT_UNSUPPORTED", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "same_path"]

EXIT_MATCH, EXIT_MISMATCH, EXIT_BAD_INPUT, EXIT_GPU_ERROR, EXIT_UNSUPPORTED, EXIT_INTERNAL = range(6)


class UsageError(InputError, ValueError):
    """A bad flag or a flag combination that cannot work (exit code 2)."""


# the exit code of each root of the error family, in order: the first that an error is an instance of wins
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UnsupportedError, EXIT_UNSUPPORTED),  # first: a KernelBuildError is a KernelCompileError (an InputError) too
    (DeviceError, EXIT_GPU_ERROR),
    (TimeoutError, EXIT_GPU_ERROR),  # a wait past its timeout outside mtlir's own waits (WaitTimeoutError)
    (InputError, EXIT_BAD_INPUT),
    (LinkError, EXIT_BAD_INPUT),
    (BridgeError, EXIT_BAD_INPUT),
    (OSError, EXIT_BAD_INPUT),  # a file that cannot be read or written
)


def exit_code(e: BaseException) -> int | None:
    """The exit code of an expected error (``EXIT_CODES``, module docstring); None for an internal error (a bug):
    any other exception, ``MtlirError``s that say a bug (``ProgramError``, ``RuleError``, ``RewriteLoopError``)
    too.

    4: an ``UnsupportedError`` (``UnsupportedKernelError``, ``KernelBuildError``: the simulated device cannot run
    the kernel; ``GraphvizTimeoutError``: ``dot`` cannot draw a stage in time). 3: a ``DeviceError``
    (``GPUExecutionError``, ``MetalValidationError``) or ``TimeoutError``. 2 (bad input): an ``InputError`` (trace,
    queue, pipeline, a pass refusing the graph, flags, invalid MSL, ``--viz`` without Graphviz or with a broken one), ``LinkError``, ``BridgeError``, ``OSError`` (a file)."""
    return next((code for root, code in EXIT_CODES if isinstance(e, root)), None)


# a quoted source line and the caret under it, as clang (and InvalidMslError, through Metal's NSError) show them
_QUOTE = re.compile(r"^ *\d+ \| .*\n *\| *\^", re.M)


def _one_line(e: BaseException) -> str:
    """The error as one line: its ``summary`` when it has one (a ``KernelBuildError``), else its message without
    its quoted source lines (``_quote``) and with the whitespace collapsed, else its type's name."""
    summary = getattr(e, "summary", None)
    if isinstance(summary, str) and summary:
        return summary
    return " ".join(_QUOTE.sub("", str(e)).split()) or type(e).__name__


def _quote(message: str) -> str:
    """The first quoted source line with its caret in ``message`` (``  7 | int x = 1`` over ``    |     ^``),
    printed under the one-line error; "" when there is none."""
    m = _QUOTE.search(message)
    return m.group(0) if m else ""


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


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program Ctrl-C ended


def _interrupted(args: Any, json_mode: bool, out: TextIO, log: TextIO) -> int:
    """Ctrl-C: one line on ``log`` (for ``run``, how many of the ``--repeat`` submits completed: ``args``'s
    ``submits_completed``), with ``--json`` the one object on ``out`` (``"interrupted": true``); returns 130."""
    done = getattr(args, "submits_completed", None) if getattr(args, "command", None) == "run" else None
    text = "interrupted" if done is None else f"interrupted: {done} of {args.repeat} submits completed"
    print(f"mtlir: {text}", file=log)
    if json_mode:
        doc: dict[str, Any] = {"interrupted": True, "error": text, "error_type": "KeyboardInterrupt",
                               "exit_code": EXIT_INTERRUPTED}
        if done is not None:
            doc["submits_completed"] = done
        json.dump(doc, out)
        out.write("\n")
    return EXIT_INTERRUPTED


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
    quote = _quote(str(e))  # the user's source line with a caret under the place, as clang shows it
    if quote:
        print(quote, file=log)
    # an internal error (a bug) shows its notes: the rule, node and pass it came from (graph_rewrite, PassPipeline)
    notes = [" ".join(str(n).split()) for n in getattr(e, "__notes__", ())] if expected is None and not debug else []
    for note in notes:
        print(f"mtlir: note: {note}", file=log)
    failed = EXIT_INTERNAL if expected is None else expected
    if json_mode:  # the one JSON object stdout promises, saying what went wrong
        doc: dict[str, Any] = {"error": text, "error_type": type(e).__name__, "exit_code": failed}
        if notes:
            doc["notes"] = notes
        details = getattr(e, "details", None)  # GPUExecutionError: code, name, submit, command buffers
        if callable(details):
            doc.update({k: v for k, v in details().items() if k not in doc})
        json.dump(doc, out)
        out.write("\n")
    return failed


def same_path(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name the same file or folder (after ``..``, symbolic links and relative paths are
    resolved; for two existing paths, the same inode, so hard links count too)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # a symbolic link loop, an unreadable folder: compare the text
        return os.path.abspath(a) == os.path.abspath(b)
