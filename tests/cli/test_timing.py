"""``mtlir run``'s time figures: a single submit's are mostly one-time costs (PoCL builds each kernel at its first
launch, inside the GPU span: cnn.apple7 showed 1.05 s of GPU time for one submit with an empty kernel cache, 0.148 s
per submit over ten), so with more submits the first is left out of the per-submit figures and reported on its own,
and with one submit the figures say they include those costs."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from mtlir.cli.main import main
from mtlir.cli.timing import submit_timing
from mtlir.runtime.submission import GpuSpan, Submission

MLP7 = str(Path(__file__).resolve().parents[2] / "examples" / "traces" / "mlp.apple7.json")


def _done(index: int, gpu_ns: int | None) -> Submission:
    rec = Submission(index, index + 1, (1,), 0.0)
    rec.spans.append(GpuSpan(0, 7, None if gpu_ns is None else 7 + gpu_ns))
    return rec


def test_the_first_submit_is_left_out_of_the_means_when_there_are_more() -> None:
    kept = [_done(0, 1_000_000_000), _done(1, 100_000_000), _done(2, 300_000_000)]
    t = submit_timing(kept, host_s_total=12.0, first_host_s=10.0, submits=3)
    assert t.host_s_per_submit == 1.0 and t.gpu_s_per_submit == pytest.approx(0.2)
    assert t.timed_submits == 2 and not t.includes_first_submit
    assert t.first_submit_host_s == 10.0 and t.first_submit_gpu_s == 1.0
    assert t.text("compiled") == "host time per submit: 1000000.0 us (compiled; submits 2..3, the first left out: " \
                                 "10000000.0 us)"


def test_one_submit_is_labelled_as_including_the_one_time_costs() -> None:
    t = submit_timing([_done(0, 1_000_000_000)], host_s_total=10.0, first_host_s=10.0, submits=1)
    assert t.host_s_per_submit == 10.0 and t.gpu_s_per_submit == 1.0 and t.includes_first_submit
    assert t.timed_submits == 1 and "includes the one-time costs of the first run" in t.text("compiled")


def test_a_gpu_time_not_available_stays_none() -> None:
    t = submit_timing([_done(0, 5), _done(1, None)], host_s_total=2.0, first_host_s=1.0, submits=2)
    assert t.gpu_s_per_submit is None and t.first_submit_gpu_s == 5e-9


def _run(*argv: str) -> tuple[int, dict[str, Any], str]:
    out, log = io.StringIO(), io.StringIO()
    code = main(["run", MLP7, "--device", "sim", *argv], out=out, log=log)
    return code, json.loads(out.getvalue()) if "--json" in argv else {}, out.getvalue() + log.getvalue()


@pytest.mark.parametrize("repeat", [1, 3])
def test_run_reports_which_submits_the_figures_cover(repeat: int) -> None:
    code, doc, _ = _run("--repeat", str(repeat), "--json")
    assert code == 0
    assert doc["timed_submits"] == max(1, repeat - 1) and doc["includes_first_submit"] is (repeat == 1)
    assert doc["first_submit_host_s"] > 0 and doc["host_s_per_submit"] > 0
    assert doc["gpu_s_per_submit"] is not None and doc["first_submit_gpu_s"] is not None
    if repeat == 1:
        assert doc["host_s_per_submit"] == doc["first_submit_host_s"]
    code, _, text = _run("--repeat", str(repeat))
    label = "one submit: includes the one-time costs" if repeat == 1 else "submits 2..3, the first left out: "
    assert code == 0 and label in text, text
