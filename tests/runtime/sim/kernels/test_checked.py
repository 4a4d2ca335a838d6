"""Checked kernels (runtime/sim/kernels/oclgrind.py): a kernel that races on one element and one that reads past its
buffer, run on Oclgrind without mtlir's bounds checks, are errors naming the kernel, the MSL line and the kind of
problem, from ``check_kernel``, ``SimDevice(checked=True)`` and ``mtlir run --check-kernels``; Oclgrind's report
text is read and mapped back to the MSL line without Oclgrind too."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mtlir.errors import KernelCheckError, NoDeviceError
from mtlir.frontend.nodes import buffer, timeline_value
from mtlir.frontend.queue import Queue
from mtlir.metal import DeviceSpec, Kernel, KernelParam
from mtlir.passes import lower
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.kernels.oclgrind import available, check_kernel, parse_reports
from mtlir.runtime.sim.msl.translate import translate

pytest.importorskip("pyopencl")
needs_oclgrind = pytest.mark.skipif(not available(), reason="Oclgrind is not installed (make oclgrind installs "
                                                            "Debian's package oclgrind)")

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
RACE = HEAD + """kernel void race(device float* out [[buffer(0)]],
                 uint i [[thread_position_in_grid]]) {
  out[0] = float(i);
}"""  # every thread writes element 0, no atomic: line 5
OOB = HEAD + """kernel void oob(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                uint i [[thread_position_in_grid]]) {
  float v = 2.0f;
  y[i] = x[i + 1] * v;
}"""  # the last thread reads one float past x: line 6
GOOD = HEAD + """kernel void good(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
  y[i] = x[i] + 1.0f;
}"""
ROOT = Path(__file__).resolve().parents[4]

SAMPLE = """Invalid read of size 4 at global memory address 0x2000000000100
\tKernel: oob
\tEntity: Global(63,0,0) Local(31,0,0) Group(1,0,0)
\t  %4 = load float, float addrspace(1)* %arrayidx3, align 4
\tAt line {line} (column 10) of input.cl:
\t  y[i] = x[i + 1] * v;

Write-write data race at global memory address 0x2000000000002
\tKernel: race
\tFirst entity:  Global(1,0,0) Local(1,0,0) Group(0,0,0)
"""


def _bytes(n: int) -> np.ndarray:
    return np.zeros(n, np.uint8)


def test_reports_are_read_and_mapped_to_the_msl_line() -> None:
    t = translate(OOB, bounds_checks=False)
    line = next(i for i, text in enumerate(t.source.split("\n"), 1) if "x[i + 1]" in text)
    oob, race = parse_reports(SAMPLE.format(line=line), t, OOB)
    assert (oob.kind, oob.kernel, oob.cl_line, oob.msl_line) == ("out-of-bounds read", "oob", line, 6)
    assert (race.kind, race.kernel, race.cl_line, race.msl_line) == ("data race (write-write)", "race", None, None)
    assert parse_reports("nothing to say\n") == []


@needs_oclgrind
def test_a_race_on_one_element_is_caught() -> None:
    with pytest.raises(KernelCheckError) as e:
        check_kernel(RACE, "race", {0: (_bytes(64), 0)}, (2, 1, 1), (32, 1, 1))
    assert (e.value.function, e.value.kind, e.value.msl_line) == ("race", "data race (write-write)", 5)
    assert "kernel 'race': data race (write-write) at MSL line 5: `out[0] = float(i);`" in str(e.value)


@needs_oclgrind
def test_a_read_past_the_buffer_is_caught() -> None:
    with pytest.raises(KernelCheckError) as e:
        check_kernel(OOB, "oob", {0: (_bytes(256), 0), 1: (_bytes(256), 0)}, (2, 1, 1), (32, 1, 1))
    assert (e.value.function, e.value.kind, e.value.msl_line) == ("oob", "out-of-bounds read", 6)
    assert "MSL line 6: `y[i] = x[i + 1] * v;`" in str(e.value) and "Invalid read of size 4" in e.value.report


@needs_oclgrind
def test_a_correct_kernel_passes_and_a_view_is_honoured() -> None:
    check_kernel(GOOD, "good", {0: (_bytes(512), 256), 1: (_bytes(256), 0)}, (2, 1, 1), (32, 1, 1))
    with pytest.raises(KernelCheckError, match="out-of-bounds read"):  # 64 floats from byte 260: one past the end
        check_kernel(GOOD, "good", {0: (_bytes(512), 260), 1: (_bytes(256), 0)}, (2, 1, 1), (32, 1, 1))


ROTATE = HEAD + """kernel void rotate(device uint* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  uint x = y[i];
  y[i] = (x << 13u) + (x >> 19u);
}
"""


@needs_oclgrind
def test_a_rotate_written_as_shifts_is_checked() -> None:
    """A new user's finding: every kernel of tinygrad's random numbers failed its check (`--check-kernels` exit 3,
    `clCreateKernel failed: INVALID_KERNEL_NAME`, a traceback): LLVM's optimizer made the rotate an llvm.fshl call,
    which Oclgrind cannot run. The check builds unoptimized now: the kernel runs clean; its bad twin is caught. The
    kernel is named like OpenCL's built-in `rotate` (so `__mtl_kernel_rotate` in OpenCL): Oclgrind's reports name
    that kernel and still count."""
    check_kernel(ROTATE, "rotate", {0: (_bytes(256), 0)}, (2, 1, 1), (32, 1, 1))
    with pytest.raises(KernelCheckError, match="out-of-bounds"):
        check_kernel(ROTATE, "rotate", {0: (_bytes(252), 0)}, (2, 1, 1), (32, 1, 1))


@needs_oclgrind
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "faithful"])
def test_the_simulated_device_checks_every_kernel(strict: bool) -> None:
    """The racy kernel runs without complaint on the normal path; checked, the host's next call raises."""
    race = Kernel("race", "race", RACE, (KernelParam(None, 0, "float32"),))
    q = Queue(DeviceSpec("Apple9"))
    q.exec(race, [buffer("out", 256)], [], (2,), (32,)).signal(q.timeline, timeline_value())
    program = lower(q.submit(), target="x86_64").program
    with SimDevice("x86_64", strict=strict) as dev, Session(program, dev, timeout_s=60) as s:
        s.submit()
        s.wait(timeout_s=60)
    with pytest.raises(KernelCheckError, match=r"kernel 'race': data race \(write-write\) at MSL line 5"):
        with SimDevice("x86_64", strict=strict, checked=True) as dev, Session(program, dev, timeout_s=60) as s:
            s.submit()
            s.wait(timeout_s=60)


