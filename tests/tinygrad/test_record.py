"""``mtlir record`` / ``mtlir.tinygrad.record``: a tinygrad script's kernel queue recorded as a trace that ``mtlir run``
replays and matches (the examples/tinygrad scripts), the trace's round trip through ``load_trace``, and scripts that
cannot be recorded (exit 2, a clear error)."""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mtlir.cli.main import main
from mtlir.cli.record import split_script_args
from mtlir.cli.report import UsageError
from mtlir.frontend.trace import load_trace
from mtlir.tinygrad.record import RecordError, record, record_trace, trace_dtype

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tinygrad"


def _run(trace: Path) -> tuple[int, str]:
    """``mtlir run TRACE`` in this process (the same code path as the command): exit code and its stdout."""
    out, log = io.StringIO(), io.StringIO()
    code = main(["run", str(trace)], out=out, log=log)
    return code, out.getvalue() + log.getvalue()


def test_record_mlp_then_run_matches(tmp_path: Path) -> None:
    out = tmp_path / "mlp.json"
    code = main(["record", str(EXAMPLES / "mlp.py"), "-o", str(out)], out=io.StringIO(), log=io.StringIO())
    assert code == 0
    trace = load_trace(out)  # the round trip: what record writes, load_trace reads back
    assert trace.workload == "mlp" and trace.arch == "Apple9"
    assert len(trace.dispatches) == 5 and trace.output.shape == (8, 10)
    assert any("simdgroup" in k.msl for k in trace.kernels.values())  # Apple9: tensor cores on
    inputs = [b for b in trace.buffers.values() if b.init is not None]
    assert sorted(b.size for b in inputs) == [2048, 5120, 32768]  # x 8x64, w2 128x10, w1 64x128
    code, text = _run(out)
    assert code == 0 and "result: match" in text, text


def test_record_symbolic_kv_keeps_the_variable_and_its_grids(tmp_path: Path) -> None:
    out = tmp_path / "kv.json"
    record(EXAMPLES / "symbolic_kv.py", ["--start-pos", "7"], out, expected="PYTHON")
    data = json.loads(out.read_text())
    assert "tinygrad's PYTHON device" in data["made_with"]
    assert data["variables"] == {"start_pos": {"value": 7, "min": 1, "max": 32}}
    exprs = [d.get("grid_expr") for d in data["dispatches"]]
    assert ["start_pos", 1, 1] in exprs and all(d["vars"] == [7] for d in data["dispatches"])
    assert {tuple(d["grid"]) for d in data["dispatches"] if d.get("grid_expr")} == {(7, 1, 1)}
    code, text = _run(out)
    assert code == 0 and "result: match" in text, text


