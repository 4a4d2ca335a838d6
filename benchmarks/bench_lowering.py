"""Queue building + lowering cost per command as queues grow, and messages per submit for the ICB vs the direct path.

    python -m benchmarks.bench_lowering [--sizes 1000,10000,100000] [--rounds 7] [--paths icb,direct,...]

(from where the package ``benchmarks`` is importable: ``make bench`` sets that up; ``python -m benchmarks`` reports
the same figures as JSON, ``benchmarks/compiler.py``.)

Part 1 builds and lowers queues of 1k, 10k and 100k commands (8 kernels, 16 buffers, a distinct view per command, a
run-time variable as a kernel argument: no two EXECs alike) through the default pipeline for Apple7 without a
residency set (the longest message chain), on each path: ``icb``, ``direct`` (a device without ICB support),
``icb+ts`` and ``direct+ts`` (a timestamp after every command: one command buffer per command, a loop over
them on both paths), ``icb+sig`` (a signal after every second command: a command buffer per two
commands; encode makes loops over tables of both, docs/lowering.md). Each figure is the
median over ``--rounds`` interleaved rounds of CPU time (``benchmarks.timing.interleaved``) of building the queue
graph (``Queue.exec`` ..., under ``gc_paused`` as docs/lowering.md advises) and lowering it, in µs per command;
"x toposort" divides it by one ``toposort()`` of a queue graph of the same shape timed in the same rounds (a walk
that visits each node once: a machine-independent view; ``build(..., reference=True)``, with no node in common).
The last columns split the lowering by pass (µs per command, the pass and its verifier, the median of three more
lowerings of that graph: building the queue is not in them). The flatness line is the cost per command at the
largest size over that at 1k (the aim: at most 1.3, and at most 5 µs per command on every path). Part 2 prints how
many messages one submit sends on each path for 1, 100 and 1000 kernels (loops unrolled).
"""
from __future__ import annotations

import argparse

from mtlir.metal import DeviceSpec, Kernel, KernelParam
from mtlir.passes import lower
from mtlir.program.instructions import Call, End, Range
from mtlir.program.program import Program
from mtlir.frontend.nodes import buffer, timeline_value, view
from mtlir.frontend.queue import Queue
from mtlir.ir.uop import UOp, gc_paused

KERNELS = [Kernel(f"k{i}", f"k{i}", "", (KernelParam(None, 0), KernelParam(None, 1), KernelParam(None, 2),
                                        KernelParam("n", 3, "int32"))) for i in range(8)]
BUFFERS = [buffer(f"b{i}", 1 << 31) for i in range(16)]
OTHER_BUFFERS = [buffer(f"r{i}", 1 << 31) for i in range(16)]  # the reference graph's (reference=True)
N = UOp.variable("n", 1, 1 << 20)


