"""The mlp_deep workload of examples/traces: four identical 64x64 layers, ``x = relu(x @ w_i)`` for i = 1..4, x
16x64 float32 (fixed seed): one pipeline used by four dispatches. Record it: ``mtlir record
examples/tinygrad/mlp_deep.py -o mlp_deep.json [--arch apple7]``; ``python examples/tinygrad/mlp_deep.py`` runs it."""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor


def main() -> Tensor:
    """The workload's output, 16x64 float32."""
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((16, 64), dtype=np.float32))
    for _ in range(4):
        x = (x @ Tensor(rng.standard_normal((64, 64), dtype=np.float32) / 8)).relu()
    return x


if __name__ == "__main__":
    out = main().numpy()
    print(out.shape, float(out.sum()))
