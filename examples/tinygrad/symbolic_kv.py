"""The symbolic_kv workload of examples/traces: attention of one query over the first ``start_pos`` rows of a
key/value cache, ``softmax(q @ cache[:n].T) @ cache[:n]`` with cache 32x16 and q 1x16 float32 (fixed seed), n the
run-time variable ``start_pos`` in [1, 32] bound to ``--start-pos`` (default 11): a kernel argument, and two grids
depend on it. Record it: ``mtlir record examples/tinygrad/symbolic_kv.py -o symbolic_kv.json [--start-pos N]
[--arch apple7]``; ``python examples/tinygrad/symbolic_kv.py`` runs it."""
from __future__ import annotations

import argparse

import numpy as np
from tinygrad import Tensor, Variable


def main() -> Tensor:
    """The workload's output, 1x16 float32."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--start-pos", type=int, default=11, help="rows of the cache attended to, 1 to 32 (default 11)")
    n = p.parse_args().start_pos
    rng = np.random.default_rng(5)
    cache = Tensor(rng.standard_normal((32, 16), dtype=np.float32)).realize()
    q = Tensor(rng.standard_normal((1, 16), dtype=np.float32)).realize()
    start_pos = Variable("start_pos", 1, 32).bind(n)
    kv = cache.shrink(((0, start_pos), None))
    return (q @ kv.T).softmax() @ kv


if __name__ == "__main__":
    out = main().numpy()
    print(out.shape, float(out.sum()))
