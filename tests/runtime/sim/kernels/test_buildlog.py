"""An OpenCL build log read as compiler errors (no OpenCL needed): Clang's and PoCL's lines, the one-line summary, the
first errors with their line of the translation."""
from __future__ import annotations

from mtlir.errors import KernelBuildError, KernelCompileError, UnsupportedError
from mtlir.runtime.sim.kernels.buildlog import SHOWN_ERRORS, build_error, build_errors

SOURCE = "__kernel void k(__global float* x) {\n  x[0] = undefined_name + 1.0f +;\n}\n"
LOG = ("clBuildProgram failed: BUILD_PROGRAM_FAILURE\n"
       "<source>:2:32: error: expected expression\n"
       "error: /tmp/pocl.cl:2:10: use of undeclared identifier 'undefined_name'\n"
       "2 errors generated.\n"
       "fatal error: no place given\n")


def test_build_errors_reads_clang_and_pocl_lines() -> None:
    assert build_errors(LOG) == [(2, 32, "expected expression"), (2, 10, "use of undeclared identifier "
                                                                         "'undefined_name'"),
                                 (None, None, "no place given")]
    assert build_errors("all fine\n3 errors generated.\n") == []


def test_build_error_says_what_failed_in_one_line_then_the_errors() -> None:
    e = build_error(("k", "m"), LOG, SOURCE)
    assert isinstance(e, KernelBuildError) and isinstance(e, KernelCompileError) and isinstance(e, UnsupportedError)
    assert e.kernels == ("k", "m") and e.log == LOG and e.source == SOURCE and len(e.errors) == 3
    assert e.summary.startswith("the simulated device could not build the OpenCL translation of kernel(s) k, m: ")
    assert e.summary.endswith(": line 2, column 32 of the translation: expected expression (and 2 more errors)")
    lines = str(e).splitlines()
    assert lines[0] == e.summary and len(lines) == 1 + 2 + 2 + 1 + 1 and SHOWN_ERRORS == 3
    assert lines[2] == "       2 |   x[0] = undefined_name + 1.0f +;"
    assert lines[5] == "  no place given" and lines[-1].startswith("  (the whole build log is in .log")


def test_a_log_without_errors_is_quoted() -> None:
    e = build_error(("k",), "something   odd\nhappened", SOURCE)
    assert e.errors == [] and e.summary.endswith(": something odd happened")
    assert build_error((), "", SOURCE).summary.endswith("kernel(s) (none): the MSL may be invalid or use something "
                                                        "the translator does not handle (docs/kernels.md): no build "
                                                        "log")
