"""The benchmarks package runs: ``python -m benchmarks --json --quick`` gives every figure of issue 14, each a
finite number (a smoke test: nothing is timed against a bound here; benchmarks/ measures, the tests do not)."""
from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCALARS = ["lowering_scaling_100k_over_1k", "rewrite_nomatch_over_dfs", "replay_interp_over_direct",
           "replay_compiled_over_direct", "submit_time_100k_over_10", "sim_run_over_pyopencl",
           "sim_overhead_us_per_dispatch", "long_over_pyopencl", "memory_bytes_per_cmd"]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks ARGS`` from the repository root as ``make bench`` runs it: the package found through
    a folder holding only a link to it (the root itself on sys.path would hide the installed mtlir)."""
    (tmp_path / "path").mkdir(exist_ok=True)
    link = tmp_path / "path" / "benchmarks"
    if not link.exists():
        link.symlink_to(ROOT / "benchmarks")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "path"), "PYTHONSAFEPATH": "1"}
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=540)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _standin_here() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and bool(shutil.which("cc") or shutil.which("gcc"))


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    done = _run(tmp_path_factory.mktemp("bench"), "--json", "--quick")
    assert done.returncode == 0, done.stderr[-4000:]
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_every_figure_is_there_and_finite(figures: dict[str, Any]) -> None:
    keys = [k for k in SCALARS if _standin_here() or not k.startswith(("replay_", "submit_"))]
    missing = [k for k in keys if k not in figures]
    assert not missing, f"missing {missing}; skipped: {figures.get('skipped')}"
    assert {k: figures[k] for k in keys if not _finite(figures[k])} == {}
    per = figures["lowering_us_per_cmd"]
    assert set(per) >= {"icb", "direct", "icb+ts", "direct+ts", "icb+sig"}
    assert all(_finite(v) and v > 0 for row in per.values() for v in row.values()) and all(per.values())
    msgs = figures["messages_per_submit"]
    assert set(msgs) == {"icb", "direct"} and all(_finite(v) for row in msgs.values() for v in row.values())


def test_tinygrad_comparison_where_tinygrad_is(figures: dict[str, Any]) -> None:
    try:
        import tinygrad  # noqa: F401
    except ImportError:
        assert "rewrite_match_over_tinygrad" not in figures
        return
    assert _finite(figures["rewrite_match_over_tinygrad"])


def test_figures_say_what_they_measured(figures: dict[str, Any]) -> None:
    """Each ratio comes with the absolute numbers it divides."""
    for case in figures["replay_cases"].values() if _standin_here() else ():
        assert case["us_hand_written"] > 0 and case["messages"] > 0
        assert math.isclose(case["compiled_over_direct"], case["us_compiled"] / case["us_hand_written"], rel_tol=1e-6)
    assert figures["machine"]["cpus"] >= 1 and figures["quick"] is True


def test_only_and_bad_options(tmp_path: Path) -> None:
    done = _run(tmp_path, "--json", "--quick", "--only", "rewrite")
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert "rewrite_nomatch_over_dfs" in doc and "lowering_us_per_cmd" not in doc
    bad = _run(tmp_path, "--only", "nosuch")
    assert bad.returncode == 2 and "unknown group" in bad.stderr


def test_table(tmp_path: Path) -> None:
    done = _run(tmp_path, "--quick", "--only", "rewrite")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rewrite_nomatch_over_dfs" in done.stdout and "<= 2" in done.stdout
    # quick sizes measure nothing against the targets: no ok/MISS verdict (a quick run printed MISS rows)
    rows = [line for line in done.stdout.splitlines() if "<= " in line]
    assert rows and all("n/a (quick sizes)" in line and "MISS" not in line for line in rows), done.stdout


def test_the_table_gives_a_verdict_only_at_full_sizes(tmp_path: Path) -> None:
    fig = {"machine": {"processor": "p", "cpus": 1, "python": "3"}, "skipped": {},
           "memory_bytes_per_cmd": 2048.0, "memory_commands": 100, "sim_overhead_us_per_dispatch": 5.0,
           "sim_device": "d"}
    for quick, verdicts in ((False, ["MISS", "ok "]), (True, ["n/a (quick sizes)"] * 2)):
        code = f"import sys; from benchmarks.report import table; table({ {**fig, 'quick': quick}!r}, sys.stdout)"
        (tmp_path / "path").mkdir(exist_ok=True)
        if not (tmp_path / "path" / "benchmarks").exists():
            (tmp_path / "path" / "benchmarks").symlink_to(ROOT / "benchmarks")
        env = {**os.environ, "PYTHONPATH": str(tmp_path / "path"), "PYTHONSAFEPATH": "1"}
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        rows = [line for line in done.stdout.splitlines() if "<= " in line]
        assert len(rows) == 2 and all(v in row for v, row in zip(verdicts, rows)), done.stdout


@pytest.fixture
def bench_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``benchmarks.bench_dispatch`` and ``benchmarks.report`` imported in this process through a folder holding
    only a link to the package (as ``_run`` finds it)."""
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "benchmarks").symlink_to(ROOT / "benchmarks")
    monkeypatch.syspath_prepend(str(tmp_path / "path"))
    import importlib
    return importlib.import_module("benchmarks.bench_dispatch"), importlib.import_module("benchmarks.report")


