"""``mtlir run --repeat N``: every submit runs on the trace's inputs. A trace whose kernel updates a buffer in place
(an SGD step, ``x += 1``) gets its initial bytes back before each repeat, outside the timed submits: the output
after N submits is the one step's, as the trace expects (it was compared after N steps: a false mismatch)."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from mtlir.cli.main import main

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
# x[i] += 1 (in place), y[i] = 2 * x[i] (written only)
STEP = HEAD + """kernel void update(device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
  x[i] = x[i] + 1.0f;
  y[i] = 2.0f * x[i];
}"""


def _trace(tmp_path: Path, output: str) -> Path:
    """A one-dispatch trace of ``update`` over 64 floats, x = 0..63; its output buffer ``output`` ("1": x, "2": y)."""
    x = np.arange(64, dtype=np.float32)
    expected = x + 1 if output == "1" else 2 * (x + 1)
    b64 = lambda a: base64.b64encode(a.tobytes()).decode()  # noqa: E731
    trace = {"workload": "step", "arch": "Apple9", "variables": {},
             "buffers": {"1": {"size": 256, "init": {"offset": 0, "b64": b64(x)}}, "2": {"size": 256, "init": None}},
             "programs": {"update": {"function": "update", "msl": STEP,
                                   "signature": [[None, 0, "dtypes.float", [64]], [None, 1, "dtypes.float", [64]]]}},
             "dispatches": [{"kernel": "update", "grid": [2, 1, 1], "threadgroup": [32, 1, 1],
                             "args": [{"buffer": 1, "offset": 0, "size": 256}, {"buffer": 2, "offset": 0, "size": 256}],
                             "vars": []}],
             "output": {"buffer": int(output), "offset": 0, "dtype": "dtypes.float", "shape": [64],
                        "expected_b64": b64(expected)}}
    path = tmp_path / f"step{output}.json"
    path.write_text(json.dumps(trace))
    return path


def _run(*argv: str) -> tuple[int, dict[str, Any], str]:
    out, log = io.StringIO(), io.StringIO()
    code = main(["run", *argv, "--device", "sim", "--json"], out=out, log=log)
    return code, json.loads(out.getvalue()), log.getvalue()


def test_repeat_runs_an_in_place_trace_on_its_inputs_each_time(tmp_path: Path) -> None:
    for output in ("1", "2"):  # the buffer updated in place, and one computed from it
        for repeat in ("1", "4"):
            code, doc, log = _run(str(_trace(tmp_path, output)), "--repeat", repeat)
            assert code == 0 and doc["match"] and doc["submits"] == int(repeat), (output, repeat, log)


def test_the_restores_are_host_spans_of_their_own_between_the_submits(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    code, doc, log = _run(str(_trace(tmp_path, "1")), "--repeat", "3", "--profile", str(profile))
    assert code == 0 and doc["match"], log
    host = [e["name"] for e in json.loads(profile.read_text())["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    assert host == ["lower", "link", "submit 0", "restore 1", "submit 1", "restore 2", "submit 2", "wait"], host
