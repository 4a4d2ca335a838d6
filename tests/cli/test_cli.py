"""The command line: `mtlir lower` / `mtlir run`, every exit code, --json purity (one object on stdout), defaults
and flag checks, pictures; the installed console script once through a subprocess. Where a test needs a stand-in
(a lowering that fails, a device that faults, a Mac), it passes it to ``main`` as the command's collaborator."""
from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mtlir.cli.lower import lower_trace
from mtlir.cli.main import main
from mtlir.cli.report import exit_code
from mtlir.cli.run import compare_output, make_bridge
from mtlir.metal import MTL
from mtlir.runtime.sim.device import SimDevice

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "examples" / "traces"
MLP7 = str(TRACES / "mlp.apple7.json")
KV7 = str(TRACES / "symbolic_kv.apple7.json")


def mtlir(*argv: str, **collaborators: Any) -> tuple[int, str, str]:
    """Run ``mtlir argv`` in this process, the commands given ``collaborators`` (``main``'s keywords) where
    passed: (exit code, stdout, stderr)."""
    out, log = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, log=log, **collaborators)
    return code, out.getvalue(), log.getvalue()


def one_json(stdout: str) -> dict[str, Any]:
    """stdout holds exactly one JSON object and nothing else."""
    doc, end = json.JSONDecoder().raw_decode(stdout)
    assert stdout[end:].strip() == "", f"more than one JSON object on stdout: {stdout[end:end + 80]!r}"
    assert isinstance(doc, dict)
    return doc


# ---- lower


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_lower_json_messages_of_one_submit(target: str) -> None:
    code, out, log = mtlir("lower", KV7, "--json", "--target", target)
    assert code == 0, log
    doc = one_json(out)
    msgs = doc["messages"]
    assert doc["count"] == len(msgs) and doc["target"] == target and doc["arch"] == "Apple7"
    sels = [m["selector"] for m in msgs]
    # the per-submit patches (symbolic sizes on ICB commands) may come before commandBuffer (METAL.md §1 step 6)
    assert sels[sels.index("commandBuffer") - 1] == "concurrentDispatchThreadgroups:threadsPerThreadgroup:"
    assert sels[-1] == "commit"
    assert "newBufferWithLength:options:" not in sels  # no link-time messages
    assert not {"signaledValue", "waitUntilSignaledValue:timeoutMS:", "waitUntilCompleted"} & set(sels)  # no waits
    assert all(set(m) == {"receiver", "selector", "args"} for m in msgs)
    # the two symbolic dispatches are set with the recorded start_pos = 11, structs as lists
    sym = [m for m in msgs if m["selector"] == "concurrentDispatchThreadgroups:threadsPerThreadgroup:"]
    assert sorted(m["args"][0] for m in sym) == [[11, 1, 1], [11, 1, 1]]
    assert all(m["receiver"].startswith("icb[") for m in sym)
    run = [m for m in msgs if m["selector"] == "executeCommandsInBuffer:withRange:"]
    assert run == [{"receiver": "encoder", "selector": "executeCommandsInBuffer:withRange:", "args": ["icb", [0, 5]]}]


def test_lower_json_is_the_same_on_both_targets() -> None:
    docs = [one_json(mtlir("lower", MLP7, "--json", "--target", t)[1]) for t in ("arm64", "x86_64")]
    assert docs[0]["messages"] == docs[1]["messages"]


def test_lower_defaults_and_device_flags() -> None:
    def sels(*flags: str) -> list[str]:
        code, out, log = mtlir("lower", MLP7, "--json", *flags)
        assert code == 0, log
        return [m["selector"] for m in one_json(out)["messages"]]
    apple7 = sels()
    apple9 = sels("--arch", "apple9")
    assert "dispatchThreadgroups:threadsPerThreadgroup:" in apple7  # the warm-up before Apple9
    assert "dispatchThreadgroups:threadsPerThreadgroup:" not in apple9
    assert "useResources:count:usage:" not in apple7
    assert "useResources:count:usage:" in sels("--no-residency-set")
    direct = sels("--no-icb")
    assert "executeCommandsInBuffer:withRange:" not in direct and "setBuffer:offset:atIndex:" in direct
    code, out, _ = mtlir("lower", MLP7, "--json")
    from mtlir.runtime.metal.bridge import host_target
    assert one_json(out)["target"] == host_target()


def test_lower_prints_the_listing_and_stages() -> None:
    code, out, log = mtlir("lower", MLP7, "--print-after-all", "--target", "x86_64")
    assert code == 0
    assert "commandBuffer" in out and "executeCommandsInBuffer:withRange:" in out
    assert "IR after encode" in log and "IR after linearize" in log


