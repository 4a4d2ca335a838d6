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
    inputs = [b for b in trace.buffers.values() if b.init is not None and b.init != b"\xff" * b.size]
    assert sorted(b.size for b in inputs) == [2048, 5120, 32768]  # x 8x64, w2 128x10, w1 64x128
    # the kernels' own outputs start as 0xFF (first written, never read first): a NaN where one is not written
    assert sum(1 for b in trace.buffers.values() if b.init == b"\xff" * b.size) == len(trace.buffers) - 3
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
    ("import numpy as np\nfrom tinygrad import Tensor, Variable\ndef main():\n"
     "    a = Tensor(np.arange(32, dtype=np.float32)).realize()\n"
     "    return (a[:Variable('n', 1, 32).bind(7)] * 3).contiguous()\n",
     "main()'s output has a symbolic shape (axis 0 depends on n): a trace's output has a fixed shape"),
    ("import numpy as np\nfrom tinygrad import Tensor, Variable\ndef main():\n"
     "    a = Tensor(np.arange(32, dtype=np.float32)).realize()\n"
     "    s = [(a[:Variable('n', 1, 32).bind(k)] * 3).sum().realize() for k in (3, 5)]\n    return s[0] + s[1]\n",
     "variable 'n' took two values (3, then 5)"),
])
def test_a_script_that_cannot_be_recorded_is_exit_2(tmp_path: Path, body: str, problem: str) -> None:
    script = tmp_path / "bad.py"
    script.write_text(body)
    with pytest.raises(RecordError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        record_trace(script)
    log = io.StringIO()
    assert main(["record", str(script), "-o", str(tmp_path / "t.json")], out=io.StringIO(), log=log) == 2
    assert problem in log.getvalue(), log.getvalue()
    assert f"mtlir: error: {script}: " in log.getvalue(), log.getvalue()  # every error names the script first
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
    takes each (bfloat16 too: tinygrad gives it no struct format); the fp8 types have none, refused naming it."""
    from tinygrad import dtypes as tg
    from mtlir.frontend.checks import param_dtype
    for name in [*_TG_DTYPES, "bfloat16"]:
        assert trace_dtype(getattr(tg, name)) == f"dtypes.{name}"
        assert param_dtype(trace_dtype(getattr(tg, name))).name == name
    with pytest.raises(RecordError, match="output is dtypes.fp8e4m3: the trace format has no such element type"):
        trace_dtype(tg.fp8e4m3)


_BF16_SCRIPT = """from tinygrad import Tensor, dtypes
def main():
    a = Tensor([1.5, 2.25, 3.0, -7.125, 100.5, 0.0078125], dtype=dtypes.bfloat16)
    return (a * 2 + 1) / 3 + a.exp2() * 0.5
"""


def test_record_a_bfloat16_output_and_replay_it(tmp_path: Path) -> None:
    """A bfloat16 output: its expected values come from tinygrad's PYTHON device (its CPU device's clang here has no
    bfloat16 arithmetic); the trace keeps them as bfloat16 bytes and ``mtlir run`` replays it to a match."""
    import numpy as np
    from mtlir.ir.dtypes import dtypes
    script = tmp_path / "bf16.py"
    script.write_text(_BF16_SCRIPT)
    out = tmp_path / "bf16.json"
    trace_dict = record(script, (), out)
    assert "expected output from tinygrad's PYTHON device" in trace_dict["made_with"]
    trace = load_trace(out)
    assert trace.output.dtype.name == "bfloat16" and trace.output.shape == (6,)
    got = trace.output.expected_array().astype(np.float32)
    a = np.array([1.5, 2.25, 3.0, -7.125, 100.5, 0.0078125], dtype=np.float32)
    assert np.allclose(got, (a * 2 + 1) / 3 + np.exp2(a) * 0.5, rtol=2 ** -6)  # bfloat16: 8 significant bits
    assert trace.output.expected_array().dtype == dtypes.to_numpy(dtypes.bfloat16)
    done = subprocess.run([sys.executable, "-m", "mtlir", "run", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "result: match" in done.stdout


def test_a_bfloat16_chain_that_drifts_on_the_python_device_says_why(tmp_path: Path) -> None:
    """tinygrad's PYTHON device does not round every bfloat16 operation as Metal does: a chain of them drifts
    apart, and the refusal says that (not "a math function" nor the RNG), with the way out."""
    script = tmp_path / "chain.py"
    script.write_text("import numpy as np\nfrom tinygrad import Tensor, dtypes\ndef main():\n"
                      "    x = Tensor(np.linspace(0.5, 2, 16).astype(np.float32)).cast(dtypes.bfloat16)\n"
                      "    for _ in range(30):\n        x = x * 1.01 + 0.003\n    return x\n")
    with pytest.raises(RecordError, match=r"compute in bfloat16, which tinygrad's PYTHON device does not round after "
                                          r"every operation as Metal does.*\.cast\(dtypes\.float32\)"):
        record_trace(script)


def test_a_bfloat16_expected_output_the_cpu_device_fails_names_the_way_out(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """--expected cpu for a bfloat16 output whose CPU run fails (a clang without bfloat16 arithmetic): a RecordError
    saying so and suggesting --expected python, not the compiler's exception."""
    import importlib
    rec = importlib.import_module("mtlir.tinygrad.record")  # the module (the package exports its record function)
    script = tmp_path / "bf16.py"
    script.write_text(_BF16_SCRIPT)
    run_main = rec._run_main
    calls: list[str] = []

    def failing_on_cpu(path: Path, args: object) -> object:
        from tinygrad import Device
        calls.append(Device.DEFAULT)
        if Device.DEFAULT == "CPU":
            raise RuntimeError("clang: error: __bf16 is not supported on this target")
        return run_main(path, args)  # type: ignore[arg-type]

    monkeypatch.setattr(rec, "_run_main", failing_on_cpu)
    with pytest.raises(RecordError, match=r"bfloat16 main\(\) on tinygrad's CPU device failed \(clang: error: __bf16 "
                                          r"is not supported on this target\).*try --expected python"):
        record_trace(script, expected="cpu")
    assert calls == ["METAL", "CPU"]


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


