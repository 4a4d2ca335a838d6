"""Errors the runtime and the devices raise."""
from __future__ import annotations

import re

__all__ = ["BridgeError", "MetalValidationError", "GPUExecutionError", "UnsupportedKernelError", "LinkError",
           "KernelCompileError", "KernelBuildError", "KernelAccessError", "locate"]


class BridgeError(RuntimeError):
    """A call a Bridge refuses: unknown selector or object, an argument that does not fit the prototype (a
    64-bit value cut to 32 bits, an MTLSize by value on arm64), a call into freed memory."""


class MetalValidationError(RuntimeError):
    """Misuse of Metal caught at the offending call, as Metal's API validation layer (MTL_DEBUG_LAYER=1) does;
    the message is Metal's where it is known (METAL.md §3)."""


class GPUExecutionError(RuntimeError):
    """A command buffer ended in status Error: ``code`` is the MTLCommandBufferError value, ``name`` its name."""

    def __init__(self, message: str, code: int, name: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name


class UnsupportedKernelError(RuntimeError):
    """MSL the simulated device cannot translate yet; ``construct`` names it (e.g. ``simdgroup_float8x8``)."""

    def __init__(self, message: str, construct: str = "") -> None:
        super().__init__(message)
        self.construct = construct


class KernelCompileError(RuntimeError):
    """A kernel's MSL could not be compiled: MSL that is not valid at the token level, a missing kernel function,
    or (``KernelBuildError``) an OpenCL build failure of its translation."""


class KernelBuildError(KernelCompileError):
    """OpenCL could not build the translation of MSL ``kernels``: the simulated device cannot run them. Either the
    MSL is invalid or it uses something the translator does not handle; from the translation alone the two cannot
    be told apart, so the simulated device raises this (the CLI exits with 4) rather than answer as Metal would.

    ``log`` is OpenCL's whole build log and ``source`` the translated OpenCL C; ``errors`` the compiler's errors
    as ``(line, column, text)`` in the translation (line and column None when the log gives none). The message is
    one line saying what failed (``summary``, what the CLI prints), then the first errors (at most
    ``SHOWN_ERRORS``), each with its line of the translated source."""

    SHOWN_ERRORS = 3

    def __init__(self, kernels: tuple[str, ...], log: str, source: str) -> None:
        self.kernels, self.log, self.source = tuple(kernels), log, source
        self.errors = _build_errors(log)
        names = ", ".join(self.kernels) or "(none)"
        first = (_error_text(*self.errors[0]) if self.errors
                 else " ".join(log.split())[:200] or "no build log")
        more = len(self.errors) - 1
        self.summary = (f"the simulated device could not build the OpenCL translation of kernel(s) {names}: the MSL "
                        f"may be invalid or use something the translator does not handle (docs/kernels.md): {first}"
                        + (f" (and {more} more error{'s' if more > 1 else ''})" if more > 0 else ""))
        lines = source.splitlines()
        shown = []
        for line, col, text in self.errors[:self.SHOWN_ERRORS]:
            shown.append(f"  {_error_text(line, col, text)}")
            if line is not None and 0 < line <= len(lines):
                shown.append(f"    {line:4d} | {_around(lines[line - 1], col or 1)}")
        if len(self.errors) > self.SHOWN_ERRORS:
            shown.append(f"  ... {len(self.errors) - self.SHOWN_ERRORS} more")
        super().__init__("\n".join([self.summary, *shown,
                                     "  (the whole build log is in .log, the translated source in .source)"]))


_BUILD_ERROR = re.compile(r"^(?:(?:fatal )?error:\s*)?\S*?:(\d+):(\d+):\s*(?:(?:fatal )?error:\s*)?(.*)$")


def _build_errors(log: str) -> list[tuple[int | None, int | None, str]]:
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


def locate(error: BaseException, where: str) -> BaseException:
    """Prefix ``error``'s message (and its one-line ``summary``, if any) with ``where`` (e.g. ``program 'k',
    kernel function 'k'``), once; sets ``error.where``. Returns ``error`` for ``raise``."""
    if getattr(error, "where", None):
        return error
    setattr(error, "where", where)
    if error.args:
        error.args = (f"{where}: {error.args[0]}", *error.args[1:])
    summary = getattr(error, "summary", None)
    if isinstance(summary, str):
        setattr(error, "summary", f"{where}: {summary}")
    return error


class KernelAccessError(RuntimeError):
    """A kernel reached memory outside the MTLBuffer bound to one of its parameters; the simulated device's bounds
    checks skipped the access (docs/kernels.md) and this reports the first one. ``function`` is the kernel,
    ``param`` the parameter's MSL name and ``index`` its Metal buffer index, ``write`` whether it was a store,
    ``offset`` the access's byte offset from the start of the parameter's view (negative: before it),
    ``element`` that offset in elements of the parameter's type (None when the element size is unknown),
    ``size`` the bytes accessed, ``buffer_bytes`` the MTLBuffer's length and ``view_offset`` where the view
    starts in it. Metal reports such an access as a GPU fault (PageFault) or, within the allocation's pages, not
    at all. ``memory`` is ``buffer``, or ``threadgroup``/``thread`` for an access past one of the kernel's own
    fixed-size arrays (then ``param`` names the array, ``index`` is -1 and ``offset`` counts from its start)."""

    def __init__(self, message: str, *, function: str, param: str, index: int, write: bool, offset: int,
                 element: int | None, size: int, buffer_bytes: int, view_offset: int, memory: str = "buffer") -> None:
        super().__init__(message)
        self.function, self.param, self.index, self.write = function, param, index, write
        self.offset, self.element, self.size = offset, element, size
        self.buffer_bytes, self.view_offset, self.memory = buffer_bytes, view_offset, memory


class LinkError(RuntimeError):
    """link() could not create a device object (nil from Metal, a missing function, bad initial data)."""
