"""``mtlir run ... --profile FILE`` (issue 15): the Chrome trace event format Perfetto and chrome://tracing open,
schema-checked: host spans (lower, link, each submit, the wait) and GPU spans (each command buffer from its
GPUStartTime/GPUEndTime; each kernel when a submit has one command buffer per kernel), in microseconds."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from mtlir.cli.main import main
from mtlir.cli.profile import GPU_PID, HOST_PID, HostClock, HostSpan, check_chrome_trace, chrome_trace
from mtlir.runtime.submission import GpuSpan, Submission

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
KV7 = str(TRACES / "symbolic_kv.apple7.json")


def _events(doc: dict[str, Any], ph: str = "X", pid: int | None = None) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph and (pid is None or e["pid"] == pid)]


def test_run_writes_a_profile_perfetto_reads(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    out, log = io.StringIO(), io.StringIO()
    code = main(["run", KV7, "--device", "sim", "--repeat", "3", "--profile", str(path)], out=out, log=log)
    assert code == 0, log.getvalue()
    doc = json.loads(path.read_text())
    check_chrome_trace(doc)
    host = _events(doc, pid=HOST_PID)
    # before each repeat, the buffers the first submit changed get their initial bytes back (its own span)
    assert [e["name"] for e in host] == ["lower", "link", "submit 0", "restore 1", "submit 1", "restore 2", "submit 2",
                                         "wait"]
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(host, host[1:]))  # in order, not overlapping
    gpu = _events(doc, pid=GPU_PID)
    assert len(gpu) == 3 and [e["args"]["submit"] for e in gpu] == [0, 1, 2]
    for e in gpu:
        assert e["dur"] == pytest.approx((e["args"]["GPUEndTime_ns"] - e["args"]["GPUStartTime_ns"]) / 1e3)
        assert e["args"]["kernels"] == ["r_start_pos_16", "r_start_pos", "r_start_pos_v2", "E_start_pos",
                                        "r_4_4_start_pos"]
    names = {e["args"]["name"] for e in _events(doc, "M")}
    assert {"host", "GPU"} <= names and doc["displayTimeUnit"] == "ns"
    assert f"mtlir: wrote {path}" in log.getvalue()


def test_one_command_buffer_per_kernel_names_each_span_after_its_kernel() -> None:
    subs = [Submission(0, 1, (1, 2), 0.001, spans=[GpuSpan(0, 5_000_000, 5_002_000), GpuSpan(1, 5_003_000, 5_004_500)]),
            Submission(1, 2, (3, 4), 0.001, spans=[GpuSpan(0, 6_000_000, 6_001_000), GpuSpan(1, None, None)])]
    doc = chrome_trace([HostSpan("submit 0", 10.0, 10.001), HostSpan("submit 1", 10.002, 10.003)], subs,
                       [10.0, 10.002], ["saxpy", "scale"], origin_s=9.5)
    check_chrome_trace(doc)
    gpu = _events(doc, pid=GPU_PID)
    assert [e["name"] for e in gpu[:2]] == ["saxpy", "scale"]
    # the GPU clock is shifted so the first command buffer starts with its submit (500,000 us after the origin)
    assert gpu[0]["ts"] == pytest.approx(500_000.0) and gpu[0]["dur"] == pytest.approx(2.0)
    assert gpu[1]["ts"] == pytest.approx(500_003.0) and gpu[1]["dur"] == pytest.approx(1.5)
    # the second submit: one span not available (Metal's 0.0) -> no event for it, and not per kernel any more
    assert len(gpu) == 3 and gpu[2]["name"] == "command buffer (submit 1)"
    assert gpu[2]["ts"] == pytest.approx(501_000.0)


@pytest.mark.parametrize("doc,message", [
    ([], "traceEvents"),
    ({"traceEvents": [{"name": "x", "ph": "B", "pid": 1, "tid": 1}]}, "ph 'B'"),
    ({"traceEvents": [{"name": "x", "ph": "X", "pid": 1, "tid": 1, "ts": -1, "dur": 0}]}, "negative"),
    ({"traceEvents": [{"name": "x", "ph": "X", "pid": 1, "tid": 1, "ts": 0}]}, "'dur'"),
    ({"traceEvents": [{"name": "x", "ph": "X", "pid": "1", "tid": 1, "ts": 0, "dur": 0}]}, "'pid'"),
    ({"traceEvents": [{"name": "process_name", "ph": "M", "pid": 1, "tid": 1, "args": {}}]}, "args.name"),
    ({"traceEvents": [], "displayTimeUnit": "s"}, "displayTimeUnit"),
])
def test_the_schema_check_refuses_what_perfetto_would_not_read(doc: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_chrome_trace(doc)


def test_host_clock_closes_the_open_span_when_the_next_starts() -> None:
    clock = HostClock()
    clock.start("a")
    clock.start("b", n=1)
    clock.stop()
    clock.stop()
    assert [s.name for s in clock.spans] == ["a", "b"] and clock.spans[1].args == {"n": 1}
    assert clock.origin <= clock.spans[0].start_s <= clock.spans[0].end_s <= clock.spans[1].start_s
    assert clock.starts("b") == [clock.spans[1].start_s]


def test_a_clock_that_does_not_record_keeps_no_spans() -> None:
    """Without --profile the run's clock keeps nothing: one span per submit would grow without bound."""
    from mtlir.cli.profile import HostClock
    quiet, loud = HostClock(record=False), HostClock()
    for clock in (quiet, loud):
        for i in range(3):
            clock.start(f"submit {i}")
        clock.stop()
    assert quiet.spans == [] and [s.name for s in loud.spans] == ["submit 0", "submit 1", "submit 2"]


def test_a_failed_run_says_its_profile_and_page_were_not_written(tmp_path: Path) -> None:
    """--html and --profile describe a run: after a GPU error there is none, and the CLI says so (it said nothing)."""
    from mtlir.cli.main import main
    root = Path(__file__).resolve().parents[2]
    doc = json.loads((root / "examples" / "traces" / "mlp.apple7.json").read_text())
    first = doc["dispatches"][0]
    first["grid"] = [g * 8 for g in first["grid"]]  # eight times the threadgroups: accesses past the buffers
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    out, log = io.StringIO(), io.StringIO()
    code = main(["run", str(bad), "--device", "sim", "--html", str(tmp_path / "p.html"),
                 "--profile", str(tmp_path / "p.json")], out=out, log=log)
    assert code == 3, log.getvalue()
    assert not (tmp_path / "p.html").exists() and not (tmp_path / "p.json").exists()
    assert f"--html {tmp_path / 'p.html'} not written: the run failed" in log.getvalue()
    assert f"--profile {tmp_path / 'p.json'} not written: the run failed" in log.getvalue()
