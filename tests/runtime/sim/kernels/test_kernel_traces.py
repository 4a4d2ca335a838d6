"""The recorded kernel queues of examples/traces (Apple7, and Apple9 with SIMD-group matrices), run dispatch by
dispatch with KernelRunner (no queue, no ICB: the kernels alone), compared with the expected output the trace
carries; symbolic_kv at other start_pos values against a numpy reference computed from the trace's inputs."""
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mtlir.runtime.sim.kernels.runner import KernelRunner

TRACES = Path(__file__).resolve().parents[4] / "examples" / "traces"
VAR_SLOT = 256  # bytes per variable in the variables buffer (Metal's safe constant-buffer offset alignment)


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


def load(name: str) -> dict[str, Any]:
    return json.loads((TRACES / name).read_text())


def initial_storages(trace: dict[str, Any]) -> dict[int, np.ndarray]:
    """Each buffer's bytes: zeros, with the ``init`` bytes at their offset."""
    out = {}
    for key, buf in trace["buffers"].items():
        storage = np.zeros(buf["size"], np.uint8)
        if buf["init"] is not None:
            data = np.frombuffer(base64.b64decode(buf["init"]["b64"]), np.uint8)
            storage[buf["init"]["offset"]:buf["init"]["offset"] + data.size] = data
        out[int(key)] = storage
    return out


def sizes(dispatch: dict[str, Any], field: str, values: dict[str, int]) -> tuple[int, int, int]:
    """The dispatch's grid or threadgroup at ``values`` of the variables (from ``*_expr`` where present)."""
    expr = dispatch.get(f"{field}_expr") or dispatch[field]
    return tuple(values[v] if isinstance(v, str) else int(v) for v in expr)  # type: ignore[return-value]


def run_queue(runner: KernelRunner, trace: dict[str, Any], values: dict[str, int]) -> dict[int, np.ndarray]:
    """Run every dispatch in order: buffer args at indices 0.., variables as int32 in a variables buffer bound at
    their signature indices; returns the buffers' storages afterwards."""
    storages = initial_storages(trace)
    for n, dispatch in enumerate(trace["dispatches"]):
        prog = trace["programs"][dispatch["kernel"]]
        kernel = runner.compile(prog["msl"], prog["function"])
        bindings = {i: (storages[arg["buffer"]], arg["offset"]) for i, arg in enumerate(dispatch["args"])}
        var_params = [(name, index) for name, index, *_ in prog["signature"] if name is not None]
        assert len(var_params) == len(dispatch["vars"]), f"dispatch {n}"
        varbuf = np.zeros(VAR_SLOT * max(1, len(var_params)), np.uint8)
        for slot, (name, index) in enumerate(var_params):
            varbuf[slot * VAR_SLOT:slot * VAR_SLOT + 4] = np.frombuffer(np.int32(values[name]).tobytes(), np.uint8)
            bindings[index] = (varbuf, slot * VAR_SLOT)
        kernel.run(bindings, sizes(dispatch, "grid", values), sizes(dispatch, "threadgroup", values))
    return storages


def output(trace: dict[str, Any], storages: dict[int, np.ndarray]) -> np.ndarray:
    out = trace["output"]
    assert out["dtype"] == "dtypes.float"
    count = int(np.prod(out["shape"]))
    return storages[out["buffer"]][out["offset"]:out["offset"] + 4 * count].view(np.float32).reshape(out["shape"])


def recorded(trace: dict[str, Any]) -> dict[str, int]:
    return {name: var["value"] for name, var in trace["variables"].items()}


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.apple[79].json")))
def test_trace_matches_expected_output(runner: KernelRunner, name: str) -> None:
    """Every trace: the Apple7 ones and the Apple9 ones, whose matmuls use SIMD-group matrices (msl.simd), with the
    same tolerance."""
    trace = load(name)
    got = output(trace, run_queue(runner, trace, recorded(trace)))
    want = np.frombuffer(base64.b64decode(trace["output"]["expected_b64"]), np.float32).reshape(got.shape)
    assert np.abs(want).max() > 0  # a real answer to compare with, not zeros
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_every_trace_is_covered() -> None:
    for arch in ("apple7", "apple9"):
        names = {p.name.split(".")[0] for p in TRACES.glob(f"*.{arch}.json")}
        assert {"mlp", "conv", "layernorm_attn", "symbolic_kv", "mlp_deep", "cnn"} <= names


def attention_reference(trace: dict[str, Any], n: int) -> np.ndarray:
    """softmax(q . cache[:n]^T) . cache[:n] from the trace's inputs: cache is the 2048-byte buffer 1 (32 x 16
    float32), q the 64-byte buffer 2 (16 float32), as the first dispatch binds them."""
    first = trace["dispatches"][0]
    assert [(a["buffer"], a["size"]) for a in first["args"][1:]] == [(2, 64), (1, 2048)]
    storages = initial_storages(trace)
    cache = storages[1].view(np.float32).reshape(32, 16).astype(np.float64)[:n]
    q = storages[2].view(np.float32).astype(np.float64)
    scores = cache @ q
    p = np.exp(scores - scores.max())
    return ((p / p.sum()) @ cache).reshape(1, 16)


def test_attention_reference_is_the_recorded_workload() -> None:
    trace = load("symbolic_kv.apple7.json")
    want = np.frombuffer(base64.b64decode(trace["output"]["expected_b64"]), np.float32).reshape(1, 16)
    np.testing.assert_allclose(attention_reference(trace, recorded(trace)["start_pos"]), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("start_pos", [1, 5, 32])
def test_symbolic_kv_at_other_start_pos(runner: KernelRunner, start_pos: int) -> None:
    trace = load("symbolic_kv.apple7.json")
    bounds = trace["variables"]["start_pos"]
    assert bounds["min"] <= start_pos <= bounds["max"]
    grids = [sizes(d, "grid", {"start_pos": start_pos}) for d in trace["dispatches"]]
    assert (start_pos, 1, 1) in grids  # the grid really follows the variable
    got = output(trace, run_queue(runner, trace, {"start_pos": start_pos}))
    np.testing.assert_allclose(got, attention_reference(trace, start_pos), rtol=1e-4, atol=1e-5)
