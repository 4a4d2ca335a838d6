"""One test per bug the loader fuzzing (test_trace_loader.py) found, each on the smallest input that showed it."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from mtlir.frontend.trace import TraceError, load_trace, parse_trace

TRACE = Path(__file__).parents[2] / "examples" / "traces" / "symbolic_kv.apple7.json"


def test_an_empty_key_is_named() -> None:
    """An unknown empty key at the top level was refused with an empty field name (``fuzz.json: : unknown...``)."""
    with pytest.raises(TraceError) as e:
        parse_trace({"": 0}, "t.json")
    assert e.value.field == "''"


def test_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    """A file that is not UTF-8 raised UnicodeDecodeError (not the loader's error) from ``read_text``."""
    path = tmp_path / "t.json"
    path.write_bytes(b"\x80{}")
    with pytest.raises(TraceError, match="byte 0 is not UTF-8 text") as e:
        load_trace(path)
    assert e.value.field == "(file)" and str(path) in str(e.value)


def test_negative_output_extents() -> None:
    """Two negative extents of ``output.shape`` multiplied to a positive size: the trace loaded, and reading its
    expected output failed later with numpy's ValueError."""
    data = json.loads(TRACE.read_text())
    out = data["output"]
    n = len(base64.b64decode(out["expected_b64"])) // 4
    out["shape"] = [-1, -n]
    with pytest.raises(TraceError) as e:
        parse_trace(data)
    assert e.value.field == "output.shape[0]"