_WARM_UP = ("import numpy as np\nfrom tinygrad import Tensor\n"
            "X = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))\ndef f():\n    return (X @ X.T).relu()\n")


def _output_init(data: dict[str, Any]) -> bytes:
    """The initial bytes of the trace's output buffer, where the output lies (b"" when it has none)."""
    b64 = __import__("base64").b64decode
    out = data["output"]
    init = data["buffers"][out["buffer"]]["init"]
    if init is None:
        return b""
    start = out["offset"] - init["offset"]
    return b64(init["b64"])[start:start + len(b64(out["expected_b64"]))]


def _without_stores(data: dict[str, Any]) -> dict[str, Any]:
    """The trace with every store into a kernel's first buffer (tinygrad's output, ``*(data0_N+i) = v;``) deleted."""
    broken = json.loads(json.dumps(data))
    for prog in broken["programs"].values():
        lines = prog["msl"].split("\n")
        kept = [line for line in lines if not line.strip().startswith("*(data0_")]
        assert len(kept) < len(lines), prog["msl"]  # the tampering took something out
        prog["msl"] = "\n".join(kept)
    return broken


def test_a_warm_up_call_leaves_no_answer_in_the_trace(tmp_path: Path) -> None:
    """``f().realize(); return f()``: the second call's output buffer is the first's, back from tinygrad's buffer
    cache with the answer in it. Its first kernel only writes it, so the trace starts it as 0xFF, not as the
    answer (the replay compared the answer with itself: a kernel that writes nothing matched); with the kernel's
    store deleted the replay is a mismatch."""
    script = tmp_path / "warm.py"
    script.write_text(_WARM_UP + "def main():\n    f().realize()\n    return f()\n")
    data = record_trace(script)
    init, expected = _output_init(data), __import__("base64").b64decode(data["output"]["expected_b64"])
    assert init == b"\xff" * len(expected) != expected
    good, broken = tmp_path / "good.json", tmp_path / "broken.json"
    good.write_text(json.dumps(data))
    broken.write_text(json.dumps(_without_stores(data)))
    assert _run(good)[0] == 0
    code, text = _run(broken)
    assert code == 1 and "MISMATCH in 9 of 9 elements" in text, text


def test_a_second_recording_in_one_process_leaves_no_answer_in_the_trace(tmp_path: Path) -> None:
    """The Python API twice: the second recording's buffers come back from the first's, holding its results."""
    script = tmp_path / "twice.py"
    script.write_text(_WARM_UP + "def main():\n    return f()\n")
    first, second = record_trace(script), record_trace(script)
    for data in (first, second):
        assert _output_init(data) == b"\xff" * 36
    out = tmp_path / "broken.json"
    out.write_text(json.dumps(_without_stores(second)))
    assert _run(out)[0] == 1


def test_host_bytes_a_kernel_only_partly_overwrites_are_kept(tmp_path: Path) -> None:
    """``x[::2].assign(0)``: the first kernel on x only writes it (every other element): the odd elements the host
    wrote stay in the trace; a buffer read first (``x += 1``, in place) keeps its bytes."""
    script = tmp_path / "partial.py"
    script.write_text("import numpy as np\nfrom tinygrad import Tensor\ndef main():\n"
                      "    x = Tensor(np.arange(8, dtype=np.float32)).realize()\n"
                      "    x[::2].assign(Tensor(np.zeros(4, np.float32))).realize()\n    x += 1\n"
                      "    return x.realize()\n")
    out = tmp_path / "partial.json"
    data = record(script, [], out)
    assert load_trace(out).output.expected_array().tolist() == [1.0, 2.0, 1.0, 4.0, 1.0, 6.0, 1.0, 8.0]
    assert _output_init(data) == __import__("numpy").arange(8, dtype="float32").tobytes()
    code, text = _run(out)
    assert code == 0 and "result: match" in text, text


