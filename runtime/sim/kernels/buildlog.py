"""An OpenCL build log read as compiler errors (``kernels``): ``build_error`` makes the error the simulated device
raises when OpenCL cannot build the translation of an MSL library: ``InvalidMslError`` (the MSL is invalid: every
error maps back to a place of the MSL through the translation's line map, quoted with a caret) or
``KernelBuildError`` (the translator's code is refused: each error with its line of the translated source); the
message says what failed in one line, then the first errors.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from mtlir.errors import InvalidMslError, KernelBuildError

__all__ = ["build_error", "build_errors", "SHOWN_ERRORS"]

SHOWN_ERRORS = 3  # compiler errors the message shows, each with its line of the translation

_BUILD_ERROR = re.compile(r"^(?:(?:fatal )?error:\s*)?\S*?:(\d+):(\d+):\s*(?:(?:fatal )?error:\s*)?(.*)$")


def build_error(kernels: tuple[str, ...], log: str, source: str, *, msl: str = "",
                position: Callable[[int, int], tuple[int, int] | None] | None = None
                ) -> KernelBuildError | InvalidMslError:
    """The error for OpenCL's build ``log`` of ``source`` (the translation of the MSL library ``msl`` defining
    ``kernels``). When every error with a place maps back to the MSL through ``position`` (the translation's line
    map, ``Translation.msl_position``), the MSL is invalid: an ``InvalidMslError`` (exit 2) whose errors are MSL
    lines and columns, the first quoted with a caret. Otherwise the translator made code OpenCL refuses: a
    ``KernelBuildError`` (exit 4) whose ``summary`` names the kernels and the first error (or the start of the log
    when it names none), its message adding the first ``SHOWN_ERRORS`` errors with their lines of ``source``."""
    errors = build_errors(log)
    mapped = _in_msl(errors, msl, position)
    if mapped is not None:
        return _invalid_msl(kernels, log, source, msl, mapped)
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


def _in_msl(errors: list[tuple[int | None, int | None, str]], msl: str,
            position: Callable[[int, int], tuple[int, int] | None] | None
            ) -> list[tuple[int | None, int | None, str]] | None:
    """``errors`` with MSL lines and columns, when there is at least one and each one with a place maps into the
    MSL; else None."""
    if position is None or not msl or not any(line is not None for line, _, _ in errors):
        return None
    out: list[tuple[int | None, int | None, str]] = []
    for line, col, text in errors:
        if line is None:
            out.append((None, None, text))
            continue
        where = position(line, col or 1)
        if where is None:
            return None
        out.append((where[0], where[1], text))
    return out


def _invalid_msl(kernels: tuple[str, ...], log: str, source: str, msl: str,
                 errors: list[tuple[int | None, int | None, str]]) -> InvalidMslError:
    """The ``InvalidMslError`` of ``errors`` (MSL places): one line for the first, then each shown error quoted
    from the MSL with a caret, as clang does."""
    lines = msl.splitlines()

    def quote(line: int | None, col: int | None) -> str:
        if line is None or not 0 < line <= len(lines):
            return ""
        text = lines[line - 1].expandtabs(1)
        return f"{line:5d} | {text.rstrip()}\n      | {' ' * ((col or 1) - 1)}^"

    def where(line: int | None, col: int | None, text: str) -> str:
        return f"MSL line {line}, column {col}: {text}" if line is not None else text
    more = len(errors) - 1
    summary = (f"invalid MSL in kernel(s) {', '.join(kernels) or '(none)'}: {where(*errors[0])}"
               + (f" (and {more} more error{'s' if more > 1 else ''})" if more > 0 else ""))
    first = quote(errors[0][0], errors[0][1])
    shown = [first] if first else []
    for line, col, text in errors[1:SHOWN_ERRORS]:
        shown.append(f"  {where(line, col, text)}")
        if q := quote(line, col):
            shown.append(q)
    if len(errors) > SHOWN_ERRORS:
        shown.append(f"  ... {len(errors) - SHOWN_ERRORS} more")
    return InvalidMslError("\n".join([summary, *shown]), kernels=tuple(kernels), log=log, source=source,
                           errors=errors, summary=summary, quote=first)


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
