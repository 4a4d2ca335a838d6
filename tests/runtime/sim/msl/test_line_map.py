"""The translation's line map (issue 9): a place of the OpenCL C maps back to the MSL line and column it came from;
generated code (the prelude, made tokens on their own lines) maps to nothing."""
from __future__ import annotations

from mtlir.runtime.sim.msl.translate import translate

MSL = """#include <metal_stdlib>
using namespace metal;
kernel void k(device float* out [[buffer(0)]], uint t [[thread_position_in_grid]]) {
  float x = 1.0f;
  out[t] = x + yy;
}
"""


def _place(source: str, needle: str) -> tuple[int, int]:
    pos = source.rindex(needle)
    return source.count("\n", 0, pos) + 1, pos - (source.rfind("\n", 0, pos) + 1) + 1


def test_a_token_of_the_msl_maps_back_to_its_line_and_column() -> None:
    tr = translate(MSL)
    assert tr.msl_position(*_place(tr.source, "1.0f")) == (4, 13)
    assert tr.msl_position(*_place(tr.source, "yy")) == (5, 16)
    line, col = _place(tr.source, "yy")
    assert tr.msl_position(line, col + 1) == (5, 17)  # inside the token
    assert tr.msl_position(line, col + 2) == (5, 18)  # just past it, where clang puts "expected ';'"


def test_generated_code_maps_to_nothing() -> None:
    tr = translate(MSL)
    assert tr.msl_position(1, 1) is None  # the header comment
    assert tr.msl_position(len(tr.source.splitlines()) + 3, 1) is None
    assert tr.msl_position(1, 0) is None
    assert all(o[2] > 0 for o in tr.origins) and list(tr.origins) == sorted(tr.origins)
