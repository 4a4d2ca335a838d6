"""load_trace: every trace of examples/traces loads and builds its queue graph; each kind of malformed trace raises
a TraceError naming the field and the dispatch index."""
from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lowering_cases import TRACES

from mtlir.dtypes import dtypes
from mtlir.metal import DeviceSpec
from mtlir.ops import Ops
from mtlir.queue import exec_parts, timeline_value
from mtlir.trace import TraceError, load_trace, parse_trace

ALL = sorted(TRACES.glob("*.json"))
KV = json.loads((TRACES / "symbolic_kv.apple7.json").read_text())


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name.removesuffix(".json"))
def test_every_trace_loads(path: Path) -> None:
    raw = json.loads(path.read_text())
    t = load_trace(path)
    assert t.arch == raw["arch"] and t.workload == raw["workload"]
    assert len(t.dispatches) == len(raw["dispatches"])
    g = t.queue()
    assert g.op is Ops.SUBMIT and g.arg == DeviceSpec(raw["arch"])
    assert [s.op for s in g.src] == [Ops.EXEC] * len(raw["dispatches"]) + [Ops.SIGNAL]
    assert g.src[-1].src[1] is timeline_value()
    for ex, d in zip(g.src, raw["dispatches"]):
        parts = exec_parts(ex)
        assert parts.kernel.key == d["kernel"]
        for b, a in zip(parts.buffers, d["args"]):
            base = b.src[0] if b.op is Ops.BUFFER_VIEW else b
            assert base.arg == (str(a["buffer"]), raw["buffers"][str(a["buffer"])]["size"])
            assert (b.arg[0] if b.op is Ops.BUFFER_VIEW else 0) == a["offset"]
        assert [int(f.arg) for f in parts.threadgroup.src if f.op is Ops.CONST] == \
            [s for s, e in zip(d["threadgroup"], d.get("threadgroup_expr", d["threadgroup"])) if isinstance(e, int)]
    init = t.initial_data()
    for bid, b in raw["buffers"].items():
        assert (f"buffer:{bid}" in init) == (b["init"] is not None)
        if b["init"] is not None:
            assert len(init[f"buffer:{bid}"]) == b["size"]
    assert t.output.expected_array().shape == tuple(raw["output"]["shape"])
    assert t.queue() is g  # cached per device


def test_symbolic_kv_sizes_are_expressions_of_the_variable() -> None:
    t = load_trace(TRACES / "symbolic_kv.apple7.json")
    assert t.values == {"start_pos": 11}
    start_pos = t.variables["start_pos"].uop()
    g = t.queue(DeviceSpec("Apple9", residency_set=False))
    grids = [exec_parts(ex).grid.src[0] for ex in g.src[:-1]]
    assert grids[0] is start_pos.cast(dtypes.uint64) and grids[3] is start_pos.cast(dtypes.uint64)
    assert grids[1].op is Ops.CONST and grids[1].arg == 1
    assert all(exec_parts(ex).vars == (start_pos,) for ex in g.src[:-1])
    assert g.arg == DeviceSpec("Apple9", residency_set=False)


def test_initial_data_puts_the_bytes_at_their_offset() -> None:
    raw = copy.deepcopy(KV)
    raw["buffers"]["3"]["init"] = {"offset": 8, "b64": "AQID"}  # bytes 1, 2, 3
    data = parse_trace(raw).initial_data()["buffer:3"]
    assert len(data) == 1024 and data[8:11] == b"\x01\x02\x03" and data[:8] == bytes(8) and not any(data[11:])
    out = parse_trace(raw).output
    assert out.placeholder == "buffer:8" and out.dtype is dtypes.float32
    assert np.frombuffer(out.expected, np.float32).shape == (16,)


def _set(path: list[Any], value: Any) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


def _delete(path: list[Any]) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for k in path[:-1]:
            d = d[k]
        del d[path[-1]]
    return edit


