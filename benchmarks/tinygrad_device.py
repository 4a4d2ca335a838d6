"""mtlir's tinygrad device: what an eager kernel call and a TinyJit batch cost against the raw kernel runner.

    python benchmarks/tinygrad_device.py [--rounds 9] [--calls 20]

``measure()`` returns the figures as a dict. In one process, on the simulated device (Apple9, strict mode), the
two paths of each pair alternating round by round, medians over ``rounds`` rounds (wall time):

- ``eager_us`` / ``raw_us``: one tinygrad program (a 256-element add) called as tinygrad's runner calls it,
  ``MetalProgram(*bufs, global_size, local_size, vals, wait=True)`` (the Session submit and wait on the shared
  queue), against the kernel runner alone running the same launch (the OpenCL kernel object, arguments and sizes
  the simulated GPU prepared for that ICB command, taken from it): ``run_batch`` of that one launch and the
  ``sync`` that brings the result to the host, what the device itself does for the kernel, with no Metal message;
  ``eager_over_raw`` their ratio (issue 11's target: at most 2). ``eager_stream_us_per_call`` /
  ``eager_stream_over_raw``: ``calls`` such calls without a wait (tinygrad's usual call), then one wait, per call
  and against ``calls`` raw runs.
- ``jit_us_per_call`` / ``jit_raw_us_per_call``: a TinyJit of ``kernels`` chained kernels called ``calls`` times
  per round (one ICB submit per call, then a wait), against the kernel runner running the batch's own launches
  (taken from the ICB's commands: the same kernels, buffers and sizes) as one ``run_batch`` and a ``sync`` per
  call; ``jit_us_per_dispatch`` = their difference divided by the kernels: what a dispatch in a replayed batch
  costs on top of its kernel, tinygrad's own TinyJit Python included (its inputs' preparation, ``run_linear``).
- ``graph_us_per_call`` / ``graph_us_per_dispatch``: the same batch through the graph runner alone
  (``MtlirGraph(input_uops, var_vals)``, what TinyJit calls for the batch, with the arguments it passed): mtlir's
  own cost of a replayed batch, as ``eager_us`` is mtlir's own cost of an eager call (issue 11's target: at most
  30 us per dispatch above the kernels).
- ``*_paired``: the same figures from each round's own pair (the median of the rounds' ratios, or differences per
  dispatch), which a burst of load on a shared machine moves less than the figures from two medians taken apart.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np


class Pair:
    """Two paths timed round by round, alternating (``a`` then ``b`` in each round): seconds per round."""

    def __init__(self, a: Any, b: Any, rounds: int) -> None:
        self.a: list[float] = []
        self.b: list[float] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            a()
            self.a.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b()
            self.b.append(time.perf_counter() - t0)

    def medians(self) -> tuple[float, float]:
        return statistics.median(self.a), statistics.median(self.b)

    def paired_ratio(self) -> float:
        """The median of the rounds' own ratios a/b: a burst of load on the machine moves both paths of a round,
        so it moves this less than the ratio of the two medians."""
        return statistics.median(x / y for x, y in zip(self.a, self.b))

    def paired_difference(self) -> float:
        """The median of the rounds' own differences a - b (seconds)."""
        return statistics.median(x - y for x, y in zip(self.a, self.b))


def _launches(dev: Any, session: Any) -> list[Any]:
    """The kernel runner's launches the simulated GPU keeps for the ICB commands of ``session`` (run once before)."""
    icb = dev.bridge._objects[session.linked.handles["icb"]]
    out = [icb.slots[i].launch[2] for i in range(icb.max_count) if icb.slots.get(i) is not None]
    if not out or any(x is None for x in out):
        raise RuntimeError("the ICB's commands have no kept launch: run the Program once first")
    return out


