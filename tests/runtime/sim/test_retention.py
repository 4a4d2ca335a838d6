"""Nothing the simulated device made for a finished submit stays reachable: a long run keeps a bounded number of
command buffers and encoders alive (a fence's last updater used to hold every encoder ever run through their fence
waits: about 5 KB per submit, 2 GB for `mtlir run --repeat 1000000`)."""
from __future__ import annotations

import gc
from pathlib import Path

from mtlir.frontend.trace import load_trace
from mtlir.metal import DeviceSpec
from mtlir.passes import lower
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.objects import CommandBuffer, Encoder

TRACES = Path(__file__).resolve().parents[3] / "examples" / "traces"


def _alive(kind: type) -> int:
    gc.collect()
    return sum(isinstance(o, kind) for o in gc.get_objects())


def test_finished_submits_leave_nothing_behind() -> None:
    trace = load_trace(TRACES / "symbolic_kv.apple7.json")
    program = lower(trace.queue(DeviceSpec("Apple7")), target="x86_64", keep_stages=False).program
    with SimDevice("x86_64", family="Apple7") as dev, Session(program, dev, initial=trace.initial_data()) as s:
        counts = []
        for n in range(60):
            s.submit(start_pos=n % 32 + 1)
            s.wait(timeout_s=30)
            if n in (9, 59):
                counts.append((_alive(CommandBuffer), _alive(Encoder)))
    assert counts[1][0] <= counts[0][0] + 2 and counts[1][1] <= counts[0][1] + 2, counts
