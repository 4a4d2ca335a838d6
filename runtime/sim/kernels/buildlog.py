"""An OpenCL build log read as compiler errors (``kernels``): ``build_error`` makes the ``KernelBuildError`` the
simulated device raises when OpenCL cannot build the translation of an MSL library, its message saying what failed
in one line, then the first errors, each with its line of the translated source.
"""
from __future__ import annotations

import re

from mtlir.errors import KernelBuildError

__all__ = ["build_error", "build_errors", "SHOWN_ERRORS"]

SHOWN_ERRORS = 3  # compiler errors the message shows, each with its line of the translation

_BUILD_ERROR = re.compile(r"^(?:(?:fatal )?error:\s*)?\S*?:(\d+):(\d+):\s*(?:(?:fatal )?error:\s*)?(.*)$")


def build_error(kernels: tuple[str, ...], log: str, source: str) -> KernelBuildError:
    """The ``KernelBuildError`` for OpenCL's build ``log`` of ``source`` (the translation of MSL ``kernels``): its
    ``summary`` names the kernels and the first error (or the start of the log when it names none), its message
    adds the first ``SHOWN_ERRORS`` errors with their lines of ``source``."""
    errors = build_errors(log)
    names = ", ".join(kernels) or "(none)"
    first = _error_text(*errors[0]) if errors else " ".join(log.split())[:200] or "no build log"
    more = len(errors) - 1
    summary = (f"the simulated device could not build the OpenCL translation of kernel(s) {names}: the MSL "
               f"may be invalid or use something the translator does not handle (docs/kernels.md): {first}"
               + (f" (and {more} more error{'s' if more > 1 else ''})" if more > 0 else ""))
    lines = source.splitlines()
    shown = []
    for line, col, text in errors[:SHOWN_ERRORS]:
        shown.append(f"  {_error_text(line, col, text)}")
        if line is not None and 0 < line <= len(lines):
            shown.append(f"    {line:4d} | {_around(lines[line - 1], col or 1)}")
    if len(errors) > SHOWN_ERRORS:
        shown.append(f"  ... {len(errors) - SHOWN_ERRORS} more")
    message = "\n".join([summary, *shown, "  (the whole build log is in .log, the translated source in .source)"])
    return KernelBuildError(message, kernels=tuple(kernels), log=log, source=source, errors=errors, summary=summary)


def build_errors(log: str) -> list[tuple[int | None, int | None, str]]:
    """The compiler errors of an OpenCL build log as ``(line, column, text)``: Clang's ``path:L:C: error: text``
    and PoCL's ``error: path:L:C: text`` lines; other lines saying ``error`` without a place as ``(None, None,
    text)`` (the API's own ``clBuildProgram failed`` lines are not errors of the source)."""
    out: list[tuple[int | None, int | None, str]] = []
    for raw in log.splitlines():
        line = raw.strip()
        if "error" not in line.lower() or "clBuildProgram failed" in line or re.fullmatch(r"\d+ errors? generated\.",
                                                                                          line):
            continue
        m = _BUILD_ERROR.match(line)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), m.group(3).strip()))
        elif line.lower().startswith(("error", "fatal error")):
            out.append((None, None, line.split(":", 1)[-1].strip()))
    return out


def _around(text: str, col: int, width: int = 100) -> str:
    """At most ``width`` characters of a source line around 1-based column ``col``, ``...`` where cut."""
    if len(text) <= width:
        return text.rstrip()
    start = max(0, min(col - 1 - width * 2 // 3, len(text) - width))
    cut = text[start:start + width]
    return ("..." if start else "") + cut + ("..." if start + width < len(text) else "")


def _error_text(line: int | None, col: int | None, text: str) -> str:
    return f"line {line}, column {col} of the translation: {text}" if line is not None else text