def test_pipeline_target_must_agree_with_target() -> None:
    code, out, log = mtlir("lower", MLP7, "--target", "x86_64", "--pipeline",
                           "encode,symbolic,abi{target=arm64},linearize")
    assert code == 2 and out == ""
    assert log.count("\n") == 1 and "abi{target=arm64} but --target is x86_64" in log
    code, out, _ = mtlir("lower", MLP7, "--json", "--pipeline",
                         "encode,symbolic,abi{target=x86_64},linearize")
    assert code == 0 and one_json(out)["target"] == "x86_64"


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_viz_writes_one_svg_per_stage(tmp_path: Path) -> None:
    code, out, log = mtlir("lower", MLP7, "--json", "--viz", str(tmp_path / "pics"))
    assert code == 0, log
    one_json(out)
    names = sorted(p.name for p in (tmp_path / "pics").glob("*.svg"))
    assert names == ["00-input.svg", "01-encode.svg", "02-barriers.svg", "03-abi.svg", "04-linearize.svg"]
    assert all((tmp_path / "pics" / n).read_text().lstrip().startswith(("<?xml", "<svg")) for n in names)
    assert "unchanged" not in (tmp_path / "pics" / "01-encode.svg").read_text()
    # a pass that returns the very graph it was given: its picture's title and --print-after-all say so
    code, out, log = mtlir("lower", MLP7, "--viz", str(tmp_path / "more"), "--print-after-all", "--pipeline",
                           "encode,symbolic,abi{target=arm64},linearize")
    assert code == 0 and "symbolic (unchanged)" in (tmp_path / "more" / "02-symbolic.svg").read_text()
    assert "IR after symbolic (unchanged)" in log and log.count("unchanged") == 1
    # the same folder again with the default pipeline: the other pipeline's stage pictures are gone, the user's
    # own files stay
    (tmp_path / "more" / "notes.svg").write_text("<svg/>")
    code, out, log = mtlir("lower", MLP7, "--viz", str(tmp_path / "more"))
    assert code == 0, log
    assert sorted(p.name for p in (tmp_path / "more").glob("*.svg")) == [
        "00-input.svg", "01-encode.svg", "02-barriers.svg", "03-abi.svg", "04-linearize.svg", "notes.svg"]


# ---- bad input: exit code 2, one line, no traceback


def _bad_trace(tmp_path: Path, edit: Any) -> str:
    doc = json.loads(Path(MLP7).read_text())
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("argv, match", [
    (["lower", "nope.json"], "nope.json"),
    (["lower", MLP7, "--arch", "apple5"], "invalid choice: 'apple5'"),
    (["lower", MLP7, "--target", "riscv"], "invalid choice: 'riscv'"),
    (["lower", MLP7, "--pipeline", "encode,frobnicate"], "unknown pass 'frobnicate'"),
    (["run", MLP7, "--repeat", "0"], "at least one submit"),
    (["frob"], "invalid choice: 'frob'"),
    ([], "required"),
])
def test_bad_input_exits_2_with_one_line(argv: list[str], match: str) -> None:
    code, out, log = mtlir(*argv)
    assert code == 2 and out == ""
    assert log.count("\n") == 1 and match in log and "Traceback" not in log


def test_malformed_trace_names_the_field(tmp_path: Path) -> None:
    path = _bad_trace(tmp_path, lambda d: d["dispatches"][2].__setitem__("grid", [0, 1, 1]))
    code, out, log = mtlir("lower", path)
    assert code == 2 and "dispatches[2]" in log and log.count("\n") == 1


def test_json_errors_are_one_object_too() -> None:
    code, out, log = mtlir("lower", "nope.json", "--json")
    assert code == 2 and one_json(out)["exit_code"] == 2 and log.count("\n") == 1
    code, out, log = mtlir("lower", MLP7, "--json", "--arch", "apple1")
    assert code == 2 and one_json(out)["error_type"] == "UsageError"


def test_debug_shows_the_traceback() -> None:
    code, _, log = mtlir("lower", "nope.json", "--debug")
    assert code == 2 and "Traceback" in log


def test_metal_device_off_a_mac_is_bad_input() -> None:
    from mtlir.runtime.metal.bridge import metal_available
    if metal_available():
        pytest.skip("this machine has Metal")
    code, out, log = mtlir("run", MLP7, "--device", "metal")
    assert code == 2 and "use --device sim" in log


# ---- run: 0 match, 1 mismatch, 3 GPU error, 4 unsupported kernel


def test_run_json_matches() -> None:
    code, out, log = mtlir("run", KV7, "--device", "sim", "--json", "--repeat", "3", "--target", "x86_64")
    assert code == 0, log
    doc = one_json(out)
    assert doc["match"] is True and doc["max_abs_err"] < 1e-5
    assert doc["kernels"] == 5 and doc["submits"] == 3
    lowered = one_json(mtlir("lower", KV7, "--json", "--target", "x86_64")[1])
    assert doc["messages_per_submit"] == lowered["count"]
    assert "[queue commandBuffer]" in log and "result: match" in log  # the listing and summary go to stderr


def test_run_prints_listing_and_summary() -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--executor", "interpreter")
    assert code == 0, log
    assert "[queue commandBuffer]" in out and "[cmdbuf commit]" in out
    assert "kernels: 5" in out and "result: match" in out and "host time per submit" in out


def test_run_mismatch_exits_1(tmp_path: Path) -> None:
    import base64

    import numpy as np

    def tamper(d: dict[str, Any]) -> None:
        exp = np.frombuffer(base64.b64decode(d["output"]["expected_b64"]), np.float32).copy()
        exp[0] += 1.0
        d["output"]["expected_b64"] = base64.b64encode(exp.tobytes()).decode()
    code, out, log = mtlir("run", _bad_trace(tmp_path, tamper), "--device", "sim", "--json")
    assert code == 1
    doc = one_json(out)
    assert doc["match"] is False and 0.5 < doc["max_abs_err"] < 1.5


def test_run_gpu_error_exits_3() -> None:
    def faulty(*a: Any) -> Any:
        bridge, name = make_bridge(*a)
        bridge.inject_fault(MTL.ErrorPageFault)
        return bridge, name
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--json", make_bridge=faulty)
    assert code == 3 and log.count("\n") == 1 and "MTLCommandBufferError 3 (PageFault)" in log
    assert one_json(out) == {"error": log.strip().removeprefix("mtlir: error: "), "error_type": "GPUExecutionError",
                             "exit_code": 3, "code": 3, "name": "PageFault", "submit": 0, "command_buffer": 0,
                             "command_buffers": {"0": "Error (PageFault)"}}