@pytest.mark.parametrize("argv, problem", [
    (["--rounds", "0"], "argument --rounds: 0: at least 1"),  # was statistics.StatisticsError after the set-up
    (["--rounds", "-2"], "argument --rounds: -2: at least 1"),
    (["--long-repeat", "0"], "argument --long-repeat: 0: at least 1"),
    (["--opencl-device", "nosuch"], "--opencl-device nosuch: no OpenCL device matches 'nosuch'"),  # NoDeviceError
    (["--opencl-device", ""], "argument --opencl-device: '': an empty name"),
    (["--long-traces", "nosuch.json"], "--long-traces: no trace 'nosuch.json'"),  # after all 12 traces ran
    (["--skip", "nosuch.json"], "--skip: no trace 'nosuch.json'"),
    (["--json", "/nonexistent/x.json"], "--json /nonexistent/x.json: no folder /nonexistent"),  # after the run
    (["--json", ""], "argument --json: '': an empty path"),
])
def test_bench_dispatch_refuses_bad_options_before_measuring(bench_modules: Any, argv: list[str], problem: str,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    bench_dispatch, _ = bench_modules
    monkeypatch.setattr(bench_dispatch, "measure", None)  # never reached: the options are checked first
    with pytest.raises(SystemExit) as info:
        bench_dispatch.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and problem in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv, problem", [
    (["--opencl-device", "nosuch"], "--opencl-device nosuch: no OpenCL device matches 'nosuch'"),
    (["--opencl-device", " "], "argument --opencl-device: ' ': an empty name"),
    (["--plot", ""], "argument --plot: '': an empty path"),
])
def test_benchmarks_refuse_bad_options_before_running(bench_modules: Any, argv: list[str], problem: str,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, report = bench_modules
    monkeypatch.setattr(report, "run_groups", None)  # never reached
    with pytest.raises(SystemExit) as info:
        report.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and problem in err, err


def test_plot_into_a_folder_that_cannot_be_made_is_refused(bench_modules: Any, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _, report = bench_modules
    if __import__("importlib").util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed: --plot is refused for that first (make bench installs it)")
    monkeypatch.setattr(report, "run_groups", None)  # never reached
    with pytest.raises(SystemExit) as info:
        report.main(["--plot", "/proc/nosuch/dir"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--plot /proc/nosuch/dir: cannot make the folder" in err, err


def test_plot_into_a_file_is_refused(bench_modules: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, report = bench_modules
    afile = tmp_path / "afile"
    afile.write_text("x")
    if __import__("importlib").util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed: --plot is refused for that first (make bench installs it)")
    with pytest.raises(SystemExit):
        report.main(["--plot", str(afile)])
    assert f"--plot {afile}: is a file, not a folder" in capsys.readouterr().err