def build(ncmds: int, device: DeviceSpec, timestamps: bool = False, signal_every: int = 0, *,
          reference: bool = False) -> UOp:
    """A queue of ``ncmds`` commands, every EXEC different (its own view offset), then a signal; ``timestamps``: a
    timestamp after every command (a profiled submit); ``signal_every``: a signal after every that many commands
    (a command buffer each). ``reference``: the same shape on other buffers, timestamp slots and signal values, so
    that no per-command node of it equals one of the measured queue: the graph the reference (``toposort``) walks
    stays alive while the measured queue is built, and an equal graph alive would let that build find its nodes in
    the intern table instead of making them (~20% cheaper than building a queue for the first time)."""
    q = Queue(device)
    bufs, shift = (OTHER_BUFFERS, ncmds) if reference else (BUFFERS, 0)
    with gc_paused():  # as docs/lowering.md advises for a large queue built in a loop
        for i in range(ncmds):
            out = view(bufs[i % 16], 256 * (i // 16 % 100_000), 4096)
            q.exec(KERNELS[i % 8], [out, bufs[(i + 1) % 16], bufs[(i + 5) % 16]], [N if i % 4 else 3],
                   grid=(1 + i % 7, 2), threadgroup=(32,))
            if timestamps:
                q.timestamp(i + shift)
            if signal_every and (i + 1) % signal_every == 0 and i + 1 < ncmds:
                q.signal(q.timeline, i + 1 + shift)
    q.signal(q.timeline, timeline_value())
    return q.submit()


# path -> (ICB support, timestamps, a signal every that many commands (0: none), the largest queue measured)
PATHS = {"icb": (True, False, 0, 10**9), "direct": (False, False, 0, 10**9), "icb+ts": (True, True, 0, 10**9),
         "direct+ts": (False, True, 0, 10**9), "icb+sig": (True, False, 2, 10**9)}


def messages(program: Program) -> int:
    """Messages one run of ``program`` sends, loops unrolled (their bounds are constants here)."""
    total, scale = 0, [1]
    for ins in program.instrs:
        match ins:
            case Range(bound=bound):
                scale.append(scale[-1] * int(program.consts[bound]))
            case End():
                scale.pop()
            case Call():
                total += scale[-1]
    return total


def pass_seconds(graph: UOp, runs: int = 3) -> dict[str, float]:
    """Seconds of each pass (and its verifier) of lowering ``graph``: the median of ``runs`` lowerings, the garbage
    collector off as in the timed rounds (one lowering alone moved by 30% between runs)."""
    import gc
    import statistics
    samples: dict[str, list[float]] = {}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(runs):
            for p in lower(graph, target="arm64", keep_stages=False).timings:
                samples.setdefault(p.name, []).append(p.seconds + p.verify_seconds)
    finally:
        if enabled:
            gc.enable()
    return {name: statistics.median(v) for name, v in samples.items()}


def cost_per_command(sizes: list[int], rounds: int, path: str = "icb") -> dict[int, float]:
    """Build and lower a queue of each size on ``path`` (``PATHS``); print and return the median µs per command."""
    from benchmarks.timing import interleaved, ratio
    icb, stamps, every, largest = PATHS[path]
    device = DeviceSpec("Apple7", residency_set=False, icb=icb)
    out: dict[int, float] = {}
    print(f"\n{path}:\n{'commands':>9} {'µs/command':>11} {'x toposort':>10}   one lowering by pass (µs/command)")
    for n in sizes:
        if n > largest:
            print(f"{n:>9} {'(skipped)':>11}")
            continue
        graph = build(n, device, stamps, every, reference=True)  # no node in common with the measured queue
        t = interleaved({"build+lower": lambda: lower(build(n, device, stamps, every), target="arm64",
                                                      keep_stages=False),
                         "toposort": graph.toposort}, 1, rounds)
        out[n] = t["build+lower"] / n * 1e6
        passes = "  ".join(f"{name} {sec / n * 1e6:.2f}" for name, sec in pass_seconds(graph).items())
        print(f"{n:>9} {out[n]:>11.2f} {ratio(t['build+lower'], t['toposort']):>10.1f}   {passes}")
        del graph
    if 1000 in out and len(out) > 1:
        top = max(out)
        print(f"flatness: cost per command at {top} / at 1000 = {out[top] / out[1000]:.2f}")
    return out


def messages_per_submit(counts: list[int]) -> None:
    """Print the messages one submit sends on the ICB and the direct path."""
    print(f"\n{'kernels':>8} {'ICB':>6} {'direct':>7}   (messages one submit sends, Apple7 without a residency set)")
    for n in counts:
        row = []
        for icb in (True, False):
            program = lower(build(n, DeviceSpec("Apple7", residency_set=False, icb=icb)), keep_stages=False).program
            row.append(messages(program))
        print(f"{n:>8} {row[0]:>6} {row[1]:>7}")


def main() -> None:
    """Run both parts (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="queue lengths, comma separated")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per size (the median counts; >= 7)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"paths to measure, comma separated ({', '.join(PATHS)})")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    for path in args.paths.split(","):
        if path not in PATHS:
            ap.error(f"unknown path {path!r}: expected one of {', '.join(PATHS)}")
        cost_per_command(sizes, args.rounds, path)
    messages_per_submit([1, 100, 1000])


if __name__ == "__main__":
    main()