def measure(rounds: int = 9, calls: int = 20, kernels: int = 8) -> dict[str, Any]:
    """The figures of the module docstring, as a dict of floats (microseconds and ratios)."""
    import mtlir.tinygrad  # noqa: F401  (registers the device)
    from tinygrad import Device, Tensor, TinyJit
    from tinygrad.engine.realize import runtime_cache

    from mtlir.tinygrad.graph import MtlirGraph

    dev = Device["METAL"]
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

    eager()
    eager()
    (launch,) = _launches(dev, prg.sessions[(tuple(mb.size for mb in bufs), tuple(local))].sessions[0])
    runner = launch.ck._runner

    def raw() -> None:
        runner.run_batch([launch], 30.0, keep=True, write_back=True)
        runner.sync()

    raw()
    single = Pair(eager, raw, rounds)
    eager_s, raw_s = single.medians()

    def stream() -> None:  # tinygrad's usual call: no wait (the ring of two Sessions alternates)
        for _ in range(calls):
            prg(*bufs, global_size=gsize, local_size=local, vals=(), wait=False)
        dev.synchronize()

    def raw_stream() -> None:
        for _ in range(calls):
            raw()

    stream()
    streamed = Pair(stream, raw_stream, rounds)
    stream_s, raw_stream_s = streamed.medians()

    x = Tensor(np.arange(256, dtype=np.float32)).realize()

    @TinyJit
    def chain(t: Tensor) -> Tensor:
        for k in range(kernels):
            t = (t * 1.0001 + k).contiguous()
        return t.realize()

    for _ in range(3):
        chain(x)
    dev.synchronize()
    graph = MtlirGraph.last
    assert graph is not None
    (ring,) = graph.sessions.values()
    launches = _launches(dev, ring.sessions[0])
    if len(launches) != kernels:
        raise RuntimeError(f"the JIT batch has {len(launches)} commands, not {kernels}")

    def jit() -> None:
        for _ in range(calls):
            chain(x)
        dev.synchronize()

    def raw_chain() -> None:
        for _ in range(calls):
            runner.run_batch(launches, 30.0, keep=True, write_back=True)
            runner.sync()

    jitted = Pair(jit, raw_chain, rounds)
    jit_s, raw_chain_s = jitted.medians()

    seen: list[tuple[Any, ...]] = []  # what TinyJit hands the graph runner (its input UOps, the variables)
    call = MtlirGraph.__call__

    def record(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(args)
        return call(self, *args, **kwargs)

    MtlirGraph.__call__ = record  # type: ignore[method-assign]
    try:
        chain(x)
    finally:
        MtlirGraph.__call__ = call  # type: ignore[method-assign]
    dev.synchronize()
    (graph_args,) = seen

    def replay() -> None:  # the graph runner alone: the batch's submit, without TinyJit's own Python
        for _ in range(calls):
            graph(*graph_args)
        dev.synchronize()

    replayed = Pair(replay, raw_chain, rounds)
    graph_s, raw_graph_s = replayed.medians()
    return {"eager_us": eager_s * 1e6, "raw_us": raw_s * 1e6, "eager_over_raw": eager_s / raw_s,
            "eager_over_raw_paired": single.paired_ratio(),
            "eager_stream_us_per_call": stream_s / calls * 1e6,
            "eager_stream_over_raw": stream_s / raw_stream_s,
            "eager_stream_over_raw_paired": streamed.paired_ratio(),
            "jit_us_per_call": jit_s / calls * 1e6, "jit_raw_us_per_call": raw_chain_s / calls * 1e6,
            "jit_kernels": kernels, "jit_us_per_dispatch": (jit_s - raw_chain_s) / (calls * kernels) * 1e6,
            "jit_us_per_dispatch_paired": jitted.paired_difference() / (calls * kernels) * 1e6,
            "graph_us_per_call": graph_s / calls * 1e6,
            "graph_us_per_dispatch": (graph_s - raw_graph_s) / (calls * kernels) * 1e6,
            "graph_us_per_dispatch_paired": replayed.paired_difference() / (calls * kernels) * 1e6,
            "rounds": rounds}


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text}: at least 1")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=_positive, default=9, help="interleaved rounds per pair (>= 1)")
    ap.add_argument("--calls", type=_positive, default=20, help="calls per round of the streamed and JIT pairs (>= 1)")
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.rounds, args.calls), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
