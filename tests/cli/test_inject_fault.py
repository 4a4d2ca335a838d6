"""``mtlir run --inject-fault`` (issue 13, docs/reliability.md): the done-when check (mlp.apple7 with each named
MTLCommandBufferError exits 3 with one line naming it), the program itself run once as a subprocess, --json's fields,
a kernel that never finishes, nil allocations at link (exit 2 naming the object), spellings argparse refuses, and a
fault the run never reaches."""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mtlir.cli.main import main
from mtlir.cli.run import make_bridge

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
MLP7 = str(TRACES / "mlp.apple7.json")
NAMED = {"Timeout": 2, "PageFault": 3, "NotPermitted": 7, "OutOfMemory": 8, "InvalidResource": 9}


def mtlir(*argv: str, **collaborators: Any) -> tuple[int, str, str]:
    """``mtlir argv`` in this process: (exit code, stdout, stderr)."""
    out, log = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, log=log, **collaborators)
    return code, out.getvalue(), log.getvalue()


@pytest.mark.parametrize("name", list(NAMED))
def test_each_named_fault_exits_3_with_one_line_naming_it(name: str) -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--inject-fault", f"0:{name}")
    assert code == 3 and out == "" and log.count("\n") == 1
    assert log.startswith(f"mtlir: error: submit 0 (timeline value 1): command buffer 0 failed with status Error, "
                          f"MTLCommandBufferError {NAMED[name]} ({name});")


def test_the_program_itself_exits_3_naming_pagefault() -> None:
    proc = subprocess.run([sys.executable, "-m", "mtlir.cli.main", "run", MLP7, "--device", "sim",
                           "--inject-fault", "0:PageFault"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert "MTLCommandBufferError 3 (PageFault)" in proc.stderr


def test_json_names_the_code_the_command_buffer_and_what_ran() -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--json", "--faithful", "--inject-fault", "0:9")
    doc = json.loads(out)
    assert code == 3 and doc["exit_code"] == 3 and doc["error_type"] == "GPUExecutionError"
    assert (doc["code"], doc["name"], doc["submit"], doc["command_buffer"]) == (9, "InvalidResource", 0, 0)
    assert doc["command_buffers"] == {"0": "Error (InvalidResource)"}
    assert doc["error"] == log.strip().removeprefix("mtlir: error: ")


def test_a_kernel_that_never_finishes_ends_at_the_watchdog() -> None:
    def quick_watchdog(*a: Any) -> Any:
        bridge, name = make_bridge(*a)
        bridge.gpu_timeout_s = 0.3
        return bridge, name
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--inject-fault", "0:hang", make_bridge=quick_watchdog)
    assert code == 3 and log.count("\n") == 1
    assert "MTLCommandBufferError 2 (Timeout)" in log and "a kernel that never finishes" in log


def test_a_later_submit_can_fail_and_the_first_ones_ran() -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--repeat", "3", "--inject-fault", "1:OutOfMemory")
    assert code == 3 and "submit 1 (timeline value 2): command buffer 0 failed" in log and "(OutOfMemory)" in log


@pytest.mark.parametrize("fault, named", [
    ("alloc:buffer", r"buffer:\d \(\d+ bytes\): Metal returned nil"),
    ("alloc:buffer:3", r"buffer:\d \(\d+ bytes\): Metal returned nil"),
    ("alloc:icb", r"icb \(5 commands; .*\): Metal returned nil"),
    ("alloc:pipeline", r"pipeline:r_8_128_16_4: newComputePipelineStateWithDescriptor:options:reflection:error: "
                       r"returned nil: Insufficient memory .*\(NSError code 8\)"),
])
def test_a_nil_allocation_is_one_line_naming_the_object_exit_2(fault: str, named: str) -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--json", "--inject-fault", fault)
    assert code == 2 and re.fullmatch(f"mtlir: error: {named}\n", log), log
    assert json.loads(out)["error_type"] == "LinkError"


@pytest.mark.parametrize("spec, match", [
    ("0:Bogus", "'Bogus' is not an MTLCommandBufferError name"), ("x:PageFault", "'x' is not an index"),
    ("alloc:texture", "expected alloc:KIND"), ("0:5", "5 is not an MTLCommandBufferError code"),
])
def test_a_fault_spelled_wrong_is_a_usage_error(spec: str, match: str) -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--inject-fault", spec)
    assert code == 2 and "argument --inject-fault" in log and match in log and log.count("\n") == 1


def test_a_fault_the_run_never_reaches_is_noted_and_the_run_matches() -> None:
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--json", "--inject-fault", "5:PageFault",
                           "--inject-fault", "alloc:icb:1")
    assert code == 0, log
    assert json.loads(out)["faults_not_fired"] == ["5:PageFault", "alloc:icb:1"]
    assert "--inject-fault 5:PageFault did not strike" in log


def test_inject_fault_needs_the_simulated_device() -> None:
    def metal_like(*a: Any) -> Any:
        return object(), "metal"
    code, out, log = mtlir("run", MLP7, "--device", "sim", "--inject-fault", "0:PageFault", make_bridge=metal_like)
    assert code == 2 and "--inject-fault injects faults on the simulated device (--device sim)" in log
