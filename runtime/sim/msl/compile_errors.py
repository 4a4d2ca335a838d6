"""MSL that Metal's compiler rejects but whose OpenCL C translation would build: refused before translating, as
Metal refuses it (``KernelCompileError``, reported through ``newLibraryWithSource:options:error:``'s NSError).

OpenCL C is a near relative of MSL, so a translation can build where Metal's compiler stops. The one such case
checked here: ``double``. MSL spec §2.1: "Metal does not support the double, long long, unsigned long long, and
long double data types"; OpenCL C has ``double`` (and ``double2`` ... ``double16``, cl_khr_fp64, which PoCL
supports), so a kernel using it would run on the simulated device and fail on a Mac. Metal's compiler answers
``error: 'double' is not supported in Metal`` at the first use: as a variable's, a parameter's, a cast's, a
template argument's or a function's type. ``double`` is a C++ keyword, never an identifier, so every ``double``
token is such a use; comments and string literals are not tokens, and ``doubled`` is another identifier. The
vector names ``double2`` ... ``double16`` are not MSL types (``unknown type name``) but are still valid
identifiers in MSL, so they are refused only where they stand as a type: after an address space or ``const``,
before a declared name, or alone in a cast's parentheses or a template's angle brackets. A ``#define`` whose body
has a ``double`` token (or names such a macro) is refused where the macro is used, as clang reports the error at
the expansion ("expanded from macro"); a macro never used is no error (the preprocessor drops it).

    >>> src = "kernel void k(device float* a) { double x = a[0]; }"
    >>> check_metal_types(tokenize(src), src)  # raises KernelCompileError:
    MSL line 1, column 34: 'double' is not supported in Metal: Metal has no 64-bit floating-point type ...
        1 | kernel void k(device float* a) { double x = a[0]; }
          |                                  ^
"""
from __future__ import annotations

from mtlir.errors import KernelCompileError
import re

from mtlir.runtime.sim.msl.lex import ID, PP, PUNCT, Token, tokenize

__all__ = ["check_metal_types", "compile_error"]

_DOUBLE_VECTORS = frozenset(f"double{n}" for n in (2, 3, 4, 8, 16))
_QUALIFIERS = frozenset({"device", "constant", "thread", "threadgroup", "threadgroup_imageblock", "ray_data",
                         "object_data", "const", "volatile", "static", "constexpr"})
_DEFINE = re.compile(r"#\s*define\s+([A-Za-z_][A-Za-z0-9_]*)(\([^)]*\))?(.*)", re.S)
_WHY_DOUBLE = ("Metal has no 64-bit floating-point type (MSL spec §2.1: \"Metal does not support the double ... "
               "data types\"); use float")


def check_metal_types(ts: list[Token], msl: str) -> None:
    """Raise ``KernelCompileError`` at the first ``double`` used as a type in the tokens ``ts`` of the MSL
    library ``msl`` (the module docstring says which uses), naming its line and column and quoting the line with a
    caret under it, as Metal's compiler reports it. A use of a macro whose body has ``double`` is such a use too
    (the error names the macro and the line it is defined on)."""
    macros: dict[str, Token] = {}  # macros whose expansion has a ``double``: name -> their #define
    for i, t in enumerate(ts):
        if t.kind == PP:
            _note_double_macro(t, macros)
            continue
        if t.kind != ID:
            continue
        if t.text == "double":
            raise compile_error(t, msl, f"'double' is not supported in Metal: {_WHY_DOUBLE}")
        define = macros.get(t.text)
        if define is not None:
            raise compile_error(t, msl, f"'double' is not supported in Metal (expanded from macro '{t.text}', "
                                        f"defined at line {define.line}): {_WHY_DOUBLE}")
        if t.text in _DOUBLE_VECTORS and _used_as_type(ts, i):
            raise compile_error(t, msl, f"unknown type name '{t.text}': {_WHY_DOUBLE}")


def _note_double_macro(t: Token, macros: dict[str, Token]) -> None:
    """Add the macro the directive ``t`` defines to ``macros`` when its body has a ``double`` token or names a macro
    already there (``#define REAL double``, ``#define VEC REAL4``-style chains); an ``#undef`` takes it out."""
    text = t.text.replace("\\\n", " ")
    undef = re.match(r"#\s*undef\s+([A-Za-z_][A-Za-z0-9_]*)", text)
    if undef is not None:
        macros.pop(undef.group(1), None)
        return
    m = _DEFINE.match(text)
    if m is None:
        return
    try:
        body = tokenize(m.group(3))
    except KernelCompileError:  # a body that is not tokens (the translator reports it where it is used)
        return
    if any(b.kind == ID and (b.text == "double" or b.text in macros) for b in body):
        macros[m.group(1)] = t
    else:
        macros.pop(m.group(1), None)  # redefined without double


def compile_error(t: Token, msl: str, text: str) -> KernelCompileError:
    """The ``KernelCompileError`` of ``text`` at token ``t`` of the MSL ``msl``: ``MSL line L, column C: text``,
    then the line quoted with a caret under the column (as clang, and ``InvalidMslError``, show it; the CLI prints
    the quote under its one-line error)."""
    lines = msl.splitlines()
    message = f"MSL {t.where()}: {text}"
    if 0 < t.line <= len(lines):
        line = lines[t.line - 1].expandtabs(1).rstrip()
        message += f"\n{t.line:5d} | {line}\n      | {' ' * (t.col - 1)}^"
    return KernelCompileError(message)


def _used_as_type(ts: list[Token], i: int) -> bool:
    """Whether the identifier at ``i`` stands where a type does: after an address space or ``const``, before a
    declared name, or alone between ``(`` and ``)`` (a cast) or ``<`` and ``>`` (a template argument). ``double2 *
    x`` alone stays a product: an identifier named ``double2`` is valid MSL."""
    after = ts[i + 1] if i + 1 < len(ts) else None
    before = ts[i - 1] if i else None
    if before is not None and before.kind == ID and before.text in _QUALIFIERS:
        return True
    if after is not None and after.kind == ID:
        return True
    pairs = {("(", ")"), ("<", ">")}
    return (before is not None and after is not None and before.kind == PUNCT and after.kind == PUNCT
            and (before.text, after.text) in pairs)
