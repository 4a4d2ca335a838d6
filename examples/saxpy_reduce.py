"""A queue written by hand: y = a*x + y over n elements, then a sum of y per 64-element block in threadgroup memory.

Two small MSL kernels, their buffers, one run-time variable (n: the grids depend on it), a wait and a signal of the
queue's timeline. The script lowers the queue, prints the listing of one submit and, with ``--viz DIR``, writes
one picture per stage of the lowering. With ``--run`` it also runs the Program on the simulated Metal device (the
kernels run through OpenCL) for a few values of n, from one lowering, and checks the numbers against numpy.

    python examples/saxpy_reduce.py [--family apple7] [--target arm64] [--no-icb] [--viz out/] [--run]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np

from mtlir.metal import FAMILIES, DeviceSpec, Kernel, KernelParam
from mtlir.passes import Lowered, lower
from mtlir.frontend.nodes import buffer, timeline_value, view
from mtlir.frontend.queue import Queue
from mtlir.ir.uop import UOp

BLOCK = 64        # threads per threadgroup, elements per partial sum
MAX_N = 4096      # elements the buffers hold

SAXPY_MSL = """#include <metal_stdlib>
using namespace metal;
kernel void saxpy(device float* y, device float* x, device float* a, constant int& n,
                  uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 64 + lid.x;
  if (i < n) {
    y[i] = a[0] * x[i] + y[i];
  }
}
"""

REDUCE_MSL = """#include <metal_stdlib>
using namespace metal;
kernel void block_sum(device float* out, device float* y, constant int& n,
                      uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup float part[64];
  int i = gid.x * 64 + lid.x;
  part[lid.x] = i < n ? y[i] : 0.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int stride = 32; stride > 0; stride = stride / 2) {
    if ((int)lid.x < stride) {
      part[lid.x] = part[lid.x] + part[lid.x + stride];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (lid.x == 0) {
    out[gid.x] = part[0];
  }
}
"""

SAXPY = Kernel("saxpy", "saxpy", SAXPY_MSL, (KernelParam(None, 0, "float32", MAX_N),
                                              KernelParam(None, 1, "float32", MAX_N),
                                              KernelParam(None, 2, "float32", 1), KernelParam("n", 3, "int32")))
BLOCK_SUM = Kernel("block_sum", "block_sum", REDUCE_MSL, (KernelParam(None, 0, "float32", MAX_N // BLOCK),
                                                         KernelParam(None, 1, "float32", MAX_N),
                                                         KernelParam("n", 2, "int32")))


def build_queue(device: DeviceSpec) -> UOp:
    """The queue graph of one submit: saxpy, then the block sums, then a signal of the timeline."""
    n = UOp.variable("n", 1, MAX_N)
    blocks = (n + BLOCK - 1) // BLOCK                     # threadgroups: an expression of n, computed per submit
    #                                                       (a node: (n // BLOCK).maximum(1), never Python's max())
    x, y = buffer("x", 4 * MAX_N), buffer("y", 4 * MAX_N)
    params = buffer("params", 256)                        # a[0] lives at the start of a small buffer
    out = buffer("out", 4 * (MAX_N // BLOCK))
    step = timeline_value()
    q = Queue(device)
    q.wait(q.timeline, step - 1)                          # the previous submit: the fence already orders it
    q.exec(SAXPY, [y, x, view(params, 0, 4)], [n], grid=(blocks,), threadgroup=(BLOCK,))
    q.exec(BLOCK_SUM, [out, y], [n], grid=(blocks,), threadgroup=(BLOCK,))
    q.signal(q.timeline, step)
    return q.submit()


def write_pictures(lowered: Lowered, outdir: Path) -> None:
    """One SVG per graph stage (``00-input.svg``, ``01-encode.svg``, ...) and the Program's listing as text; a
    stage its pass left as it was says ``(unchanged)`` in its title."""
    from mtlir.viz import to_dot, write_picture
    outdir.mkdir(parents=True, exist_ok=True)
    for i, (name, stage) in enumerate(lowered.stages):
        if isinstance(stage, UOp):
            dot = to_dot(stage, name=f"{name} (unchanged)" if lowered.unchanged(i) else name)
            print(f"wrote {write_picture(dot, outdir / f'{i:02d}-{name}.svg')}", file=sys.stderr)
        else:
            path = outdir / f"{i:02d}-{name}.txt"
            path.write_text(stage.listing() + "\n")
            print(f"wrote {path}", file=sys.stderr)


def run(lowered: Lowered, ns: list[int]) -> bool:
    """Link the Program on the simulated device and replay it for each n; compare y and the sums with numpy."""
    from mtlir.runtime import Session
    from mtlir.runtime.sim.device import SimDevice
    program = lowered.program
    rng = np.random.default_rng(0)
    x = rng.standard_normal(MAX_N).astype(np.float32)
    y0 = rng.standard_normal(MAX_N).astype(np.float32)
    a = np.float32(0.5)
    initial = {"buffer:x": x.tobytes(), "buffer:y": y0.tobytes(), "buffer:params": a.tobytes() + bytes(252)}
    dev = program.device
    ok = True
    with SimDevice(program.target, family=dev.family, residency_sets=dev.residency_set, icb=dev.icb) as sim, \
            Session(program, sim, initial=initial, timeout_s=60) as s:
        y = y0.copy()
        for n in ns:
            s.submit(n=n)
            s.wait(timeout_s=60)
            y[:n] = a * x[:n] + y[:n]
            got_y = np.frombuffer(s.read("buffer:y"), np.float32)
            blocks = -(-n // BLOCK)
            want = np.array([y[b * BLOCK:min((b + 1) * BLOCK, n)].sum() for b in range(blocks)], np.float32)
            got = np.frombuffer(s.read("buffer:out", 0, 4 * blocks), np.float32)
            good = np.allclose(got_y, y, rtol=1e-5, atol=1e-6) and np.allclose(got, want, rtol=1e-4, atol=1e-4)
            print(f"n = {n:4d}: {blocks:2d} block sums {'match' if good else 'DIFFER'} numpy", file=sys.stderr)
            ok &= good
    return ok


def family(text: str) -> str:
    """``--family``: a GPU family in any case (``apple7``, ``Apple7``); an argparse error (exit 2) otherwise."""
    for name in FAMILIES:
        if name.lower() == text.lower():
            return name
    raise argparse.ArgumentTypeError(f"unknown GPU family {text!r}: expected one of {', '.join(FAMILIES)}")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """Lower the queue for the device the options describe, print it, draw it, run it; the exit status (2 for a
    bad option, as argparse says in one line)."""
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="Apple7", type=family,
                    help="GPU family: apple7, apple8, apple9, mac2 (any case)")
    ap.add_argument("--target", default="arm64", choices=("arm64", "x86_64"), help="the ABI to lower for")
    ap.add_argument("--no-residency-set", action="store_true", help="a device without residency sets")
    ap.add_argument("--no-icb", action="store_true", help="a device without ICB support: the direct path")
    ap.add_argument("--viz", type=Path, metavar="DIR", help="write one picture per stage into DIR")
    ap.add_argument("--run", action="store_true", help="run on the simulated device and compare with numpy")
    args = ap.parse_args(argv)
    device = DeviceSpec(args.family, residency_set=not args.no_residency_set, icb=not args.no_icb)
    lowered = lower(build_queue(device), target=args.target)
    print(lowered.program.listing())
    for note in lowered.diagnostics:
        print(f"note: {note}", file=sys.stderr)
    if args.viz is not None:
        write_pictures(lowered, args.viz)
    if args.run:
        return 0 if run(lowered, [1, 100, 64, 4096, 1000]) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
