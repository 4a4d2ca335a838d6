"""build_error with the translation's line map (issue 9): errors that all map into the MSL are invalid MSL (an
InvalidMslError, exit 2, MSL places quoted with a caret); one in generated code stays a KernelBuildError (exit 4:
the translator made code OpenCL refuses)."""
from __future__ import annotations

from mtlir.cli.report import EXIT_BAD_INPUT, EXIT_UNSUPPORTED, exit_code
from mtlir.errors import InvalidMslError, KernelBuildError
from mtlir.runtime.sim.kernels.buildlog import build_error

MSL = "kernel void k(device float* x) {\n  x[0] = y\n}\n"
LOG = "<source>:7:11: error: expected ';' after expression\n<source>:9:3: error: use of undeclared identifier 'z'\n"


def test_errors_that_all_map_into_the_msl_are_invalid_msl() -> None:
    e = build_error(("k",), LOG, "translation", msl=MSL, position=lambda line, col: (2, col - 2))
    assert isinstance(e, InvalidMslError) and exit_code(e) == EXIT_BAD_INPUT
    assert e.errors == [(2, 9, "expected ';' after expression"), (2, 1, "use of undeclared identifier 'z'")]
    assert e.summary == "invalid MSL in kernel(s) k: MSL line 2, column 9: expected ';' after expression (and 1 " \
                        "more error)"
    assert e.quote == "    2 |   x[0] = y\n      |         ^"
    assert str(e).splitlines()[3] == "  MSL line 2, column 1: use of undeclared identifier 'z'"


def test_an_error_in_generated_code_is_the_translators() -> None:
    e = build_error(("k",), LOG, "translation", msl=MSL,
                    position=lambda line, col: (2, 9) if line == 7 else None)
    assert isinstance(e, KernelBuildError) and exit_code(e) == EXIT_UNSUPPORTED
    assert "line 7, column 11 of the translation" in str(e)
    assert isinstance(build_error(("k",), LOG, "translation"), KernelBuildError)  # no line map: as before
