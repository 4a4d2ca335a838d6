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

from mtlir.ir.dtypes import dtypes
from mtlir.metal import DeviceSpec
from mtlir.ir.ops import Ops
from mtlir.frontend.nodes import timeline_value
from mtlir.frontend.checks import exec_parts
from mtlir.frontend.trace import TraceError, load_trace, parse_trace

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
     "unknown buffer 77: the trace's buffers are '1', '2', '3', '8'"),
    # a buffer id is quoted as written: " 3" and "03" are not the buffer "3" (the message said "unknown buffer 3")
    ("buffer id with a space", _set(["dispatches", 4, "args", 1, "buffer"], " 3"), "dispatches[4].args[1].buffer",
     "unknown buffer ' 3'"),
    ("buffer id with a leading zero", _set(["output", "buffer"], "03"), "output.buffer", "unknown buffer '03'"),
    # text that is valid JSON but not Unicode (a lone surrogate) or a name that would break a line of the listing
    ("lone surrogate in the workload", _set(["workload"], "kv\ud800"), "workload", "'\\ud800', a lone surrogate"),
    ("lone surrogate in the MSL", lambda d: d["programs"]["r_start_pos"].update(
        msl=d["programs"]["r_start_pos"]["msl"] + "// \udfff\n"), "programs.r_start_pos.msl", "a lone surrogate"),
    ("lone surrogate in a program key", lambda d: d["programs"].update({"k\ud800": d["programs"]["r_start_pos"]}),
     "programs", "key 'k\\ud800' holds the character '\\ud800'"),
    ("newline in the workload", _set(["workload"], "kv\nsecond line"), "workload",
     "holds the character '\\n': a name must be printable Unicode text on one line"),
    ("control character in a buffer id", lambda d: d["buffers"].update({"9\x1b[2J": d["buffers"]["8"]}), "buffers",
     "key '9\\x1b[2J' holds the character '\\x1b'"),
    ("newline in a function name", _set(["programs", "r_start_pos", "function"], "r_start\npos"),
     "programs.r_start_pos.function", "holds the character '\\n'"),
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
     "dispatches[0].grid_expr[0]", "'pos' is not a variable of the trace: an entry is an int or the name"),
    ("grid_expr disagrees with grid", _set(["dispatches", 0, "grid", 0], 12), "dispatches[0].grid_expr[0]",
     "'start_pos' is 11"),
    ("unknown arch", _set(["arch"], "Apple5"), "arch", "unknown GPU family"),
    ("signature out of order", _set(["programs", "r_start_pos", "signature", 0, 1], 5),
     "programs.r_start_pos.signature[0][1]", "expected 0"),
    ("unknown dtype", _set(["programs", "r_start_pos", "signature", 0, 2], "dtypes.quux"),
     "programs.r_start_pos.signature[0][2]", "unknown element type"),
    ("output shape does not match its bytes", _set(["output", "shape"], [2, 16]), "output.expected_b64",
     "shape [2, 16] of float32 is 128 bytes"),
    # the view a dispatch binds holds fewer bytes than the signature's elements: the kernel would read past it
    ("arg size below the signature's elements", _set(["dispatches", 1, "args", 1, "size"], 4),
     "dispatches[1].args[1].size", "size 4 bytes is below the 32 elements of float32 (128 bytes) that parameter 1 "
                                   "of 'r_start_pos' takes"),
    ("negative init offset", _set(["buffers", "1", "init", "offset"], -4), "buffers.1.init.offset",
     "negative offset -4"),
    ("missing workload", _delete(["workload"]), "workload", "missing field"),
    ("empty workload", _set(["workload"], ""), "workload", "an empty workload name"),
    ("no dispatches", _set(["dispatches"], []), "dispatches", "no dispatches: nothing produces the output"),
    # only dispatch 4 binds the output's buffer 8: without it the run failed late ("no buffer named 'buffer:8'")
    ("output bound by no dispatch", _delete(["dispatches", 4]), "output.buffer",
     "no dispatch binds buffer 8: nothing produces the output"),
    ("unknown top-level field", _set(["typo"], 1), "typo", "unknown field 'typo'"),
    ("unknown dispatch field", _set(["dispatches", 3, "typo_grid"], [1, 1, 1]), "dispatches[3].typo_grid",
     "unknown field 'typo_grid': the trace format (docs/lowering.md, \"Traces\") has args, grid, grid_expr, kernel, "
     "threadgroup, threadgroup_expr, vars here"),
    ("unknown arg field", _set(["dispatches", 0, "args", 1, "stride"], 4), "dispatches[0].args[1].stride",
     "unknown field 'stride'"),
    ("unknown buffer field", _set(["buffers", "2", "dtype"], "float"), "buffers.2.dtype", "unknown field"),
    ("unknown init field", _set(["buffers", "2", "init", "size"], 4), "buffers.2.init.size", "unknown field"),
    ("unknown variable field", _set(["variables", "start_pos", "step"], 1), "variables.start_pos.step",
     "unknown field"),
    ("unknown program field", _set(["programs", "r_start_pos", "src"], ""), "programs.r_start_pos.src",
     "unknown field"),
    ("unknown output field", _set(["output", "rtol"], 0.1), "output.rtol", "unknown field"),
    ("a buffer above 2**36 bytes", _set(["buffers", "8", "size"], 2**36 + 1), "buffers.8.size",
     "above 2**36 (64 GiB)"),
    ("signature elements not an int", _set(["programs", "r_start_pos", "signature", 0, 3], ["32"]),
     "programs.r_start_pos.signature[0][3][0]", "expected int"),
    ("signature elements below 1", _set(["programs", "r_start_pos", "signature", 0, 3], [0]),
     "programs.r_start_pos.signature[0][3][0]", "elements 0 is below 1"),
    ("signature entry too long", _set(["programs", "r_start_pos", "signature", 0], [None, 0, "dtypes.float", [1], 9]),
     "programs.r_start_pos.signature[0]", "got 5 entries"),
    # the signature disagrees with the MSL (`device float* data0_1, device float* data1_32, constant int& data2_`)
    ("signature half for a device float*", _set(["programs", "r_start_pos", "signature", 0, 2], "dtypes.half"),
     "programs.r_start_pos.signature[0]", "Kernel 'r_start_pos': parameter 0 (buffer at index 0) is declared "
                                          "float16, but the MSL's `device float* data0_1` takes float (float32)"),
    ("signature char for a device float*", _set(["programs", "r_start_pos", "signature", 1, 2], "dtypes.char"),
     "programs.r_start_pos.signature[1]", "is declared int8, but the MSL's `device float* data1_32` takes float"),
    ("signature double", _set(["programs", "r_start_pos", "signature", 0, 2], "dtypes.double"),
     "programs.r_start_pos.signature[0]", "'float64' is a 64-bit float, which Metal does not have"),
    ("signature uint for a constant int&", _set(["programs", "r_start_pos", "signature", 2, 2], "dtypes.uint"),
     "programs.r_start_pos.signature[2]", "is declared uint32, but the MSL's `constant int& data2_` takes int"),
    ("signature buffer for a constant int&", _set(["programs", "r_start_pos", "signature", 2],
                                                   [None, 2, "dtypes.float", []]),
     "programs.r_start_pos.signature[2]", "is a buffer, but the MSL's `constant int& data2_` at [[buffer(2)]] is a "
                                          "value"),
    ("signature without the MSL's variable", _delete(["programs", "r_start_pos", "signature", 2]),
     "programs.r_start_pos", "the MSL's `constant int& data2_` at [[buffer(2)]] has no KernelParam"),
    # an empty MSL passed the loader and failed at link ("function ... of its library: Metal returned nil")
    ("empty msl", _set(["programs", "r_start_pos", "msl"], ""), "programs.r_start_pos.msl", "empty MSL source"),
    ("whitespace-only msl", _set(["programs", "r_start_pos", "msl"], " \n\t "), "programs.r_start_pos.msl",
     "empty MSL source"),
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


