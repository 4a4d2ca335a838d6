"""Two queues on one device: a copy queue uploads the next input while the compute queue works on the current one.

The inputs arrive in ``staging`` (K inputs of N floats, as a loader would leave them). Each submit of the one
Program does, on two command queues of one device:

- the copy queue: wait until the compute queue has finished the step before (its input slot is free again), then
  ``copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:`` on a blit encoder: the next input into the other
  half of the double buffer ``inputs``; signal the copy queue's timeline;
- the compute queue: wait until the copy queue uploaded this step's input (``encodeWaitForEvent:value:`` on the copy
  queue's timeline, before its encoder), run ``advance`` on it (out = 2 * in + step), signal its own timeline.

The timeline value ``v`` of a submit (1, 2, ...) names everything: this step is ``v - 1``, its input slot
``(v - 1) % 2``, the upload goes into slot ``v % 2``. The first input is in slot 0 from the start. The script lowers
the queues, prints the listing of one submit (``--json``: the messages as ``mtlir lower --json`` prints them) and,
with ``--run``, runs K submits on the simulated Metal device and checks every output with numpy.

    python examples/two_queues.py [--family apple7] [--target arm64] [--no-icb] [--json] [--run]
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from mtlir.frontend.nodes import buffer, timeline_value
from mtlir.frontend.queue import Queue, queues
from mtlir.ir.uop import UOp
from mtlir.metal import FAMILIES, DeviceSpec, Kernel, KernelParam
from mtlir.passes import Lowered, lower

N = 256           # floats per input
K = 6             # inputs
BLOCK = 64        # threads per threadgroup

ADVANCE_MSL = """#include <metal_stdlib>
using namespace metal;
kernel void advance(device float* out, device float* inputs, constant int& slot, constant int& index,
                 uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 64 + lid.x;
  out[index * 256 + i] = 2.0f * inputs[slot * 256 + i] + (float)index;
}
"""

ADVANCE = Kernel("advance", "advance", ADVANCE_MSL, (KernelParam(None, 0, "float32", K * N),
                                               KernelParam(None, 1, "float32", 2 * N),
                                               KernelParam("slot", 2, "int32"), KernelParam("index", 3, "int32")))


def build_queues(device: DeviceSpec) -> UOp:
    """The queue graph of one submit: the copy queue's upload and the compute queue's step, ordered by each other's
    timelines (``queues(copy, compute)``: submitted in that order)."""
    staging, inputs, out = buffer("staging", 4 * K * N), buffer("inputs", 4 * 2 * N), buffer("out", 4 * K * N)
    v = timeline_value()
    copy = Queue(device, name="copy")
    compute = Queue(device)
    copy.wait(compute.timeline, v - 1)                    # the step before read the slot this upload overwrites
    copy.copy(staging, inputs, 4 * N, src_offset=(v % K) * (4 * N), dst_offset=(v % 2) * (4 * N))
    copy.signal(copy.timeline, v)
    compute.wait(copy.timeline, v - 1)                    # this step's input: uploaded by the submit before
    compute.exec(ADVANCE, [out, inputs], [(v - 1) % 2, (v - 1) % K], grid=(N // BLOCK,), threadgroup=(BLOCK,))
    compute.signal(compute.timeline, v)
    return queues(copy, compute)


def run(lowered: Lowered) -> bool:
    """Link the Program on the simulated device, submit K steps, compare every output with numpy."""
    from mtlir.runtime import Session
    from mtlir.runtime.sim.device import SimDevice
    program = lowered.program
    data = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
    initial = {"buffer:staging": data.tobytes(), "buffer:inputs": data[0].tobytes() + bytes(4 * N)}
    dev = program.device
    with SimDevice(program.target, family=dev.family, residency_sets=dev.residency_set, icb=dev.icb) as sim, \
            Session(program, sim, initial=initial, timeout_s=60) as s:
        for _ in range(K):
            s.submit()
        s.wait(timeout_s=60)
        got = np.frombuffer(s.read("buffer:out"), np.float32).reshape(K, N)
        want = 2 * data + np.arange(K, dtype=np.float32)[:, None]
        ok = bool(np.allclose(got, want, rtol=1e-6, atol=1e-6))
        print(f"{K} steps over two queues: timelines copy {s.event_value('event:copy')}, compute "
              f"{s.timeline_value()}; outputs {'match' if ok else 'DIFFER from'} numpy", file=sys.stderr)
    return ok


def family(text: str) -> str:
    """``--family``: a GPU family in any case (``apple7``, ``Apple7``); an argparse error (exit 2) otherwise."""
    for name in FAMILIES:
        if name.lower() == text.lower():
            return name
    raise argparse.ArgumentTypeError(f"unknown GPU family {text!r}: expected one of {', '.join(FAMILIES)}")


def main(argv: list[str] | None = None) -> int:
    """Lower the two queues for the device the options describe, print them, run them; the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="Apple7", type=family, help="GPU family: apple7, apple8, apple9, mac2")
    ap.add_argument("--target", default="arm64", choices=("arm64", "x86_64"), help="the ABI to lower for")
    ap.add_argument("--no-residency-set", action="store_true", help="a device without residency sets")
    ap.add_argument("--no-icb", action="store_true", help="a device without ICB support: the direct path")
    ap.add_argument("--json", action="store_true", help="print the messages of one submit as mtlir lower --json")
    ap.add_argument("--run", action="store_true", help="run on the simulated device and compare with numpy")
    args = ap.parse_args(argv)
    device = DeviceSpec(args.family, residency_set=not args.no_residency_set, icb=not args.no_icb)
    lowered = lower(build_queues(device), target=args.target)
    if args.json:
        from mtlir.cli.lower import record_one_submit
        messages = record_one_submit(lowered.program, {"timeline": 1}, args.target)
        json.dump({"messages": messages, "count": len(messages)}, sys.stdout)
        print()
    else:
        print(lowered.program.listing())
    if args.run:
        return 0 if run(lowered) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