class _GpuClock(SimDevice):
    """A simulated device whose command buffers report the GPU times ``times`` (selector -> seconds)."""

    times: dict[str, float] = {}

    def msg_send(self, proto: Any, args: tuple[Any, ...]) -> Any:
        out = super().msg_send(proto, args)
        return next((t for sel, t in self.times.items() if args[1] == self.sel_registerName(sel)), out)


def _clock(start: float, end: float) -> Any:
    """A ``make_bridge`` stand-in: a ``_GpuClock`` reporting (``start``, ``end``) for every command buffer."""
    def make(kind: str, target: str, faithful: bool, program: Any, metal: Any) -> tuple[Any, str]:
        dev = _GpuClock(target, family=program.device.family, residency_sets=program.device.residency_set,
                        icb=program.device.icb)
        dev.times = {"GPUStartTime": start, "GPUEndTime": end}
        return dev, "sim"
    return make


@pytest.mark.parametrize("start, end", [(12345.0001, 0.0), (0.0, 12345.0001), (12345.0001, 1.0)])
def test_run_json_reports_a_gpu_time_that_is_not_available_as_null(start: float, end: float) -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--json", make_bridge=_clock(start, end))
    assert code == 0, log
    doc = one_json(out)
    assert doc["match"] is True and doc["gpu_s_per_submit"] is None


def test_run_json_gpu_time_is_computed_in_integer_nanoseconds() -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--json", "--repeat", "2",
                           make_bridge=_clock(12345.000100, 12345.000350))
    assert code == 0, log
    assert one_json(out)["gpu_s_per_submit"] == 0.00025  # 250,000 ns exactly: one span of one command buffer
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--json")
    assert 0 < one_json(out)["gpu_s_per_submit"] < 60  # the simulated device's own clock


def test_run_unsupported_kernel_exits_4(tmp_path: Path) -> None:
    def atomics(d: dict[str, Any]) -> None:
        prog = next(iter(d["programs"].values()))
        prog["msl"] = prog["msl"].replace("float buf0[1];", "atomic_int counter; float buf0[1];", 1)
    code, out, log = mtlir("run", _bad_trace(tmp_path, atomics), "--device", "sim", "--json")
    assert code == 4 and one_json(out)["error_type"] == "UnsupportedKernelError"
    assert log == ("mtlir: error: program 'r_8_128_16_4', kernel function 'r_8_128_16_4': MSL line 4, column 3: "
                   "cannot translate `atomic_int` to OpenCL C: atomics are not supported by the simulated device "
                   "yet\n")


@pytest.mark.parametrize("name", ["mlp", "mlp_deep", "layernorm_attn"])
def test_run_apple9_simdgroup_matrix_traces(name: str) -> None:
    code, out, log = mtlir("run", str(TRACES / f"{name}.apple9.json"), "--device", "sim", "--json")
    assert code == 0 and one_json(out)["match"] is True, log