def test_a_repeated_json_key_is_refused_naming_the_object_and_the_key(tmp_path: Path) -> None:
    """``json`` keeps the last of two equal keys: a trace repeating ``size`` loaded with the second size."""
    text = json.dumps(KV).replace('"size": 64', '"size": 64, "size": 8', 1)
    p = tmp_path / "dup.json"
    p.write_text(text)
    with pytest.raises(TraceError) as e:
        load_trace(p)
    assert e.value.field.startswith("buffers.") and "duplicate key 'size'" in e.value.problem
    p.write_text(json.dumps(KV).replace('"workload":', '"workload": "x", "workload":', 1))
    with pytest.raises(TraceError, match=r"\(top level\): duplicate key 'workload'"):
        load_trace(p)


def test_a_variable_no_dispatch_uses_is_accepted_and_noted() -> None:
    assert load_trace(TRACES / "symbolic_kv.apple7.json").unused_variables == ()
    raw = copy.deepcopy(KV)
    raw["variables"]["spare"] = {"value": 3, "min": 0, "max": 9}
    t = parse_trace(raw)
    assert t.unused_variables == ("spare",) and t.values["spare"] == 3
    assert t.queue().src[0].op is Ops.EXEC


def test_a_buffer_no_dispatch_binds_is_accepted_noted_and_gets_no_initial_data() -> None:
    """Recorded bytes of a buffer nothing binds would reach link as data for a buffer the Program does not have."""
    assert load_trace(TRACES / "symbolic_kv.apple7.json").unused_buffers == ()
    raw = copy.deepcopy(KV)
    raw["buffers"]["9"] = {"size": 64, "init": {"offset": 0, "b64": "AAAA"}}
    t = parse_trace(raw)
    assert t.unused_buffers == ("9",)
    assert "buffer:9" not in t.initial_data() and "buffer:9" not in t.initial_data(full=False)
    assert "buffer:1" in t.initial_data()


