"""``mtlir.tinygrad.configure``: every value checked when it is given (``timeout_s=-1`` used to be accepted and fail
at the first tensor, naming ``Session(timeout_s=...)``), and a change once the METAL device is open refused (it used
to return the new settings and change nothing: the device stayed Apple9, strict)."""
from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest

from mtlir.errors import ArgumentError, StateError
from mtlir.tinygrad import SETTINGS, configure


@pytest.mark.parametrize("kwargs, error, match", [
    ({"timeout_s": -1}, ArgumentError, r"timeout_s=-1: the timeout must be a finite number of seconds above 0"),
    ({"timeout_s": 0}, ArgumentError, r"timeout_s=0: "),
    ({"timeout_s": math.nan}, ArgumentError, r"timeout_s=nan: "),
    ({"timeout_s": math.inf}, ArgumentError, r"timeout_s=inf: "),
    ({"timeout_s": "5"}, TypeError, r"timeout_s='5': expected a number of seconds"),
    ({"timeout_s": True}, TypeError, r"timeout_s=True: expected a number of seconds"),
    ({"strict": "no"}, TypeError, r"strict='no': expected True or False"),
    ({"residency_set": 1}, TypeError, r"residency_set=1: expected True or False"),
    ({"bridge": "metal"}, TypeError, r"bridge='metal': expected a function returning a Bridge"),
    ({"family": "Apple5"}, ArgumentError, r"unknown GPU family 'Apple5'"),
    ({"target": "riscv"}, ArgumentError, r"unknown target 'riscv'"),
    ({"colour": 1}, TypeError, r"unknown setting 'colour'"),
])
def test_a_bad_setting_is_refused_when_given_and_nothing_changes(kwargs: dict[str, Any], error: type[Exception],
                                                                 match: str) -> None:
    before = vars(SETTINGS).copy()
    with pytest.raises(error, match=match):
        configure(**{"target": "arm64" if SETTINGS.target != "arm64" else None, **kwargs})  # nor a good one with it
    assert vars(SETTINGS) == before


def test_settings_before_the_device_opens_are_used_by_it() -> None:
    """In a fresh process: configure first, then the device is what was asked; a change after it is open is a
    StateError naming the device and the change, and the settings stay as they were."""
    code = """
import mtlir.tinygrad as mt
from mtlir.errors import StateError
mt.configure(family="apple7", strict=False, timeout_s=12)
from tinygrad import Tensor
from tinygrad.device import Device
print((Tensor([1, 2, 3]) + 1).tolist(), Device["METAL"].arch, mt.SETTINGS.timeout_s)
mt.configure(family="Apple7", timeout_s=12.0)  # the same values: nothing changes, allowed
try:
    mt.configure(strict=True)
except StateError as e:
    print("refused:", e)
print(mt.SETTINGS.strict)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "[2, 3, 4] Apple7 12.0", proc.stdout
    assert lines[1].startswith("refused: configure(strict=True): the METAL device is already open (Apple7, "
                               "faithful, timeout 12 s)"), proc.stdout
    assert lines[2] == "False"


def test_a_change_after_the_device_opened_in_this_process_is_refused() -> None:
    from tinygrad.device import Device
    Device["METAL"]
    with pytest.raises(StateError, match="the METAL device is already open"):
        configure(strict=not SETTINGS.strict)
    assert configure(family=SETTINGS.family.lower()) is SETTINGS  # no change: allowed
