"""The mlp workload of examples/traces: ``softmax(relu(x @ w1) @ w2)`` with x 8x64, w1 64x128, w2 128x10 (float32,
fixed seed). Record it: ``mtlir record examples/tinygrad/mlp.py -o mlp.json [--arch apple7]``; run it alone:
``python examples/tinygrad/mlp.py`` (prints the output's shape and sum on tinygrad's default device)."""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor


def main() -> Tensor:
    """The workload's output, 8x10 float32 (each row sums to 1)."""
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((8, 64), dtype=np.float32))
    w1 = Tensor(rng.standard_normal((64, 128), dtype=np.float32) / 8)
    w2 = Tensor(rng.standard_normal((128, 10), dtype=np.float32) / 11)
    return (x @ w1).relu().matmul(w2).softmax()


if __name__ == "__main__":
    out = main().numpy()
    print(out.shape, float(out.sum()))