def test_big_buffers_are_not_materialized() -> None:
    """A 32 GiB output buffer (no recorded bytes) and a 4 GiB input whose 12 recorded bytes sit at its end load
    without a buffer-sized copy; ``initial_data(full=False)`` gives link the recorded bytes and their offset."""
    raw = copy.deepcopy(KV)
    raw["buffers"]["8"]["size"] = 2**35
    raw["buffers"]["2"] = {"size": 2**32, "init": {"offset": 2**32 - 12, "b64": "AAAAAAAAAAAAAAAA"}}
    t = parse_trace(raw)
    assert t.buffers["2"].init == bytes(12) and t.buffers["2"].init_offset == 2**32 - 12
    sparse = t.initial_data(full=False)
    assert sparse["buffer:2"] == (2**32 - 12, bytes(12)) and "buffer:8" not in sparse
    assert sparse["buffer:1"] == (0, t.buffers["1"].init)
    assert t.queue().src[0].op is Ops.EXEC


def test_sparse_initial_data_runs_like_full_buffers() -> None:
    """link accepts ``(offset, bytes)`` and zero-fills the rest: the output matches as with full buffers."""
    from mtlir.passes import lower
    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    t = load_trace(TRACES / "symbolic_kv.apple7.json")
    program = lower(t.queue(), target="x86_64", keep_stages=False).program
    o = t.output
    with SimDevice("x86_64", family="Apple7") as dev, \
            Session(program, dev, initial=t.initial_data(full=False), timeout_s=60) as s:
        s.submit(**t.values)
        s.wait(timeout_s=60)
        got = np.frombuffer(s.read(o.placeholder, o.offset, o.nbytes), np.float32).reshape(o.shape)
    np.testing.assert_allclose(got, o.expected_array(), rtol=1e-4, atol=1e-5)
