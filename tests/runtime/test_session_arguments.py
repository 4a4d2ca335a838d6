"""Session's arguments (issue 9): the result of ``mtlir.lower`` instead of its Program is a TypeError saying what
to pass."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtlir.metal import DeviceSpec
from mtlir.frontend.trace import load_trace
from mtlir.passes import lower
from mtlir.runtime.bridge.recording import RecordingBridge
from mtlir.runtime.session import Session

ROOT = Path(__file__).resolve().parents[2]


def test_session_of_a_lowered_says_to_pass_its_program() -> None:
    trace = load_trace(ROOT / "examples" / "traces" / "mlp.apple7.json")
    lowered = lower(trace.queue(DeviceSpec("Apple7")), target="arm64")
    with pytest.raises(TypeError, match=r"got Lowered: pass its \.program \(Session\(lowered\.program, \.\.\.\)\)"):
        Session(lowered, RecordingBridge(target="arm64"))
    with pytest.raises(TypeError, match="a Program is needed, got str"):
        Session("program", RecordingBridge(target="arm64"))  # type: ignore[arg-type]
    with Session(lowered.program, RecordingBridge(target="arm64")) as s:
        assert s.program is lowered.program
