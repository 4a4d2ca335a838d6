"""mtlir's benchmarks as a package: ``python -m benchmarks`` (docs/performance.md, "Benchmarks").

Every figure is a ratio against a reference run interleaved with it in the same process (``benchmarks.timing``:
medians of at least 7 rounds, CPU time where the work is on the CPU), with the absolute numbers beside it. The
modules, each with one function returning its figures as a dict:

- ``compiler``: queue building + lowering per command, scaling, memory, messages per submit; graph_rewrite
  against a plain DFS and against tinygrad (on the queues and graphs of ``bench_lowering`` and ``bench_rewrite``);
- ``replay``: the Interpreter and the CompiledReplay against hand-written ctypes calls on the stand-in libobjc
  (``standin``); ``submit``: a submit's time as the queue grows (ICB path);
- ``sim``: the simulated device against plain pyopencl (``bench_dispatch``); ``simdgroup``: SIMD-group matrices
  against scalar loops on the simulated device;
- ``report``: the table, the JSON and the plot (``plot``).

The package is not installed with mtlir: run it from the repository root with the root on ``sys.path`` after the
installed package (``make bench`` does; docs/performance.md says how by hand).
"""