def test_record_apple7_from_the_command_line(tmp_path: Path) -> None:
    """``--arch apple7`` in a fresh process (one process renders for one family): no SIMD-group matrices, as the
    Apple7 traces of examples/traces, and the replay matches."""
    out = tmp_path / "conv7.json"
    proc = subprocess.run([sys.executable, "-m", "mtlir.cli.main", "record", str(EXAMPLES / "conv.py"), "--arch",
                           "apple7", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2 dispatches" in proc.stdout and "(Apple7)" in proc.stdout
    trace = load_trace(out)
    assert trace.arch == "Apple7" and not any("simdgroup" in k.msl for k in trace.kernels.values())
    code, text = _run(out)
    assert code == 0 and "result: match" in text, text


def test_a_wrong_expected_output_is_a_mismatch(tmp_path: Path) -> None:
    """The replay really compares: the recorded conv trace with its expected output changed fails (exit 1)."""
    data = record_trace(EXAMPLES / "conv.py")
    raw = bytearray(__import__("base64").b64decode(data["output"]["expected_b64"]))
    raw[0:4] = b"\x00\x00\x80\x7f"  # +inf where a mean of relu values is
    data["output"]["expected_b64"] = __import__("base64").b64encode(bytes(raw)).decode()
    out = tmp_path / "conv.json"
    out.write_text(json.dumps(data))
    assert _run(out)[0] == 1


@pytest.mark.parametrize("body, problem", [
    ("def main(:\n", "SyntaxError"),
    ("x = 1\n", "defines no main()"),
    ("def main():\n    return 3\n", "returned int, not the output Tensor"),
    ("def main():\n    raise ValueError('no data')\n", "ValueError: no data"),
    ("import sys\ndef main():\n    sys.exit(3)\n", "exited with status 3"),
    ("from tinygrad import Tensor\ndef main():\n    return Tensor([1.0, 2.0])\n", "no kernel of the recording wrote"),
    ("import numpy as np\nfrom tinygrad import Tensor\ndef main():\n    a = Tensor(np.ones(4, np.float32)).realize()\n"
     "    b = (a * 2).realize()\n    a.assign(Tensor(np.zeros(4, np.float32))).realize()\n    return b + a\n",
     "from the host after a kernel used it"),
    ("from tinygrad import Tensor\ndef main():\n    return Tensor.zeros(0) + 1\n", "has shape (0,): no elements"),
    ("import os\ndef main():\n    os._exit(0)\n", "called os._exit(0), ending the process before main() returned"),
    ("from tinygrad import Tensor\ndef main():\n    return Tensor.rand(4, 4) + 1\n", "seed the RNG"),
])
def test_a_script_that_cannot_be_recorded_is_exit_2(tmp_path: Path, body: str, problem: str) -> None:
    script = tmp_path / "bad.py"
    script.write_text(body)
    with pytest.raises(RecordError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        record_trace(script)
    log = io.StringIO()
    assert main(["record", str(script), "-o", str(tmp_path / "t.json")], out=io.StringIO(), log=log) == 2
    assert problem in log.getvalue(), log.getvalue()
    assert not (tmp_path / "t.json").exists()


def test_record_command_line_errors_are_exit_2(tmp_path: Path) -> None:
    log = io.StringIO()
    assert main(["record", str(EXAMPLES / "mlp.py")], out=io.StringIO(), log=log) == 2
    assert "-o TRACE.json is required" in log.getvalue()
    log = io.StringIO()
    assert main(["record", str(tmp_path / "none.py"), "-o", str(tmp_path / "t.json")], out=io.StringIO(), log=log) == 2
    assert "no such script" in log.getvalue()


def test_record_options_after_the_script_are_records_the_rest_the_scripts() -> None:
    args = argparse.Namespace(args=["--start-pos", "3", "-o", "t.json", "--arch=APPLE7", "--", "-o", "x"],
                              output=None, arch=None, expected=None, workload=None, debug=False)
    split_script_args(args)
    assert args.args == ["--start-pos", "3", "-o", "x"]
    assert (str(args.output), args.arch) == ("t.json", "apple7")
    with pytest.raises(UsageError, match="--arch 'm1'"):
        split_script_args(argparse.Namespace(args=["--arch", "m1"], output=None, arch=None, expected=None))
    with pytest.raises(UsageError, match="-o needs a value"):
        split_script_args(argparse.Namespace(args=["-o"], output=None))


def test_another_family_in_a_process_whose_device_is_open_is_refused() -> None:
    from tinygrad.device import Device
    arch = Device["METAL"].arch
    other = "Apple7" if arch != "Apple7" else "Apple9"
    with pytest.raises(RecordError, match=f"open for {arch}: it cannot record {other}"):
        record_trace(EXAMPLES / "conv.py", family=other)


def test_the_script_cannot_end_the_process_and_os_exit_comes_back(tmp_path: Path) -> None:
    import os
    script = tmp_path / "ends.py"
    script.write_text("import os\nos._exit(3)\n")
    exit_ = os._exit
    with pytest.raises(RecordError, match=r"called os._exit\(3\)"):
        record_trace(script)
    assert os._exit is exit_


_TG_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32"]


def test_every_tinygrad_dtype_has_the_trace_name_load_trace_reads() -> None:
    """tinygrad names its dtypes as C does ("unsigned char"): the trace's are mtlir's, and load_trace's reader
    takes each; bfloat16 (no mtlir dtype) is refused, naming it."""
    from tinygrad import dtypes as tg
    from mtlir.frontend.checks import param_dtype
    for name in _TG_DTYPES:
        assert trace_dtype(getattr(tg, name)) == f"dtypes.{name}"
        assert param_dtype(trace_dtype(getattr(tg, name))).name == name
    with pytest.raises(RecordError, match="bfloat16.*no such element type"):
        trace_dtype(tg.bfloat16)


@pytest.mark.parametrize("dtype", [d for d in _TG_DTYPES if d != "float32"])
def test_record_an_output_of_each_dtype(tmp_path: Path, dtype: str) -> None:
    script = tmp_path / f"{dtype}.py"
    script.write_text("from tinygrad import Tensor, dtypes\ndef main():\n"
                      f"    return (Tensor([1, 2, 3]) + 1).cast(dtypes.{dtype})\n")
    out = tmp_path / f"{dtype}.json"
    record(script, (), out)
    trace = load_trace(out)
    assert trace.output.dtype.name == dtype and trace.output.shape == (3,)
    assert trace.output.expected_array().tolist() == ([True] * 3 if dtype == "bool" else [2, 3, 4])
    if dtype in ("uint8", "float16", "int64"):
        code, text = _run(out)
        assert code == 0 and "result: match" in text, text


@pytest.mark.parametrize("expr, shape, values", [
    ("Tensor(3.0) * 2", (), [6.0]),  # a constant tinygrad folds, of a weak dtype: no buffer until copied
    ("(Tensor.arange(24).float() * 2).realize()[3:7]", (4,), [6.0, 8.0, 10.0, 12.0]),  # a view of a realized buffer
    ("(Tensor.arange(24).reshape(4, 6).float() * 2)[1:3, ::2]", (2, 3), [12.0, 16.0, 20.0, 24.0, 28.0, 32.0]),
])
def test_record_an_output_that_is_no_plain_buffer(tmp_path: Path, expr: str, shape: tuple[int, ...],
                                                  values: list[float]) -> None:
    """Constants and views are copied by a kernel into a buffer of their own: the trace's output."""
    script = tmp_path / "view.py"
    script.write_text(f"from tinygrad import Tensor\ndef main():\n    return {expr}\n")
    out = tmp_path / "view.json"
    record(script, (), out)
    trace = load_trace(out)
    assert trace.output.shape == shape and trace.output.dtype.name == "float32"
    assert trace.output.expected_array().ravel().tolist() == values
    code, text = _run(out)
    assert code == 0 and "result: match" in text, text


def test_record_a_freed_buffer_tinygrad_hands_back_is_a_new_trace_buffer(tmp_path: Path) -> None:
    """A TinyJit function called in a loop with fresh inputs: each input's buffer is freed and comes back from
    tinygrad's LRU cache as the next input (the same Metal buffer written again from the host): three buffers."""
    script = tmp_path / "jit.py"
    script.write_text("from tinygrad import Tensor, TinyJit\n@TinyJit\ndef f(x):\n    return (x * 2 + 1).realize()\n"
                      "def main():\n    for i in range(3):\n        out = f(Tensor([1.0, 2.0, float(i)]))\n"
                      "    return out\n")
    out = tmp_path / "jit.json"
    record(script, (), out)
    trace = load_trace(out)
    assert len(trace.dispatches) == 3 and trace.output.expected_array().tolist() == [3.0, 5.0, 5.0]
    data = json.loads(out.read_text())
    inputs = [d["args"][1]["buffer"] for d in data["dispatches"]]  # E_3(out, x): x, each call's own trace buffer
    assert len(set(inputs)) == 3
    got = [__import__("struct").unpack("3f", __import__("base64").b64decode(data["buffers"][i]["init"]["b64"]))
           for i in inputs]
    assert got == [(1.0, 2.0, 0.0), (1.0, 2.0, 1.0), (1.0, 2.0, 2.0)]
    code, text = _run(out)
    assert code == 0 and "result: match" in text, text


def test_an_output_path_without_its_folder_is_refused_before_recording(tmp_path: Path) -> None:
    script = tmp_path / "marks.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n"
                      "from tinygrad import Tensor\ndef main():\n    return Tensor([1.0]) * 2\n")
    log = io.StringIO()
    bad = tmp_path / "none" / "t.json"
    assert main(["record", str(script), "-o", str(bad)], out=io.StringIO(), log=log) == 2
    assert f"-o {bad}: no folder" in log.getvalue(), log.getvalue()
    log = io.StringIO()
    assert main(["record", str(script), "-o", str(tmp_path)], out=io.StringIO(), log=log) == 2
    assert "is a folder" in log.getvalue()
    with pytest.raises(RecordError, match="no folder"):
        record(script, (), bad)
    assert not (tmp_path / "ran").exists()  # the script never ran


def test_a_half_output_one_ulp_off_on_the_expected_device_records(tmp_path: Path) -> None:
    """exp2 of half values: METAL's result is correctly rounded, tinygrad's CPU device is one ulp of half off at
    two elements; record refused it ("max error 0.00195 ... seed the RNG") with float32's rtol 1e-4, below half's
    epsilon. Now half is compared within a few ulp of half, and the replay matches."""
    script = tmp_path / "f16.py"
    script.write_text("import numpy as np\nfrom tinygrad import Tensor\ndef main():\n"
                      "    a = Tensor(np.linspace(-2, 2, 33, dtype=np.float16))\n    return (a * a + 1).exp2()\n")
    out = tmp_path / "f16.json"
    record(script, (), out, expected="CPU")
    assert load_trace(out).output.dtype.name == "float16"
    code, text = _run(out)
    assert code == 0 and "result: match" in text, text


class _Out:
    """What ``_check_agree`` reads of the METAL output: ``numpy()``."""

    def __init__(self, values: Any) -> None:
        self.values = values

    def numpy(self) -> Any:
        return self.values


def test_a_refused_recording_says_the_tolerance_and_blames_the_rng_only_for_large_errors() -> None:
    import numpy as np

    from mtlir.tinygrad.record import _check_agree
    expected = np.float16([1.0, 2.0, 3.0])
    near = expected.copy()
    near[1] = np.float16(2.0 + 20 * 2.0 ** -9)  # 20 ulp: beyond the tolerance, a rounding difference
    with pytest.raises(RecordError) as info:
        _check_agree(Path("s.py"), _Out(near), expected.tobytes(), "CPU")
    text = str(info.value)
    assert "1 of 3 elements (max error 0.0390625, 20 ulp of float16; tolerance rtol 0.0039, atol 1e-05 (float16))" \
           in text
    assert "rounding difference" in text and "--expected python" in text and "seed the RNG" not in text
    far = expected.copy()
    far[2] = np.float16(-7.0)  # another input entirely
    with pytest.raises(RecordError, match="seed the RNG"):
        _check_agree(Path("s.py"), _Out(far), expected.tobytes(), "PYTHON")
    _check_agree(Path("s.py"), _Out(np.nextafter(expected, np.float16(9))), expected.tobytes(), "CPU")  # 1 ulp