def _trace(tmp_path: Path) -> Path:
    """A one-dispatch trace of the out-of-bounds kernel (the format of docs/lowering.md "Traces")."""
    trace = {"workload": "oob", "arch": "Apple9", "variables": {},
             "buffers": {"1": {"size": 256, "init": {"offset": 0, "b64": base64.b64encode(bytes(256)).decode()}},
                         "2": {"size": 256, "init": None}},
             "programs": {"oob": {"function": "oob", "msl": OOB,
                                  "signature": [[None, 0, "dtypes.float", [64]], [None, 1, "dtypes.float", [64]]]}},
             "dispatches": [{"kernel": "oob", "grid": [2, 1, 1], "threadgroup": [32, 1, 1],
                             "args": [{"buffer": 1, "offset": 0, "size": 256}, {"buffer": 2, "offset": 0, "size": 256}],
                             "vars": []}],
             "output": {"buffer": 2, "offset": 0, "dtype": "dtypes.float", "shape": [64],
                        "expected_b64": base64.b64encode(bytes(256)).decode()}}
    path = tmp_path / "oob.json"
    path.write_text(json.dumps(trace))
    return path


@needs_oclgrind
def test_mtlir_run_check_kernels_exits_3_naming_kernel_line_and_kind(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONSAFEPATH="1")
    run = [sys.executable, "-m", "mtlir", "run", str(_trace(tmp_path)), "--device", "sim", "--order-seed", "4"]
    proc = subprocess.run([*run, "--check-kernels"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "kernel 'oob': out-of-bounds read at MSL line 6" in proc.stderr, proc.stderr[-2000:]
    bad = subprocess.run([*run[:-1], "-1"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and "--order-seed -1" in bad.stderr, bad.stderr[-2000:]


def test_check_kernels_without_oclgrind_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from mtlir.cli.main import main
    from mtlir.runtime.sim.kernels import oclgrind
    monkeypatch.setattr(oclgrind, "available", lambda: False)
    out, log = io.StringIO(), io.StringIO()
    code = main(["run", str(_trace(tmp_path)), "--device", "sim", "--check-kernels"], out=out, log=log)
    assert code == 2 and "--check-kernels runs the kernels on Oclgrind, which is not installed" in log.getvalue()
    with pytest.raises(NoDeviceError, match="checked kernels need Oclgrind"):
        oclgrind.check_kernel(GOOD, "good", {0: (_bytes(256), 0), 1: (_bytes(256), 0)}, (2, 1, 1), (32, 1, 1))


SPIN = HEAD + """kernel void spin(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  while (true) {}
}"""  # never ends


def _children(mark: str) -> list[int]:
    """The pids of live processes whose environment holds ``MTLIR_TEST_MARK=mark`` (the children inherit it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            marked = f"MTLIR_TEST_MARK={mark}".encode() in (proc / "environ").read_bytes().split(b"\0")
            if proc.name.isdigit() and marked:
                if (proc / "stat").read_text().split(") ")[-1][:1] != "Z":
                    found.append(int(proc.name))
        except OSError:
            pass
    return found


def _gone(mark: str, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while _children(mark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


linux_only = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")


@needs_oclgrind
def test_a_check_past_its_time_limit_is_stopped_naming_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from mtlir.runtime.sim.kernels import oclgrind
    monkeypatch.setenv("MTLIR_TEST_MARK", "limit")
    with pytest.raises(TimeoutError, match="Oclgrind did not finish kernel 'spin' in 1 s"):
        check_kernel(SPIN, "spin", {0: (_bytes(64), 0)}, (1, 1, 1), (4, 1, 1), timeout_s=1)
    assert not oclgrind._LIVE
    if Path("/proc/self/environ").exists():
        assert _gone("limit", within_s=0)


@needs_oclgrind
@linux_only
@pytest.mark.parametrize("how", ["kill", "exit"])
def test_the_child_ends_with_its_parent(how: str) -> None:
    """A parent killed (SIGKILL: no finally, no atexit) or leaving with os._exit mid-check takes the child along."""
    mark = f"parent-{how}-{os.getpid()}"
    ends = "time.sleep(600)" if how == "kill" else "time.sleep(3); os._exit(0)"
    script = ("import os, threading, time\n"
              "from mtlir.runtime.sim.kernels.oclgrind import check_kernel\n"
              "import numpy as np\n"
              f"SPIN = {SPIN!r}\n"
              "threading.Thread(target=check_kernel, daemon=True, args=(SPIN, 'spin', "
              "{0: (np.zeros(64, np.uint8), 0)}, (1, 1, 1), (4, 1, 1)), kwargs={'timeout_s': 600}).start()\n"
              f"{ends}\n")
    env = dict(os.environ, PYTHONSAFEPATH="1", MTLIR_TEST_MARK=mark)
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 60
        while len(_children(mark)) < 2:  # the parent and its child
            assert parent.poll() is None and time.monotonic() < deadline, "the check's child never started"
            time.sleep(0.1)
        if how == "kill":
            parent.kill()
        parent.wait(timeout=30)
        assert _gone(mark), f"the child outlived its parent: {_children(mark)}"
    finally:
        parent.kill()
        for pid in _children(mark):
            os.kill(pid, signal.SIGKILL)


def _good_trace(tmp_path: Path, msl: str = GOOD, function: str = "good") -> Path:
    """A one-dispatch trace of ``function`` (y = f(x), 64 floats each): ``_trace``'s format."""
    trace = json.loads(_trace(tmp_path).read_text())
    trace["programs"] = {function: {"function": function, "msl": msl,
                                    "signature": [[None, 0, "dtypes.float", [64]], [None, 1, "dtypes.float", [64]]]}}
    trace["dispatches"][0]["kernel"] = function
    trace["output"]["expected_b64"] = base64.b64encode(np.ones(64, np.float32).tobytes()).decode()
    path = tmp_path / f"{function}.json"
    path.write_text(json.dumps(trace))
    return path


@needs_oclgrind
@linux_only
def test_mtlir_run_check_kernels_timeout_names_the_kernel_and_leaves_no_child(tmp_path: Path) -> None:
    spin = HEAD + """kernel void spin(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
  while (true) {}
}"""
    mark = f"cli-{os.getpid()}"
    env = dict(os.environ, PYTHONSAFEPATH="1", MTLIR_TEST_MARK=mark)
    run = [sys.executable, "-m", "mtlir", "run", str(_good_trace(tmp_path, spin, "spin")), "--device", "sim",
           "--check-kernels", "--timeout", "3"]
    proc = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    try:
        assert proc.returncode == 3, proc.stderr[-2000:]
        # the run's wait and the check end after the same --timeout: whichever comes first names the kernel
        assert ("kernel 'spin' is still running" in proc.stderr
                or "Oclgrind did not finish kernel 'spin' in 3 s" in proc.stderr), proc.stderr[-2000:]
        assert _gone(mark), f"the check's child outlived mtlir: {_children(mark)}"
    finally:
        for pid in _children(mark):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The MSL of each launch checked on Oclgrind (``oclgrind.check_launch`` counted, then run)."""
    from mtlir.runtime.sim.kernels import oclgrind
    seen: list[str] = []
    real = oclgrind.check_launch

    def counting(msl: str, launch: object, timeout_s: float = 120.0, children: object = None) -> None:
        seen.append(msl)
        real(msl, launch, timeout_s, children)  # type: ignore[arg-type]
    monkeypatch.setattr(oclgrind, "check_launch", counting)
    return seen


@needs_oclgrind
def test_each_distinct_launch_is_checked_once(tmp_path: Path, checks: list[str]) -> None:
    """--repeat 4: each run sees the trace's x and y (mtlir run restores the buffers a submit changed before the
    next): one distinct launch, checked once, not four times."""
    import io

    from mtlir.cli.main import main
    out, log = io.StringIO(), io.StringIO()
    code = main(["run", str(_good_trace(tmp_path)), "--device", "sim", "--check-kernels", "--repeat", "4"],
                out=out, log=log)
    assert code == 0, log.getvalue()
    assert len(checks) == 1


@needs_oclgrind
def test_a_launch_whose_bytes_changed_is_checked_again(checks: list[str]) -> None:
    """A check is kept per distinct launch and bytes (its buffers' bytes, the output's among them): the same submit
    on the same bytes is checked once, and after the host wrote its input the launch is checked again (what
    `mtlir run --repeat` no longer shows, since each repeat now runs on the trace's own bytes)."""
    good = Kernel("good", "good", GOOD, (KernelParam(None, 0, "float32"), KernelParam(None, 1, "float32")))
    q = Queue(DeviceSpec("Apple9"))
    q.exec(good, [buffer("x", 256), buffer("y", 256)], [], (2,), (32,)).signal(q.timeline, timeline_value())
    program = lower(q.submit(), target="x86_64").program
    with SimDevice("x86_64", checked=True) as dev, Session(program, dev, timeout_s=60) as s:
        for _ in range(3):  # the first run changes y (the launch's bytes): the second is checked, the third not
            s.submit()
            s.wait(timeout_s=60)
        assert len(checks) == 2
        s.write("buffer:x", np.full(64, 2.0, np.float32).tobytes())
        s.submit()
        s.wait(timeout_s=60)
        assert len(checks) == 3
        assert np.frombuffer(s.read("buffer:y"), np.float32).tolist() == [3.0] * 64


@needs_oclgrind
@linux_only
def test_closing_a_checked_device_kills_its_check_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """SimDevice.close() while an Oclgrind check runs kills that child (it would have run until its time limit):
    the check ends saying the device was closed, and no child is left."""
    mark = f"close-{os.getpid()}"
    monkeypatch.setenv("MTLIR_TEST_MARK", mark)
    spin = Kernel("spin", "spin", SPIN, (KernelParam(None, 0, "float32"),))
    q = Queue(DeviceSpec("Apple9"))
    q.exec(spin, [buffer("out", 256)], [], (1,), (4,)).signal(q.timeline, timeline_value())
    program = lower(q.submit(), target="x86_64").program
    dev = SimDevice("x86_64", checked=True)
    dev.check_timeout_s = 600  # type: ignore[attr-defined]  # far past the test: only close() can end the check
    s = Session(program, dev, timeout_s=60)
    try:
        s.submit()
        deadline = time.monotonic() + 60
        while not _children(mark):
            assert time.monotonic() < deadline, "the check's child never started"
            time.sleep(0.05)
        dev.close()
        assert _gone(mark), f"the check's child outlived the device's close: {_children(mark)}"
        runner = dev.kernel_runner
        deadline = time.monotonic() + 30
        while runner.checking is not None:  # the GPU thread's check ends with the child, naming why
            assert time.monotonic() < deadline, "the check did not end after its child was killed"
            time.sleep(0.05)
        assert "the SimDevice was closed" in str(dev.gpu.last_exception)
        s.close(timeout_s=0.0)  # on a closed device: sends nothing
    finally:
        for pid in _children(mark):
            os.kill(pid, signal.SIGKILL)