def test_console_script() -> None:
    exe = Path(sys.executable).with_name("mtlir")
    if not exe.exists():
        pytest.skip("the mtlir console script is not installed next to this Python")
    proc = subprocess.run([str(exe), "lower", MLP7, "--json", "--target", "arm64"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert one_json(proc.stdout)["messages"][0] == {"receiver": "queue", "selector": "commandBuffer", "args": []}
    proc = subprocess.run([str(exe), "lower", "missing.json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1


# ---- exit codes by error family (bad input = the front end's errors), each reproduced


@pytest.mark.parametrize("pipeline, match", [
    # each a PipelineError at parse time since the passes declare the stage they take (efe7432)
    ("encode,symbolic,linearize", "pass 'linearize' (pass 3 of the pipeline) takes C calls"),
    ("linearize", "but it would get a queue graph (SUBMIT): run encode, abi{target=...} before it"),
    ("abi{target=x86_64},linearize", "pass 'abi' (pass 1 of the pipeline) takes typed messages"),
    ("encode,frobnicate", "unknown pass 'frobnicate'"),
])
def test_pipeline_errors_are_bad_input(pipeline: str, match: str) -> None:
    code, out, log = mtlir("lower", MLP7, "--pipeline", pipeline, "--target", "x86_64", "--json")
    assert code == 2 and log.count("\n") == 1 and match in log and "internal error" not in log
    assert one_json(out)["exit_code"] == 2


def _error(name: str) -> BaseException:
    from mtlir.errors import BridgeError, KernelCompileError, LinkError
    from mtlir.frontend.nodes import QueueError
    from mtlir.frontend.trace import TraceError
    from mtlir.metal import AbiError
    from mtlir.passes.encode.commands import EncodeError
    from mtlir.passes.linearize import LinearizeError
    from mtlir.passes.pipeline import PipelineError
    from mtlir.passes.verify import VerifyError
    from mtlir.viz import GraphvizNotFoundError
    made: dict[str, BaseException] = {
        "EncodeError": EncodeError("command 0 (k): view offset 2 of buffer:1 is not a multiple of 4 bytes"),
        "LinearizeError": LinearizeError("linearize cannot emit MSG"), "VerifyError": VerifyError("abi", None, "bad"),
        "PipelineError": PipelineError("unknown pass"), "QueueError": QueueError("view: not a buffer"),
        "AbiError": AbiError("no selector 'frob:'"), "TraceError": TraceError("dispatches[0]", "bad"),
        "GraphvizNotFoundError": GraphvizNotFoundError("dot is not installed"), "LinkError": LinkError("nil"),
        "BridgeError": BridgeError("cut to 32 bits"), "KernelCompileError": KernelCompileError("syntax"),
        "FileNotFoundError": FileNotFoundError("nope.json")}
    return made[name]


@pytest.mark.parametrize("name", ["EncodeError", "LinearizeError", "VerifyError", "PipelineError", "QueueError",
                                  "AbiError", "TraceError", "GraphvizNotFoundError", "LinkError", "BridgeError",
                                  "KernelCompileError", "FileNotFoundError"])
@pytest.mark.parametrize("command", ["lower", "run"])
def test_every_error_of_the_front_end_is_bad_input(name: str, command: str) -> None:
    def fail(*a: Any, **k: Any) -> Any:
        raise _error(name)
    code, out, log = mtlir(command, MLP7, "--device" if command == "run" else "--target", "sim" if command == "run"
                           else "x86_64", lower_trace=fail)
    assert code == 2 and log.count("\n") == 1 and log.startswith("mtlir: error: ") and "Traceback" not in log
    assert exit_code(_error(name)) == 2


def test_internal_errors_stay_internal() -> None:
    from mtlir.runtime.executors.executor import ProgramError
    assert exit_code(ValueError("a bug")) is None and exit_code(KeyError("x")) is None
    assert exit_code(ProgramError("a malformed Program is a bug of the lowering")) is None


def test_viz_without_graphviz_is_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot on it
    code, out, log = mtlir("lower", MLP7, "--viz", str(tmp_path / "pics"), "--target", "x86_64")
    assert code == 2 and log.count("\n") == 1 and "Graphviz's 'dot' program is not installed" in log


def test_a_failing_dot_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``dot`` that exits non-zero (a broken Graphviz) is a GraphvizError naming it, not an internal error."""
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'dot: broken install' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
    code, out, log = mtlir("lower", MLP7, "--viz", str(tmp_path / "pics"), "--target", "x86_64")
    assert code == 2 and log.count("\n") == 1, log
    assert "Graphviz's dot failed (exit 3)" in log and "dot: broken install" in log


def _dot_too_slow_for(stage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dot`` runs as usual but passes its timeout on the picture titled ``stage``."""
    real = subprocess.run

    def run(cmd: list[str], **kw: Any) -> Any:
        if f"label=<{stage}".encode() in kw.get("input", b""):
            raise subprocess.TimeoutExpired(cmd, 60.0)
        return real(cmd, **kw)
    monkeypatch.setattr("mtlir.viz.subprocess.run", run)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_a_stage_dot_cannot_draw_in_time_is_named_the_others_are_written(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Session 6, finding 4: one stage past dot's timeout stopped --viz at once (no picture at all, exit 2, the
    stage unnamed by --html). Each stage is drawn on its own; the one error names the stage; exit 4 (something
    valid mtlir cannot do), not 2 (bad input)."""
    _dot_too_slow_for("barriers", monkeypatch)
    pics = tmp_path / "pics"
    code, out, log = mtlir("lower", MLP7, "--viz", str(pics), "--target", "arm64")
    assert code == 4 and log.splitlines()[-1].startswith("mtlir: error: --viz "), log
    assert "no picture of 1 of 5 stages (02-barriers: write_picture: dot took longer than 60.0 s" in log
    assert sorted(p.name for p in pics.iterdir()) == ["00-input.svg", "01-encode.svg", "03-abi.svg",
                                                      "04-linearize.svg"]
    page = tmp_path / "p.html"
    code, out, log = mtlir("lower", MLP7, "--html", str(page), "--target", "arm64")
    assert code == 4 and "no picture of 1 of 5 stages (02-barriers: to_svg: dot took longer" in log, log
    text = page.read_text()
    assert "no picture of stage 02-barriers" in text and text.count("<svg") == 4


def test_a_trace_nested_too_deep_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    code, out, log = mtlir("lower", str(path))
    assert code == 2 and log.count("\n") == 1 and "nested deeper than Python's recursion limit" in log, log


def test_device_metal_says_why_the_libraries_did_not_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """MTLIR_METAL_LIBS naming libraries that do not exist: the error names the library and the path (it said
    only 'MetalBridge needs macOS with Metal')."""
    monkeypatch.setenv("MTLIR_METAL_LIBS", "/nonexistent/libobjc.so:/nonexistent/metal.so")
    code, out, log = mtlir("run", MLP7, "--device", "metal")
    assert code == 2 and "/nonexistent/libobjc.so" in log, log


def test_invalid_msl_exits_2_pointing_at_the_msl(tmp_path: Path) -> None:
    """An undeclared identifier in the user's MSL: exit 2 (the user's bug; it was exit 4, 'a kernel the simulator
    cannot run yet') with the MSL line and column (not 'line 90, column 118 of the translation'), the MSL line
    quoted under the one-line error with a caret, as clang does (issue 9)."""
    def break_kernel(d: dict[str, Any]) -> None:
        prog = next(iter(d["programs"].values()))
        prog["msl"] = prog["msl"].replace("{", "{ float undefined_here = not_declared_anywhere;", 1)
    code, out, log = mtlir("run", _bad_trace(tmp_path, break_kernel), "--device", "sim", "--json")
    lines = log.splitlines()
    assert code == 2 and len(lines) == 3, log
    assert lines[0].startswith("mtlir: error: library of pipeline:r_8_128_16_4: newLibraryWithSource:options:error: "
                               "returned nil: Compilation failed: invalid MSL in kernel(s) r_8_128_16_4: ")
    msl_line = next(i for i, text in enumerate(_bad_trace_msl(tmp_path).splitlines(), 1) if "not_declared" in text)
    col = _bad_trace_msl(tmp_path).splitlines()[msl_line - 1].index("not_declared_anywhere") + 1
    assert f"MSL line {msl_line}, column {col}: use of undeclared identifier 'not_declared_anywhere'" in lines[0]
    assert "of the translation" not in log
    assert lines[1].startswith(f"{msl_line:5d} | ") and "not_declared_anywhere" in lines[1]
    assert lines[2] == "      | " + " " * (col - 1) + "^"
    assert one_json(out)["error_type"] == "LinkError" and one_json(out)["exit_code"] == 2


def _bad_trace_msl(tmp_path: Path) -> str:
    """The MSL of the first kernel of the trace ``_bad_trace`` wrote last."""
    doc = json.loads((tmp_path / "bad.json").read_text())
    return str(next(iter(doc["programs"].values()))["msl"])


@pytest.mark.parametrize("command", ["run", "translate"])
def test_double_in_the_msl_exits_2_as_metal_refuses_it(tmp_path: Path, command: str) -> None:
    """A kernel declaring a ``double`` local ran and matched on the simulated device (OpenCL has double); Metal's
    compiler refuses it (MSL spec §2.1): exit 2, its MSL line and column, the line quoted with a caret."""
    def use_double(d: dict[str, Any]) -> None:
        prog = next(iter(d["programs"].values()))
        prog["msl"] = prog["msl"].replace("float val0 =", "double val0 =", 1)
    code, _, log = mtlir(command, _bad_trace(tmp_path, use_double))
    lines = log.splitlines()
    msl = _bad_trace_msl(tmp_path).splitlines()
    line = next(i for i, text in enumerate(msl, 1) if "double val0" in text)
    col = msl[line - 1].index("double") + 1
    assert code == 2 and len(lines) == 3, log
    assert f"MSL line {line}, column {col}: 'double' is not supported in Metal" in lines[0]
    assert lines[1].startswith(f"{line:5d} | ") and lines[2] == "      | " + " " * (col - 1) + "^"


# ---- run: device flags, the probe of --device metal, diagnostics, NaN, stdout purity


def test_run_takes_the_device_flags_of_lower() -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--json", "--no-residency-set", "--no-icb")
    assert code == 0, log
    doc = one_json(out)
    assert doc["match"] is True and doc["residency_set"] is False and doc["icb"] is False
    lowered = one_json(mtlir("lower", MLP7, "--json", "--no-residency-set", "--no-icb")[1])
    assert doc["messages_per_submit"] == lowered["count"]
    assert "setBuffer:offset:atIndex:" in log and "executeCommandsInBuffer" not in log  # the direct path
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--json", "--no-residency-set")
    assert code == 0 and one_json(out)["residency_set"] is False and one_json(out)["icb"] is True
    assert "[encoder useResources:count:usage:" in log and "executeCommandsInBuffer" in log


def _fake_metal(**caps: bool) -> tuple[list[Any], dict[str, Any]]:
    """--device metal on the simulated device standing in for MetalBridge (as a Mac without some capability): the
    bridges made, and the collaborators that make them."""
    from mtlir.runtime.metal.bridge import host_target
    from mtlir.runtime.sim.device import SimDevice
    made: list[Any] = []

    def bridge() -> Any:
        made.append(SimDevice(host_target(), family="Apple7", **caps))
        return made[-1]
    return made, {"metal_available": lambda: True, "metal_bridge": bridge}


@pytest.mark.parametrize("caps", [dict(residency_sets=False, icb=False), dict(residency_sets=False),
                                  dict(icb=False), {}], ids=["neither", "no-rs", "no-icb", "both"])
def test_run_on_metal_lowers_for_what_the_device_offers(caps: dict[str, bool]) -> None:
    made, metal = _fake_metal(**caps)
    code, out, log = mtlir("run", MLP7, "--device", "metal", "--json", **metal)
    assert code == 0, log
    doc = one_json(out)
    assert doc["device"] == "metal" and doc["match"] is True and len(made) == 1
    assert doc["residency_set"] is caps.get("residency_sets", True) and doc["icb"] is caps.get("icb", True)
    assert ("newResidencySetWithDescriptor:error: returned nil" in log) is not caps.get("residency_sets", True)
    assert ("newIndirectCommandBufferWithDescriptor" in log) is not caps.get("icb", True)


def test_run_on_metal_flags_still_turn_capabilities_off() -> None:
    _, metal = _fake_metal()
    code, out, log = mtlir("run", MLP7, "--device", "metal", "--json", "--no-icb", **metal)
    assert code == 0, log
    doc = one_json(out)
    assert doc["residency_set"] is True and doc["icb"] is False


@pytest.mark.parametrize("caps, flag", [(dict(residency_sets=False), "--no-residency-set"),
                                        (dict(icb=False), "--no-icb")])
def test_link_error_hint_names_a_flag_of_run(caps: dict[str, bool], flag: str) -> None:
    from mtlir.runtime.sim.device import SimDevice

    def lacking(kind: str, target: str, faithful: bool, program: Any, metal: Any = None) -> Any:
        return SimDevice(target, family=program.device.family, **caps), "sim"
    code, out, log = mtlir("run", MLP7, "--device", "sim", make_bridge=lacking)
    assert code == 2 and flag in log and log.count("\n") == 1, log
    code, out, log = mtlir("run", MLP7, "--device", "sim", flag, make_bridge=lacking)  # the hint's flag helps
    assert code == 0, log


def test_run_prints_the_lowering_diagnostics() -> None:
    def noting(*a: Any, **k: Any) -> Any:
        lowered = lower_trace(*a, **k)
        lowered.diagnostics.append("encode: command 0: offset above 0xFFFFFFFF: the submit is lowered on the "
                                   "direct path")
        return lowered
    for argv in (["run", MLP7, "--device", "sim", "--json"], ["lower", MLP7, "--json"], ["lower", MLP7]):
        code, out, log = mtlir(*argv, lower_trace=noting)
        assert code == 0, log
        assert "mtlir: note: encode: command 0: offset above 0xFFFFFFFF" in log, argv


def test_compare_output_never_hides_a_nan() -> None:
    import numpy as np
    nan, inf = float("nan"), float("inf")
    c = compare_output(np.float32([1, 2, 3]), np.float32([nan, 2, 3]))
    assert not c.match and c.max_abs_err == inf and c.json_error() is None and c.mismatches == c.nan_mismatches == 1
    c = compare_output(np.float32([nan, 2, inf]), np.float32([nan, 2, inf]))
    assert c.match and c.max_abs_err == 0.0 and c.json_error() == 0.0 and c.mismatches == 0
    c = compare_output(np.float32([inf, 2]), np.float32([-inf, 2.5]))
    assert not c.match and c.max_abs_err == inf and c.mismatches == 2 and c.nan_mismatches == 0
    c = compare_output(np.float32([1, 2]), np.float32([1, 2.5]))
    assert not c.match and c.max_abs_err == 0.5 and c.json_error() == 0.5


@pytest.mark.parametrize("dtype,scale", [("dtypes.int", 1), ("dtypes.uint8", 4), ("dtypes.half", 2),
                                         ("dtypes.bfloat16", 2)])
def test_run_compares_the_output_in_its_own_dtype(tmp_path: Path, dtype: str, scale: int) -> None:
    """symbolic_kv's output is bit-exact on the simulated device, so the same bytes read as another dtype still
    match: the output is read and compared in the trace's dtype, not always as float32 (half and uint8 ended in
    exit 5, int32 in a false mismatch; bfloat16 had no dtype); one changed byte is a mismatch of integers."""
    doc = json.loads((TRACES / "symbolic_kv.apple7.json").read_text())
    doc["output"]["dtype"] = dtype
    doc["output"]["shape"] = [*doc["output"]["shape"][:-1], doc["output"]["shape"][-1] * scale]
    path = tmp_path / "retyped.json"
    path.write_text(json.dumps(doc))
    code, out, log = mtlir("run", str(path), "--device", "sim", "--json")
    assert code == 0, log
    assert one_json(out)["match"] is True
    if dtype == "dtypes.bfloat16":  # one unit in the last place of bfloat16 (2**-7 relative): within its tolerance
        expected = bytearray(base64.b64decode(doc["output"]["expected_b64"]))
        first = next(i for i in range(0, len(expected), 2) if expected[i + 1] & 0x7F not in (0, 0x7F))  # a normal
        expected[first] ^= 1
        doc["output"]["expected_b64"] = base64.b64encode(bytes(expected)).decode()
        path.write_text(json.dumps(doc))
        code, out, log = mtlir("run", str(path), "--device", "sim", "--json")
        assert code == 0 and one_json(out)["match"] is True and one_json(out)["max_abs_err"] > 0, log
    if dtype not in ("dtypes.half", "dtypes.bfloat16"):
        expected = bytearray(base64.b64decode(doc["output"]["expected_b64"]))
        expected[0] ^= 1
        doc["output"]["expected_b64"] = base64.b64encode(bytes(expected)).decode()
        path.write_text(json.dumps(doc))
        code, out, log = mtlir("run", str(path), "--device", "sim", "--json")
        assert code == 1 and one_json(out)["mismatches"] == 1 and one_json(out)["max_abs_err"] == 1


def test_compare_output_tolerance_depends_on_the_dtype() -> None:
    """A half output one ulp from the expected one (a correctly rounded exp2 against tinygrad's CPU device) was a
    mismatch: float32's rtol 1e-4 is below half's epsilon (~9.8e-4). Now half allows a few ulp of half, float32
    keeps rtol 1e-4, integers stay exact; the Comparison says the tolerance and the error in ulp of the dtype."""
    import numpy as np

    from mtlir.cli.compare import ULP_SLACK, tolerance
    exact = np.float16([3.0, 0.5, -1.25])
    one_ulp = np.nextafter(exact, np.float16(np.inf))
    c = compare_output(one_ulp, exact)
    assert c.match and c.dtype == "float16" and c.max_ulp_err == 1.0 and c.max_abs_err == 2.0 ** -9
    assert c.describe_tolerance() == "rtol 0.0039, atol 1e-05 (float16)"
    far = exact.copy()
    far[0] = np.float16(3.0 + 2 * ULP_SLACK * 2.0 ** -9)
    c = compare_output(far, exact)
    assert not c.match and c.mismatches == 1 and c.max_ulp_err == 2 * ULP_SLACK
    c = compare_output(one_ulp.astype(np.float32), exact.astype(np.float32))  # the same values as float32
    assert not c.match and c.rtol == 1e-4 and c.describe_tolerance() == "rtol 0.0001, atol 1e-05 (float32)"
    assert tolerance("bfloat16") == (ULP_SLACK * 2.0 ** -7, 1e-5) and tolerance(np.dtype(np.int16)) is None
    assert compare_output(np.int8([1]), np.int8([2])).describe_tolerance() == "exact"


def test_compare_output_is_exact_for_integers() -> None:
    import numpy as np
    c = compare_output(np.int32([1, 2, 2**31 - 1]), np.int32([1, 2, 2**31 - 1]))
    assert c.match and c.max_abs_err == 0 and c.mismatches == 0
    c = compare_output(np.int32([1, 2, 3]), np.int32([1, 2, 4]))
    assert not c.match and c.max_abs_err == 1 and c.mismatches == 1
    c = compare_output(np.uint64([2**64 - 1]), np.uint64([2**64 - 2]))
    assert not c.match and c.max_abs_err == 1


def test_a_bool_output_byte_other_than_0_or_1_is_a_mismatch() -> None:
    """A byte 0xFF in a bool output (what `mtlir record` poisons an output with that its kernel never wrote) reads as
    True in numpy: compared as the bytes MSL gives a bool (0 or 1), it is a mismatch."""
    import numpy as np
    expected = np.array([True, False, True])
    got = np.frombuffer(bytes([1, 0, 0xFF]), dtype=np.bool_)
    c = compare_output(got, expected)
    assert not c.match and c.mismatches == 1
    assert compare_output(np.frombuffer(bytes([1, 0, 1]), dtype=np.bool_), expected).match


def test_run_json_reports_a_nan_mismatch_honestly(tmp_path: Path) -> None:
    import base64

    import numpy as np

    def nan_expected(d: dict[str, Any]) -> None:
        exp = np.frombuffer(base64.b64decode(d["output"]["expected_b64"]), np.float32).copy()
        exp[3] = np.nan
        d["output"]["expected_b64"] = base64.b64encode(exp.tobytes()).decode()
    code, out, log = mtlir("run", _bad_trace(tmp_path, nan_expected), "--device", "sim", "--json")
    assert code == 1
    doc = one_json(out)
    assert doc["match"] is False and doc["max_abs_err"] is None and doc["nan_mismatches"] == 1
    assert doc["mismatches"] == 1 and "NaN" not in out and "Infinity" not in out
    assert "MISMATCH in 1 of 80 elements (max abs err inf, 1 NaN positions differ; tolerance rtol 0.0001, atol " \
           "1e-05 (float32))" in log


_NOISY = """
import os, sys
from mtlir.cli.lower import lower_trace
from mtlir.cli.main import main
def noisy(*a, **k):
    os.write(1, b"native noise on fd 1\\n")  # what a C library such as PoCL could print
    print("python noise on stdout")
    return lower_trace(*a, **k)
sys.exit(main(lower_trace=noisy))
"""


@pytest.mark.parametrize("noisy", [False, True], ids=["plain", "noise-on-fd-1"])
def test_run_json_writes_exactly_one_object_to_fd_1(noisy: bool) -> None:
    head = [sys.executable, "-c", _NOISY] if noisy else [sys.executable, "-m", "mtlir.cli.main"]
    proc = subprocess.run([*head, "run", MLP7, "--device", "sim", "--json"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert one_json(proc.stdout)["match"] is True
    assert proc.stdout.count("\n") == 1 and proc.stdout.endswith("}\n")
    if noisy:
        assert "native noise on fd 1" in proc.stderr and "python noise on stdout" in proc.stderr


@pytest.mark.parametrize("faithful", [False, True], ids=["strict", "faithful"])
def test_a_kernel_writing_far_past_its_buffer_is_a_gpu_error_not_a_crash(tmp_path: Path, faithful: bool) -> None:
    """The newcomer's kernel (a loop writing 10**8 floats into its first buffer) used to kill the process with
    SIGSEGV and print nothing, even with --json; in a child process so that a regression cannot take pytest down."""
    import re

    def overrun(d: dict[str, Any]) -> None:
        prog = next(iter(d["programs"].values()))
        first = re.search(r"device float\* (\w+)", prog["msl"]).group(1)  # type: ignore[union-attr]
        prog["msl"] = prog["msl"].replace(") {", f") {{ for (int i = 0; i < 100000000; i++) *({first}+i) = 1.0f;", 1)
    proc = subprocess.run([sys.executable, "-m", "mtlir.cli.main", "run", _bad_trace(tmp_path, overrun), "--device", "sim",
                           "--json", *(["--faithful"] if faithful else [])], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 3, proc.stderr[-2000:]
    doc = one_json(proc.stdout)
    assert doc["error_type"] == ("GPUExecutionError" if faithful else "MetalValidationError")
    assert "wrote 4 bytes out of bounds through parameter" in doc["error"]
    assert "(buffer index 0) at element" in doc["error"]
    assert proc.stderr.count("\n") == 1 and ("MTLCommandBufferError 3 (PageFault)" in proc.stderr) == faithful


# ---- numbers, spellings, usage lines, the path in the header, traces that are odd but valid, output errors


@pytest.mark.parametrize("flags, match", [
    (["--timeout", "0"], "argument --timeout: '0': the timeout must be a finite number of seconds above 0"),
    (["--timeout", "-1"], "argument --timeout: '-1': the timeout must be"),
    (["--timeout", "nan"], "argument --timeout: 'nan': the timeout must be"),
    (["--timeout", "inf"], "argument --timeout: 'inf': the timeout must be"),
    (["--timeout", "soon"], "argument --timeout: 'soon' is not a number of seconds"),
    (["--repeat", "0"], "argument --repeat: 0: at least one submit"),
    (["--repeat", "x"], "argument --repeat: 'x' is not an integer"),
])
def test_run_numbers_are_checked_by_argparse(flags: list[str], match: str) -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", *flags)
    assert code == 2 and out == "" and log.count("\n") == 1
    assert match in log and "(usage: mtlir run [-h]" in log  # the usage line of the subcommand


def test_arch_is_accepted_in_any_case() -> None:
    for spelling in ("Apple9", "APPLE9", "apple9"):
        code, out, log = mtlir("lower", MLP7, "--arch", spelling, "--target", "x86_64")
        assert code == 0, log
        assert out.startswith("; Apple9, residency set, ICB, x86_64:")
    code, out, log = mtlir("lower", MLP7, "--arch", "Apple5")
    assert code == 2 and "argument --arch: invalid choice: 'Apple5'" in log and "(usage: mtlir lower [-h]" in log


def test_executor_is_documented_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("run", "lower"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--executor {compiled,interpreter}" in text and "interpreter (a loop over its instructions)" in text


def _far_view(d: dict[str, Any]) -> None:
    """A view at a byte offset above 0xFFFFFFFF: an ICB command cannot hold it, the submit goes on the direct path."""
    arg = d["dispatches"][0]["args"][0]
    d["buffers"][str(arg["buffer"])]["size"] = 2**33
    arg["offset"] = 2**32 + 256


def test_the_listing_header_says_when_the_lowering_fell_back_to_the_direct_path(tmp_path: Path) -> None:
    code, out, log = mtlir("lower", _bad_trace(tmp_path, _far_view), "--target", "x86_64")
    assert code == 0, log
    assert out.startswith("; Apple7, residency set, direct path (the device has ICBs), x86_64:")
    assert "the submit is lowered on the direct path" in log
    code, out, log = mtlir("lower", MLP7, "--target", "x86_64", "--no-icb")
    assert out.startswith("; Apple7, residency set, direct path, no ICB, x86_64:")
    code, out, log = mtlir("lower", MLP7, "--target", "x86_64", "--no-icb", "--json")
    assert code == 0 and one_json(out)["path"] == "direct path, no ICB" and not one_json(out)["icb"]


def test_a_trace_variable_no_dispatch_uses_is_a_note_not_an_internal_error(tmp_path: Path) -> None:
    path = _bad_trace(tmp_path, lambda d: d.__setitem__("variables", {"start_pos": {"value": 3, "min": 1, "max": 8}}))
    code, out, log = mtlir("run", path, "--device", "sim", "--json")
    assert code == 0, log
    assert one_json(out)["match"] is True
    assert "mtlir: note: the trace's variable 'start_pos' is used by no dispatch: it is not bound" in log
    code, out, log = mtlir("lower", path, "--json")
    assert code == 0 and one_json(out)["count"] > 0
    path = _bad_trace(tmp_path, lambda d: d["buffers"].__setitem__("77", {"size": 64, "init": None}))
    code, out, log = mtlir("run", path, "--device", "sim", "--json")
    assert code == 0 and one_json(out)["match"] is True
    assert "mtlir: note: the trace's buffer 77 is bound by no dispatch: it is not created" in log


def test_a_binary_trace_file_is_bad_input_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(b"\xff\xfe{\x00" + bytes(range(256)))
    code, out, log = mtlir("run", str(path), "--json")
    assert code == 2 and log.count("\n") == 1
    assert f"{path}: (file): not a JSON trace: byte 0 is not UTF-8 text" in log and one_json(out)["exit_code"] == 2


def test_a_buffer_too_big_for_this_machine_is_bad_input_naming_it(tmp_path: Path) -> None:
    """A 32 GiB buffer (under load_trace's 64 GiB limit): a MemoryError, exit 5, before; then 'not enough memory'
    from the recording of one submit; now the device's maxBufferLength, as for 5 GiB (issue 9). In a child process
    with its address space limited to 6 GiB, so the test never really allocates it."""
    path = _bad_trace(tmp_path, lambda d: d["buffers"]["1"].__setitem__("size", 2**35))
    limit = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30)); "
             "from mtlir.cli.main import main; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-c", limit, "run", path, "--device", "sim", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "buffer:1 (34359738368 bytes): the size is above the device's " \
        "maxBufferLength (4294967296 bytes)" in proc.stderr
    assert one_json(proc.stdout)["error_type"] == "LinkError"


@pytest.mark.parametrize("flags", [["--json"], []], ids=["json", "listing"])
def test_a_stdout_that_cannot_be_written_is_one_line_on_stderr(flags: list[str]) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "mtlir.cli.main", "lower", MLP7, *flags], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr == "mtlir: error: cannot write the output to stdout: [Errno 28] No space left on device\n"


_STUCK = """
import os, sys
real = os._exit
def exit_now(code):
    sys.stderr.write(f"os._exit({code})\\n")
    sys.stderr.flush()
    real(code)
os._exit = exit_now
from mtlir.cli.main import main
sys.exit(main())
"""


def test_a_kernel_that_never_ends_exits_3_at_once_through_os_exit(tmp_path: Path) -> None:
    """The wait times out, the error is printed and the process leaves with os._exit: nothing waits for the OpenCL
    queue of a kernel that cannot be stopped (it used to end 8 s after the message)."""
    def endless(d: dict[str, Any]) -> None:
        prog = next(iter(d["programs"].values()))
        prog["msl"] = prog["msl"].replace(") {", ") { while (1) { }", 1)
    proc = subprocess.run([sys.executable, "-c", _STUCK, "run", _bad_trace(tmp_path, endless), "--device", "sim",
                           "--timeout", "1", "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines()[-2:] == [proc.stderr.splitlines()[-2], "os._exit(3)"]
    assert "timed out after 1 s waiting for timeline value 1" in proc.stderr
    # it names the kernel, its dispatch, the command buffer and the submit (issue 9)
    assert re.search(r"kernel '(\w+)' is still running \(ICB command 0 of MTLIndirectCommandBuffer 0x[0-9a-f]+ "
                     r"\(icb\) \(\1\)\), in command buffer 0 of submit 0 \(value 1\); command buffer statuses",
                     proc.stderr)
    assert one_json(proc.stdout)["error_type"] == "WaitTimeoutError"
