"""Issue 9, the command line behaving like its peers: ``python -m mtlir``, ``--version``, usage errors with the
failing subcommand's usage and no doubled prefix, file errors naming their argument."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mtlir.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MLP7 = str(ROOT / "examples" / "traces" / "mlp.apple7.json")


def mtlir(*argv: str) -> tuple[int, str, str]:
    """``mtlir argv`` in this process: (exit code, stdout, stderr)."""
    out, log = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, log=log)
    return code, out.getvalue(), log.getvalue()


def test_python_dash_m_mtlir_runs_the_command_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mtlir", "lower", MLP7, "--target", "arm64"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("; Apple7, residency set, ICB, arm64")


def test_version_is_the_package_metadata(tmp_path: Path) -> None:
    from importlib.metadata import version

    import mtlir as package
    assert package.__version__ == version("mtlir") and "__version__" in dir(package)
    proc = subprocess.run([sys.executable, "-m", "mtlir", "--version"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == f"mtlir {version('mtlir')}\n", proc.stderr


@pytest.mark.parametrize("argv, usage, match", [
    (["run", MLP7, "--pipeline", "encode"], "usage: mtlir run ", "run: unrecognized arguments: --pipeline encode"),
    (["lower", MLP7, "--repeat", "3"], "usage: mtlir lower ", "lower: unrecognized arguments: --repeat 3"),
    (["run"], "usage: mtlir run ", "run: the following arguments are required: trace"),
    ([], "usage: mtlir [-h] [--version]", "the following arguments are required: command"),
])
def test_a_usage_error_shows_the_failing_commands_usage_once(argv: list[str], usage: str, match: str) -> None:
    code, out, log = mtlir(*argv)
    assert code == 2 and out == "" and log.count("\n") == 1
    assert log.startswith(f"mtlir: error: {match} (") and f"({usage}" in log
    assert "mtlir: error: mtlir" not in log  # no doubled prefix


@pytest.mark.parametrize("command", ["lower", "run"])
def test_an_empty_viz_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    """``--viz ''`` was the current folder: exit 0 and the SVGs written where the command ran (an empty
    ``--opencl-device`` was already a usage error)."""
    monkeypatch.chdir(tmp_path)
    code, out, log = mtlir(command, MLP7, "--viz", "")
    assert code == 2 and out == "" and f"{command}: argument --viz: '': an empty path" in log, log
    assert list(tmp_path.iterdir()) == []


def test_viz_makes_its_folder_as_the_help_says(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    code, _, log = mtlir("lower", MLP7, "--viz", str(folder))
    assert code == 0 and (folder / "00-input.svg").is_file(), log
    assert "made, with the folders above it, when missing" in " ".join(build_parser_help("lower").split())


def build_parser_help(command: str) -> str:
    """The --help text of ``mtlir command``."""
    from mtlir.cli.main import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    return str(sub.choices[command].format_help())


def test_viz_naming_a_file_says_so(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, log = mtlir("lower", MLP7, "--viz", str(afile))
    assert code == 2 and log == f"mtlir: error: --viz {afile}: is a file, not a folder: give a folder for the " \
                                "pictures\n"
    code, _, log = mtlir("lower", MLP7, "--viz", str(afile / "sub"))
    assert code == 2 and log.startswith(f"mtlir: error: --viz {afile / 'sub'}: cannot write the pictures") \
        and "Errno" not in log


@pytest.mark.parametrize("make, why", [(lambda p: p / "missing.json", "No such file or directory"),
                                       (lambda p: p, "Is a directory")])
def test_a_trace_that_cannot_be_read_names_the_argument(tmp_path: Path, make: object, why: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    code, _, log = mtlir("run", str(path))
    assert code == 2 and log == f"mtlir: error: TRACE {path}: cannot read the trace: {why}\n"


# ---- limits named as limits


def _trace_with_buffer_size(tmp_path: Path, size: int) -> str:
    import json
    doc = json.loads(Path(MLP7).read_text())
    doc["buffers"]["3"]["size"] = size
    path = tmp_path / f"big{size}.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("size", [5 << 30, 1 << 36], ids=["5GiB", "64GiB"])
def test_a_buffer_above_max_buffer_length_names_both_numbers(tmp_path: Path, size: int) -> None:
    """5 GiB and 64 GiB fail the same way: above the simulated device's maxBufferLength (4 GiB), both numbers
    given (before: 'Metal returned nil' alone, and 'not enough memory' or a MemoryError at 64 GiB)."""
    code, out, log = mtlir("run", _trace_with_buffer_size(tmp_path, size), "--device", "sim", "--json")
    assert code == 2 and log == (f"mtlir: error: buffer:3 ({size} bytes): the size is above the device's "
                                 "maxBufferLength (4294967296 bytes): Metal returned nil\n")
    assert out.count("\n") == 1 and '"error_type": "LinkError"' in out


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_an_out_of_bounds_access_carries_no_note_of_an_unrelated_instruction(tmp_path: Path, executor: str) -> None:
    """Strict mode reports the access at the host's next call to the device (the timeline read): the error used to
    carry 'while running instruction 0: r2 = CALL ... (signaledValue)', an instruction that did not cause it."""
    import json
    import re
    doc = json.loads(Path(MLP7).read_text())
    prog = next(iter(doc["programs"].values()))
    first = re.search(r"device float\* (\w+)", prog["msl"]).group(1)  # type: ignore[union-attr]
    prog["msl"] = prog["msl"].replace(") {", f") {{ *({first}+100000) = 1.0f;", 1)
    path = tmp_path / "oob.json"
    path.write_text(json.dumps(doc))
    code, _, log = mtlir("run", str(path), "--device", "sim", "--debug", "--executor", executor)
    assert code == 3 and "wrote 4 bytes out of bounds" in log and "MetalValidationError" in log
    assert "while running instruction" not in log


# ---- mtlir translate


def test_translate_prints_the_opencl_c_of_one_kernel() -> None:
    from mtlir.frontend.trace import load_trace
    from mtlir.runtime.sim.msl.translate import translate
    code, out, log = mtlir("translate", MLP7, "--kernel", "E_5_8_2")
    assert code == 0, log
    msl = load_trace(MLP7).kernels["E_5_8_2"].msl
    assert out == "// kernel E_5_8_2 (function E_5_8_2)\n" + translate(msl).source.rstrip("\n") + "\n"
    assert "__kernel void E_5_8_2(" in out


def test_translate_prints_every_kernel_and_picks_one_by_function_name() -> None:
    code, out, _ = mtlir("translate", MLP7, "--no-bounds-checks")
    assert code == 0 and out.count("\n// kernel ") + out.startswith("// kernel ") == 5
    code, out, _ = mtlir("translate", MLP7, "--kernel", "r_8_10")  # r_8_10_v3's function is r_8_10 too
    assert code == 0 and "// kernel r_8_10 (function r_8_10)" in out and "// kernel r_8_10_v3 (function r_8_10)" in out


def test_translate_of_an_unknown_kernel_names_those_there_are() -> None:
    code, out, log = mtlir("translate", MLP7, "--kernel", "nope")
    assert code == 2 and out == "" and log.startswith("mtlir: error: --kernel nope: the trace has no kernel") \
        and "r_8_10_v3 (function r_8_10)" in log


def test_the_exit_code_table_names_the_error_type_invalid_msl_reports() -> None:
    """``run --json`` reports invalid MSL as a LinkError (the device answers newLibraryWithSource:options:error: with
    nil, on Metal and the simulated device alike: tests/cli/test_cli.py); docs/runtime.md said InvalidMslError
    (user test 12b)."""
    docs = (ROOT / "docs" / "runtime.md").read_text(encoding="utf-8")
    row = next(line for line in docs.splitlines() if line.startswith("| 2 |"))
    assert "invalid MSL" in row and '"error_type": "LinkError"' in row and "InvalidMslError" not in row


@pytest.mark.parametrize("command", ["run", "lower"])
def test_a_lone_surrogate_in_the_trace_is_bad_input_not_an_internal_error(tmp_path: Path, command: str) -> None:
    """``"\\ud800"`` is valid JSON but not Unicode text: printing the workload or the MSL raised UnicodeEncodeError
    (exit 5). The loader refuses it, naming the field."""
    import json
    data = json.loads(Path(MLP7).read_text())
    data["workload"] = "mlp\ud800"
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(data))
    code, out, log = mtlir(command, str(trace))
    assert code == 2 and out == "" and "workload: holds the character '\\ud800', a lone surrogate" in log


@pytest.mark.parametrize("flag, name, match", [
    ("--profile", "missing/x.json", "--profile {p}: cannot write the profile: the folder {d} does not exist"),
    ("--html", "missing/x.html", "--html {p}: cannot write the page: the folder {d} does not exist"),
    ("--html", ".", "--html {p}: is a folder, not a file"),
    ("--viz", "afile/sub", "--viz {p}: cannot write the pictures: {d} is a file, not a folder"),
])
def test_an_output_path_that_cannot_be_written_fails_before_any_work(tmp_path: Path, flag: str, name: str,
                                                                      match: str) -> None:
    """``run --profile /nonexistent/x.json`` lowered, linked and ran everything, then exited 2: the paths are
    checked first (the trace below would fail to load: the output check must come before it)."""
    (tmp_path / "afile").write_text("x")
    path = tmp_path / name
    for command in ("run", "lower"):
        if flag == "--profile" and command == "lower":
            continue
        code, out, log = mtlir(command, str(tmp_path / "no-trace.json"), flag, str(path))
        assert code == 2 and out == "" and log == "mtlir: error: " + match.format(p=path, d=path.parent) + "\n"


def test_list_devices_refuses_what_it_would_ignore() -> None:
    for argv, match in ((["run", "--list-devices", MLP7], "takes no TRACE"),
                        (["run", "--list-devices", "--opencl-device", "nosuch"], "(got --opencl-device)"),
                        (["run", "--list-devices", "--repeat", "3", "--faithful"], "(got --faithful, --repeat)"),
                        (["run", MLP7, "--opencl-device", ""], "--opencl-device: '': an empty name"),
                        (["run", MLP7, "--opencl-device", " "], "--opencl-device: ' ': an empty name"),
                        (["run"], "run: the following arguments are required: trace")):
        code, out, log = mtlir(*argv)
        assert code == 2 and out == "" and match in log and log.count("\n") == 1, (argv, log)


def test_list_devices_json_is_one_list() -> None:
    pytest.importorskip("pyopencl")
    import json
    from mtlir.runtime.sim.kernels.devices import list_devices
    code, out, _ = mtlir("run", "--list-devices", "--json")
    assert code == 0 and json.loads(out) == [{"index": i, "device": line.split(": ", 1)[1]}
                                             for i, line in enumerate(list_devices())]


def test_inject_fault_help_says_k_counts_on_through_later_submits() -> None:
    from mtlir.cli.main import build_parser
    text = " ".join(build_parser().commands["run"].format_help().split())
    assert "K counts on through later submits" in text and "of the first submit fail" not in text


def test_translate_reports_invalid_msl_as_run_does(tmp_path: Path) -> None:
    """MSL the translator passes through but a compiler refuses (an undeclared identifier): ``translate`` printed
    its OpenCL C and exited 0 while ``run`` exited 2. Both build it now and give the same error."""
    pytest.importorskip("pyopencl")
    import json
    data = json.loads(Path(MLP7).read_text())
    prog = data["programs"]["E_5_8_2"]
    assert "(1/val2)" in prog["msl"]
    prog["msl"] = prog["msl"].replace("(1/val2)", "(1/val9)")
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(data))
    logs = []
    for command in ("translate", "run"):
        code, out, log = mtlir(command, str(trace))
        assert code == 2 and "MSL line 11, column 66: use of undeclared identifier 'val9'" in log, (command, log)
        logs.append(log)
    said = logs[0].splitlines()[0].split("invalid MSL")[1]  # run adds Metal's NSError code after it
    assert out == "" and said and said in logs[1].splitlines()[0]


@pytest.mark.parametrize("argv, first, second", [
    (["run", MLP7, "--profile", "{d}/same.out", "--html", "{d}/same.out"], "--html", "--profile"),
    (["run", MLP7, "--profile", "{d}/same.out", "--html", "{d}/../{n}/same.out", "--json"], "--html", "--profile"),
    (["run", MLP7, "--profile", "{d}/same.out", "--viz", "{d}/same.out"], "--profile", "--viz"),
    (["lower", MLP7, "--html", "{d}/pics", "--viz", "{d}/pics"], "--html", "--viz"),
])
def test_two_outputs_naming_the_same_path_are_refused_naming_both(tmp_path: Path, argv: list[str], first: str,
                                                                  second: str) -> None:
    """``--profile same.out --html same.out`` exited 0 and one output overwrote the other."""
    code, out, log = mtlir(*[a.format(d=tmp_path, n=tmp_path.name) for a in argv])
    assert code == 2, log
    assert f"{first} " in log and f"{second} " in log and "name the same path" in log
    assert log.index(first) < log.index(second) and list(tmp_path.iterdir()) == []  # refused before any work
    if "--json" in argv:
        assert out.startswith('{"error": ') and out.count("\n") == 1


@pytest.mark.parametrize("flag", ["--html", "--profile"])
def test_an_output_naming_the_input_trace_is_refused(tmp_path: Path, flag: str) -> None:
    trace = tmp_path / "t.json"
    trace.write_bytes(Path(MLP7).read_bytes())
    code, _, log = mtlir("run", str(trace), flag, str(tmp_path / "." / "t.json"))
    assert code == 2 and f"{flag} " in log and "is the input trace" in log, log
    assert trace.read_bytes() == Path(MLP7).read_bytes()


def test_record_refuses_an_output_that_is_the_script(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("def main(): pass\n")
    code, _, log = mtlir("record", str(script), "-o", str(tmp_path / ".." / tmp_path.name / "prog.py"))
    assert code == 2 and "-o " in log and "is the SCRIPT" in log, log
    assert script.read_text() == "def main(): pass\n"


def test_version_with_json_is_one_object_on_stdout() -> None:
    """``mtlir --version --json`` printed the version to stderr (a --json command's fd 1) and nothing on stdout."""
    from importlib.metadata import version
    for argv in (["--version", "--json"], ["--json", "--version"]):
        code, out, log = mtlir(*argv)
        assert code == 0 and log == "" and json.loads(out) == {"version": version("mtlir")}
    code, out, log = mtlir("--version")
    assert code == 0 and out == f"mtlir {version('mtlir')}\n" and log == ""


def test_a_repeated_pipeline_flag_runs_the_pipelines_in_order() -> None:
    """``mtlir opt F -p encode -p barriers`` used only the last -p (barriers alone, which cannot start at a queue)."""
    joined = mtlir("opt", MLP7, "-p", "encode", "-p", "barriers")
    assert joined[0] == 0, joined[2]
    assert joined == mtlir("opt", MLP7, "-p", "encode,barriers")
    assert mtlir("opt", MLP7, "--pipeline", "encode", "-p", "barriers,abi{target=arm64}")[1] == \
        mtlir("opt", MLP7, "-p", "encode,barriers,abi{target=arm64}")[1]
    lowered = mtlir("lower", MLP7, "--pipeline", "encode", "--pipeline", "abi{target=arm64},linearize")
    assert lowered[0] == 0 and lowered == mtlir("lower", MLP7, "--pipeline", "encode,abi{target=arm64},linearize")
    code, _, log = mtlir("opt", MLP7, "-p", "encode", "-p", " ")
    assert code == 2 and "-p/--pipeline: an empty pipeline" in log


def test_an_internal_error_in_a_pass_shows_the_notes_naming_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in a pass (a bare KeyError: 'boom', exit 5) now says which pass it came from."""
    from mtlir.passes.encode.encode import Encode

    def broken(self: Encode, graph: object, ctx: object) -> None:
        raise KeyError("boom")
    monkeypatch.setattr(Encode, "apply", broken)
    code, out, log = mtlir("opt", MLP7, "-p", "encode")
    assert code == 5 and out == ""
    assert log.splitlines() == ["mtlir: internal error: KeyError: 'boom'",
                                "mtlir: note: in pass 'encode' (pass 1 of 1 of pipeline 'encode')"]
    code, out, log = mtlir("lower", MLP7, "--pipeline", "encode", "--json")
    assert code == 5 and json.loads(out)["notes"] == ["in pass 'encode' (pass 1 of 1 of pipeline 'encode')"]
