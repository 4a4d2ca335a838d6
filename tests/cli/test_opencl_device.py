"""mtlir run --list-devices and --opencl-device: the OpenCL device the simulated device runs the kernels on, named in
the summary line and the JSON result."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from mtlir.cli.main import main

pytest.importorskip("pyopencl")
from mtlir.runtime.sim.kernels.devices import list_devices  # noqa: E402

TRACE = str(Path(__file__).resolve().parents[2] / "examples" / "traces" / "mlp.apple7.json")


def run(*argv: str) -> tuple[int, str, str]:
    out, log = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, log=log)
    return code, out.getvalue(), log.getvalue()


def test_list_devices_needs_no_trace() -> None:
    code, out, _ = run("run", "--list-devices")
    assert code == 0 and out.splitlines() == list_devices()
    assert out.startswith("0: ") and " / " in out


def test_the_device_chosen_runs_the_kernels_and_is_named() -> None:
    name = list_devices()[0].split(": ", 1)[1].split(" (")[0]
    code, out, _ = run("run", TRACE, "--opencl-device", "0", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["match"] and doc["opencl_device"] == name
    code, out, _ = run("run", TRACE, "--opencl-device", name.split(" / ")[1][:5].lower())
    assert code == 0 and f"OpenCL device: {name}, result: match" in out.splitlines()[-1]


def test_a_device_that_is_not_there_exits_2_naming_those_that_are() -> None:
    code, _, log = run("run", TRACE, "--opencl-device", "no such device")
    assert code == 2
    assert "no OpenCL device matches 'no such device': the devices present are 0: " in log
