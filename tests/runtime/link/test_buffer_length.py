"""A buffer above the device's maxBufferLength (issue 9): the LinkError gives both numbers, not only 'Metal
returned nil'."""
from __future__ import annotations

from pathlib import Path

import pytest

MLP7 = Path(__file__).resolve().parents[3] / "examples" / "traces" / "mlp.apple7.json"


def test_new_buffer_above_max_buffer_length_names_both_numbers() -> None:
    from mtlir.errors import LinkError
    from mtlir.frontend.trace import load_trace
    from mtlir.metal import DeviceSpec
    from mtlir.passes import lower
    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    trace = load_trace(MLP7)
    program = lower(trace.queue(DeviceSpec("Apple7")), target="arm64").program
    with SimDevice("arm64", family="Apple7", max_buffer_length=1 << 20) as dev, Session(program, dev) as s:
        with pytest.raises(LinkError, match=r"new_buffer 'big' \(2097152 bytes\): the size is above the device's "
                                            r"maxBufferLength \(1048576 bytes\)"):
            s.linked.new_buffer("big", 2 << 20)
