"""The OpenCL compiler's output (``kernels``): what native code writes to file descriptor 2 while a program builds is
captured (``_native_stderr``), kept for the build error's message, and otherwise written back without the
compiler's ``N errors generated.`` lines (``_pass_on``).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator


class _Captured:
    text = ""


@contextlib.contextmanager
def _native_stderr() -> Iterator[_Captured]:
    """Capture what native code writes to file descriptor 2 meanwhile (PoCL's compiler prints ``1 error
    generated.`` there itself, past Python): the text is in the yielded object's ``text`` afterwards. Nothing is
    captured when fd 2 cannot be redirected."""
    got = _Captured()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield got
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield got
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            got.text = tmp.read().decode("utf-8", "replace")


def _pass_on(text: str) -> None:
    """Write captured stderr text back, without the compiler's ``N errors generated.`` lines (the text may hold
    other threads' output of the same moment)."""
    keep = [line for line in text.splitlines(keepends=True) if not _GENERATED.fullmatch(line.strip())]
    if keep:
        sys.stderr.write("".join(keep))


_GENERATED = re.compile(r"\d+ (?:errors?|warnings?)(?: and \d+ (?:errors?|warnings?))? generated\.")
