"""MSL that Metal's compiler rejects though its OpenCL C translation would build: ``double`` (MSL spec §2.1).
Found by a new user: a kernel declaring ``double val1`` ran and matched on the simulated device, where a Mac's
compiler stops; now it is a KernelCompileError at its line, quoted with a caret, through the library's NSError."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from mtlir.errors import KernelCompileError, UnsupportedKernelError
from mtlir.runtime.sim.msl.compile_errors import check_metal_types
from mtlir.runtime.sim.msl.lex import tokenize
from mtlir.runtime.sim.msl.translate import translate

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize("body, needle", [
    ("double x = a[0]; a[1] = x;", "double x"),  # a variable
    ("a[0] = (float)((double)a[1] * 2);", "double)"),  # a cast
    ("a[0] = static_cast<double>(a[1]);", "double>"),  # a template argument
    ("long double x = a[0]; a[1] = x;", "double x"),  # long double: no more an MSL type
    ("double2 v = double2(a[0], a[1]); a[2] = v.x;", "double2 v"),  # a vector of doubles (OpenCL has them)
    ("a[0] = as_type<float>((double3)0);", "double3)"),
])
def test_double_in_a_kernel_body_is_a_compile_error_at_its_place(body: str, needle: str) -> None:
    src = HEAD + f"kernel void k(device float* a, uint i [[thread_position_in_grid]]) {{\n  {body}\n}}\n"
    with pytest.raises(KernelCompileError) as info:
        translate(src)
    assert not isinstance(info.value, UnsupportedKernelError)
    col = src.splitlines()[3].index(needle) + 1
    first, quoted, caret = str(info.value).splitlines()
    assert first.startswith(f"MSL line 4, column {col}: ")
    assert "is not supported in Metal" in first or "unknown type name 'double" in first
    assert quoted == f"    4 |   {body}" and caret == "      | " + " " * (col - 1) + "^"


@pytest.mark.parametrize("msl", [
    "kernel void k(device double* a) { a[0] = 1; }",  # a parameter
    "double twice(double x) { return 2 * x; }\nkernel void k(device float* a) { a[0] = twice(a[0]); }",  # a helper
    "struct S { double d; };\nkernel void k(device float* a) { a[0] = 0; }",  # a member
    "kernel void k(device float* a, constant double4& c [[buffer(1)]]) { a[0] = 0; }",
])
def test_double_anywhere_as_a_type_is_refused(msl: str) -> None:
    with pytest.raises(KernelCompileError, match=r"'double\d*' is not supported in Metal|unknown type name 'double"):
        translate(HEAD + msl)


def test_double_in_comments_strings_and_longer_names_is_not_a_type() -> None:
    """Not a token (a comment), another token (``doubled``, a string) or an identifier that only looks like an
    OpenCL type (``double2`` used as a variable's name, valid MSL): nothing to refuse."""
    src = HEAD + """// double precision is not needed here
kernel void k(device float* a /* no double */, uint i [[thread_position_in_grid]]) {
  float doubled = a[i] * 2;  // doubled, not double
  a[i] = doubled;
}
"""
    assert "doubled" in translate(src).source
    for text in ('int double2 = 3; x = double2 * 2; y = double2;', 'const char* s = "double";', 'x = long_double;'):
        check_metal_types(tokenize(text), text)


def test_shipped_traces_have_no_double() -> None:
    """tinygrad's Metal renderer never emits double (its METAL device has no float64): every shipped trace
    translates."""
    for path in sorted((ROOT / "examples" / "traces").glob("*.json")):
        doc: dict[str, Any] = json.loads(path.read_text())
        for prog in doc["programs"].values():
            translate(prog["msl"])


@pytest.mark.parametrize("defines, use", [
    ("#define REAL double\n", "REAL x = a[0]; a[1] = (float)x;"),
    ("#define REAL double\n#define WIDE REAL\n", "WIDE x = a[0]; a[1] = (float)x;"),  # through another macro
    ("#define TWICE(v) ((double)(v) * 2)\n", "a[0] = (float)TWICE(a[1]);"),  # a function-like macro
    ("#define REAL \\\n  double\n", "REAL x = a[0]; a[1] = (float)x;"),  # continued on the next line
])
def test_double_from_a_macro_is_refused_where_the_macro_is_used(defines: str, use: str) -> None:
    """A new user's finding: ``#define REAL double`` then ``REAL x`` ran on the simulated device (the check looked at
    tokens, and a directive is one token); clang reports the error at the expansion, naming the macro."""
    src = HEAD + defines + f"kernel void k(device float* a) {{\n  {use}\n}}\n"
    with pytest.raises(KernelCompileError, match=r"'double' is not supported in Metal \(expanded from macro '\w+', "
                                                 r"defined at line \d+\)") as info:
        translate(src)
    line = src.splitlines().index(f"  {use}") + 1
    name = re.search(r"expanded from macro '(\w+)'", str(info.value)).group(1)  # type: ignore[union-attr]
    assert name in use and str(info.value).startswith(f"MSL line {line}, column {use.index(name) + 3}: ")


def test_a_double_macro_never_used_or_redefined_is_no_error() -> None:
    unused = HEAD + "#define REAL double\nkernel void k(device float* a) { a[0] = 1; }\n"
    redefined = HEAD + ("#define REAL double\n#undef REAL\n#define REAL float\n"
                        "kernel void k(device float* a) { REAL x = a[0]; a[1] = x; }\n")
    for src in (unused, redefined):
        assert "kernel" in translate(src).source
