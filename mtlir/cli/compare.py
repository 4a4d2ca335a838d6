"""An output against the expected one, with a tolerance that depends on the output's dtype: ``compare_output``.

The one comparison of ``mtlir run`` (a trace's output against its ``expected_b64``), ``mtlir record`` (METAL's
output against the expected device's, ``mtlir.tinygrad.record``) and ``benchmarks/bench_dispatch.py``. The
tolerance (``TOLERANCES``, ``tolerance``):

- integers and bool: exact;
- float32 (and float64, compared as float32): rtol 1e-4, atol 1e-5, as the traces were always checked;
- float16 (half): rtol 4 * 2**-10 (four units in the last place of half at the top of a binade; half's epsilon
  is 2**-10 ~ 9.8e-4, so float32's rtol 1e-4 would refuse a correctly rounded result against one a single ulp
  off), atol 1e-5;
- bfloat16: rtol 4 * 2**-7 (bfloat16's epsilon is 2**-7), atol 1e-5.

``Comparison.max_ulp_err`` says how far apart the two are in units in the last place of the dtype (at the
expected value), which tells a rounding difference from different inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Comparison", "compare_output", "tolerance", "TOLERANCES", "ULP_SLACK"]

ULP_SLACK = 4  # units in the last place a 16-bit float output may differ by

# dtype name -> (rtol, atol); a float dtype not named here is compared as float32
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-5),
    "float64": (1e-4, 1e-5),
    "float16": (ULP_SLACK * 2.0 ** -10, 1e-5),
    "bfloat16": (ULP_SLACK * 2.0 ** -7, 1e-5),
}
# dtype name -> (bits of precision with the implicit one, smallest normal exponent): what one ulp is
_FORMATS: dict[str, tuple[int, int]] = {"float16": (11, -14), "bfloat16": (8, -126), "float32": (24, -126),
                                        "float64": (53, -1022)}


def tolerance(dtype: Any) -> tuple[float, float] | None:
    """``(rtol, atol)`` of an output of ``dtype`` (a numpy dtype or its name: ``"float16"``, ``"bfloat16"``, ...),
    or None for an exact comparison (integers, bool)."""
    name = getattr(dtype, "name", str(dtype))
    if name in TOLERANCES:
        return TOLERANCES[name]
    if getattr(dtype, "kind", "") in ("b", "i", "u") or name.startswith(("int", "uint", "bool")):
        return None
    return TOLERANCES["float32"]


@dataclass(frozen=True)
class Comparison:
    """The output against the expected one: ``match`` (every element within the dtype's ``tolerance``, NaN equal
    to NaN), ``max_abs_err`` (inf where one side is NaN or infinite and the other not; NaN never hides an error),
    ``mismatches`` (elements outside the tolerance), ``nan_mismatches`` (positions where exactly one side is NaN),
    ``dtype`` (the output's dtype name), ``rtol``/``atol`` (the tolerance used; 0, 0 for an exact comparison) and
    ``max_ulp_err`` (the largest difference in units in the last place of ``dtype`` at the expected value; inf
    with a NaN or an infinity on one side only; for integers the largest difference)."""

    match: bool
    max_abs_err: float
    mismatches: int
    nan_mismatches: int
    dtype: str = "float32"
    rtol: float = 0.0
    atol: float = 0.0
    max_ulp_err: float = 0.0

    def json_error(self) -> float | None:
        """``max_abs_err`` for JSON, which has no NaN or infinity: the number when finite, else None (null)."""
        return self.max_abs_err if math.isfinite(self.max_abs_err) else None

    def json_ulp_error(self) -> float | None:
        """``max_ulp_err`` for JSON: the number when finite, else None (null)."""
        return self.max_ulp_err if math.isfinite(self.max_ulp_err) else None

    @property
    def epsilon(self) -> float:
        """One ulp of ``dtype`` at 1.0 (half: 2**-10; 0 for an integer output): ``max_ulp_err * epsilon`` is about
        the largest relative error."""
        fmt = _FORMATS.get(self.dtype)
        return 0.0 if fmt is None or not self.rtol else 2.0 ** (1 - fmt[0])

    def describe_tolerance(self) -> str:
        """The tolerance in words: ``exact`` or ``rtol 0.0039, atol 1e-05 (float16)``."""
        return "exact" if (self.rtol, self.atol) == (0.0, 0.0) else \
            f"rtol {self.rtol:.2g}, atol {self.atol:.2g} ({self.dtype})"


def compare_output(got: Any, expected: Any) -> Comparison:
    """Compare two arrays of one shape (``Comparison``) with the tolerance of their dtype (``tolerance``; the
    expected array's dtype decides when the two differ): integers and bools exactly; floats (float16, bfloat16:
    widened exactly) as float32, where a NaN on one side only is a mismatch with an infinite error, NaN against
    NaN and equal infinities agree."""
    import numpy as np
    a, b = np.atleast_1d(got), np.atleast_1d(expected)  # a 0-d output (a scalar) as one element
    if tolerance(a.dtype) is None and tolerance(b.dtype) is None:  # exact: no tolerance for integers
        if a.dtype == np.bool_ and b.dtype == np.bool_:
            # a bool is the byte 0 or 1 (MSL): any other byte (a kernel that never wrote a poisoned 0xFF output,
            # ``mtlir record``) is no bool, where numpy would read it as True
            a, b = np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
        same = a == b
        diff = [abs(int(x) - int(y)) for x, y in zip(a.ravel().tolist(), b.ravel().tolist())]
        err_i = float(max(diff, default=0))
        return Comparison(bool(same.all()), err_i, int((~same).sum()), 0, b.dtype.name, 0.0, 0.0, err_i)
    floating = b if tolerance(b.dtype) is not None else a
    rtol, atol = tolerance(floating.dtype) or TOLERANCES["float32"]
    name = floating.dtype.name if floating.dtype.name in _FORMATS else "float32"
    a, b = a.astype(np.float32), b.astype(np.float32)
    close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a.astype(np.float64) - b.astype(np.float64))
    err[(nan_a & nan_b) | (a == b)] = 0.0  # agreeing NaNs and equal infinities (inf - inf is NaN)
    err[np.isnan(err)] = math.inf  # NaN against a number, or inf against -inf
    ulps = err / _ulp(b, name)
    return Comparison(bool(close.all()), float(err.max()) if err.size else 0.0, int((~close).sum()),
                      int((nan_a != nan_b).sum()), name, rtol, atol, float(ulps.max()) if ulps.size else 0.0)


def _ulp(values: Any, name: str) -> Any:
    """One unit in the last place of the float format ``name`` at each of ``values`` (float64 array; an infinity
    or NaN gets the ulp of the largest binade, where its error is inf or 0 anyway)."""
    import numpy as np
    bits, emin = _FORMATS[name]
    v = np.abs(values.astype(np.float64))
    v[~np.isfinite(v)] = 0.0
    exponent = np.maximum(np.frexp(v)[1] - 1, emin)
    return np.ldexp(1.0, exponent - (bits - 1))
