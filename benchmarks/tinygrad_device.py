"""mtlir's tinygrad device: what an eager kernel call and a TinyJit batch cost against the raw kernel runner.

    python benchmarks/tinygrad_device.py [--rounds 9] [--calls 20]

``measure()`` returns the figures as a dict. In one process, on the simulated device (Apple9, strict mode), the
two paths of each pair alternating round by round, medians over ``rounds`` rounds (wall time):

- ``eager_us`` / ``raw_us``: one tinygrad program (a 256-element add) called as tinygrad's runner calls it,
  ``MetalProgram(*bufs, global_size, local_size, vals, wait=True)`` (the Session submit and wait on the shared
  queue), against the same pipeline's kernel run directly by the simulated GPU's kernel runner
  (``GPU.run_kernel_now``: the translated OpenCL kernel on the same buffers, no Metal messages);
  ``eager_over_raw`` their ratio (issue 11's target: at most 2).
- ``jit_us_per_dispatch``: a TinyJit of ``kernels`` chained kernels called ``calls`` times per round (one ICB submit
  per call, then a wait), minus the same kernels run raw, divided by the kernels: the cost of a dispatch in a
  replayed batch (issue 11's target: at most 30 us per dispatch plus the kernels).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np


def _median_pair(a: Any, b: Any, rounds: int) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a()
        ta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        b()
        tb.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def measure(rounds: int = 9, calls: int = 20, kernels: int = 8) -> dict[str, Any]:
    """The figures of the module docstring, as a dict of floats (microseconds and ratios)."""
    import mtlir.tinygrad  # noqa: F401  (registers the device)
    from tinygrad import Device, Tensor, TinyJit
    from tinygrad.engine.realize import runtime_cache

    dev = Device["METAL"]
    sim = dev.bridge
    a = Tensor(np.arange(256, dtype=np.float32)).realize()
    b = Tensor(np.ones(256, dtype=np.float32)).realize()
    (a + b).realize()
    dev.synchronize()
    prg = list(runtime_cache.values())[-1]
    out = Tensor.empty(256).realize()
    bufs = [t.uop.buffer.ensure_allocated()._buf for t in (out, a, b)]
    gsize, local = prg.last_launch

    def eager() -> None:
        prg(*bufs, global_size=gsize, local_size=local, vals=(), wait=True)

    pipe = sim._objects[dev.ctx.pipelines[f"pipeline:{prg.kernel.key}"]]
    storages = [sim._objects[mb.buf.handle].storage for mb in bufs]
    binding = {i: (s, 0) for i, s in enumerate(storages)}

    def raw() -> None:
        sim.gpu.run_kernel_now(pipe, binding, gsize, local)
        sim.gpu.sync()

    eager()
    raw()
    eager_s, raw_s = _median_pair(eager, raw, rounds)

    x = Tensor(np.arange(256, dtype=np.float32)).realize()

    @TinyJit
    def chain(t: Tensor) -> Tensor:
        for k in range(kernels):
            t = (t * 1.0001 + k).contiguous()
        return t.realize()

    for _ in range(3):
        chain(x)
    dev.synchronize()

    def jit() -> None:
        for _ in range(calls):
            chain(x)
        dev.synchronize()

    def raw_chain() -> None:
        for _ in range(calls * kernels):
            sim.gpu.run_kernel_now(pipe, binding, gsize, local)
        sim.gpu.sync()

    jit_s, raw_chain_s = _median_pair(jit, raw_chain, rounds)
    per_dispatch = (jit_s - raw_chain_s) / (calls * kernels)
    return {"eager_us": eager_s * 1e6, "raw_us": raw_s * 1e6, "eager_over_raw": eager_s / raw_s,
            "jit_us_per_call": jit_s / calls * 1e6, "jit_kernels": kernels,
            "jit_us_per_dispatch": per_dispatch * 1e6, "rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.rounds, args.calls), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