def test_repeat_replays_an_in_place_trace_on_its_own_inputs(tmp_path: Path) -> None:
    """One SGD step updates the weights in place: ``mtlir run --repeat 3`` restores the trace's initial bytes
    before each repeat, so the third submit computes the same step from the same weights (it compared three steps'
    weights with one step's: a mismatch)."""
    script = tmp_path / "sgd.py"
    script.write_text("import numpy as np\nfrom tinygrad import Tensor\nrng = np.random.default_rng(0)\n"
                      "X = Tensor(rng.standard_normal((16, 4)).astype(np.float32))\n"
                      "Y = Tensor(rng.standard_normal((16, 1)).astype(np.float32))\n"
                      "W = Tensor(rng.standard_normal((4, 1)).astype(np.float32))\n"
                      "def main():\n    loss = ((X @ W - Y) ** 2).mean()\n    (g,) = loss.gradient(W)\n"
                      "    W.assign(W - 0.1 * g).realize()\n    return W\n")
    out = tmp_path / "sgd.json"
    record(script, [], out)
    log = io.StringIO()
    code = main(["run", str(out), "--repeat", "3", "--json"], out=(o := io.StringIO()), log=log)
    doc = json.loads(o.getvalue())
    assert code == 0 and doc["match"] and doc["submits"] == 3, log.getvalue()


def test_the_script_imports_the_modules_beside_it(tmp_path: Path) -> None:
    """As ``python SCRIPT``: the script's folder is first on sys.path while it runs (from the command line too,
    from another folder); afterwards sys.path is as before and the module is forgotten, so the expected device's
    run imports it afresh (its Tensors on that device)."""
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "helper_mod_rec.py").write_text("import numpy as np\nfrom tinygrad import Tensor\n"
                                              "W = Tensor(np.full(4, 3.0, np.float32))\n")
    script = folder / "uses_helper.py"
    script.write_text("from tinygrad import Tensor\nfrom helper_mod_rec import W\ndef main():\n    return W * 2\n")
    path = list(sys.path)
    data = record_trace(script)
    assert sys.path == path and "helper_mod_rec" not in sys.modules
    assert __import__("base64").b64decode(data["output"]["expected_b64"]) == \
        __import__("numpy").full(4, 6.0, "float32").tobytes()
    proc = subprocess.run([sys.executable, "-m", "mtlir.cli.main", "record", str(script), "-o",
                           str(tmp_path / "h.json")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("kw, error, message", [
    ({"args": "u8"}, TypeError, "args='u8': expected the script's arguments as a list of str (write ['u8'])"),
    ({"args": ["a", 3]}, TypeError, "expected the script's arguments as a list of str"),
    ({"expected": "gpu"}, ValueError, "expected='gpu': choose from 'CPU', 'PYTHON'"),
    ({"expected": 1}, TypeError, "expected=1: expected a tinygrad device name"),
    ({"family": "m1"}, ValueError, "unknown GPU family 'm1'"),
    ({"tensor_cores": "yes"}, TypeError, "tensor_cores='yes'"),
    ({"workload": 5}, TypeError, "workload=5"),
    ({"output": 5}, TypeError, "output=5"),
])
def test_record_checks_its_arguments_before_the_script_runs(tmp_path: Path, kw: dict[str, Any],
                                                            error: type[Exception], message: str) -> None:
    script = tmp_path / "marks.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n"
                      "from tinygrad import Tensor\ndef main():\n    return Tensor([1.0]) * 2\n")
    args = {"script": script, "args": (), "output": tmp_path / "t.json", **kw}
    with pytest.raises(error) as info:
        record(**args)
    assert message in str(info.value)
    if "output" not in kw:
        with pytest.raises(error):
            record_trace(**{k: v for k, v in args.items() if k != "output"})
    assert not (tmp_path / "ran").exists() and not (tmp_path / "t.json").exists()
    if kw == {"expected": "gpu"}:
        record(script, ["x"], None, expected="python")  # any case, as the command line


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
    """What ``_check_agree`` reads of the METAL output: ``dtype`` (not bfloat16 here) and ``numpy()``."""

    def __init__(self, values: Any) -> None:
        self.values = values
        self.dtype = f"dtypes.{values.dtype}"

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