CASES: list[tuple[str, Callable[[dict], None], str, str]] = [
    ("missing field", _delete(["dispatches", 2, "grid"]), "dispatches[2].grid", "missing field"),
    ("missing top field", _delete(["output"]), "output", "missing field"),
    ("wrong type", _set(["dispatches", 1, "threadgroup"], "1,1,1"), "dispatches[1].threadgroup", "expected list"),
    ("wrong type in sizes", _set(["dispatches", 1, "grid", 0], 1.5), "dispatches[1].grid[0]", "expected int"),
    ("bool is not an int", _set(["dispatches", 1, "vars", 0], True), "dispatches[1].vars[0]", "expected int"),
    ("unknown program", _set(["dispatches", 3, "kernel"], "nope"), "dispatches[3].kernel", "unknown program 'nope'"),
    ("unknown buffer", _set(["dispatches", 4, "args", 1, "buffer"], 77), "dispatches[4].args[1].buffer",
     "unknown buffer 77"),
    ("view past the end", _set(["dispatches", 2, "args", 0, "offset"], 1024), "dispatches[2].args[0]",
     "runs past the end of buffer 3"),
    ("negative offset", _set(["dispatches", 2, "args", 0, "offset"], -4), "dispatches[2].args[0].offset",
     "is negative"),
    ("view offset not aligned", _set(["dispatches", 2, "args", 0, "offset"], 6), "dispatches[2].args[0].offset",
     "not a multiple of the element size 4"),
    ("view size below 1", _set(["dispatches", 2, "args", 0, "size"], 0), "dispatches[2].args[0].size",
     "size 0 is below 1"),
    ("grid size below 1", _set(["dispatches", 1, "grid", 2], 0), "dispatches[1].grid[2]", "size 0 is below 1"),
    ("threadgroup size below 1", _set(["dispatches", 4, "threadgroup", 0], -1), "dispatches[4].threadgroup[0]",
     "below 1"),
    ("buffer size below 1", _set(["buffers", "8", "size"], 0), "buffers.8.size", "below 1"),
    ("variable outside bounds", _set(["variables", "start_pos", "value"], 40), "variables.start_pos.value",
     "outside its bounds [1, 32]"),
    ("args do not match the signature", _delete(["dispatches", 0, "args", 2]), "dispatches[0].args",
     "takes 3 buffers, got 2"),
    ("vars do not match the signature", _set(["dispatches", 1, "vars"], [11, 12]), "dispatches[1].vars",
     "takes 1 variables (start_pos), got 2"),
    ("a var value that is not the variable's", _set(["dispatches", 1, "vars", 0], 12), "dispatches[1].vars[0]",
     "differs from the variable's recorded value 11"),
    ("bad base64", _set(["buffers", "1", "init", "b64"], "not*base64!"), "buffers.1.init.b64", "bad base64"),
    ("bad base64 output", _set(["output", "expected_b64"], "@@"), "output.expected_b64", "bad base64"),
    ("init past the end", _set(["buffers", "2", "size"], 16), "buffers.2.init", "run past the end"),
    ("grid_expr names an unknown variable", _set(["dispatches", 0, "grid_expr", 0], "pos"),
     "dispatches[0].grid_expr[0]", "unknown variable 'pos'"),
    ("grid_expr disagrees with grid", _set(["dispatches", 0, "grid", 0], 12), "dispatches[0].grid_expr[0]",
     "'start_pos' is 11"),
    ("unknown arch", _set(["arch"], "Apple5"), "arch", "unknown GPU family"),
    ("signature out of order", _set(["programs", "r_start_pos", "signature", 0, 1], 5),
     "programs.r_start_pos.signature[0][1]", "expected 0"),
    ("unknown dtype", _set(["programs", "r_start_pos", "signature", 0, 2], "dtypes.quux"),
     "programs.r_start_pos.signature[0][2]", "unknown element type"),
    ("output shape does not match its bytes", _set(["output", "shape"], [2, 16]), "output.expected_b64",
     "shape [2, 16] of float32 is 128 bytes"),
]


@pytest.mark.parametrize("name, edit, field, problem", CASES, ids=[c[0] for c in CASES])
def test_malformed_trace_names_field_and_dispatch(name: str, edit: Callable[[dict], None], field: str,
                                                  problem: str) -> None:
    raw = copy.deepcopy(KV)
    edit(raw)
    with pytest.raises(TraceError) as e:
        parse_trace(raw, "kv.json")
    assert e.value.field == field
    assert problem in e.value.problem
    assert str(e.value).startswith(f"kv.json: {field}: ")


def test_load_trace_reports_bad_json_and_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(TraceError, match="bad.json: \\(file\\): not valid JSON"):
        load_trace(bad)
    raw = copy.deepcopy(KV)
    raw["dispatches"][4]["kernel"] = "missing"
    p = tmp_path / "kv.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(TraceError, match=r"kv.json: dispatches\[4\].kernel: unknown program 'missing'"):
        load_trace(p)
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "absent.json")
