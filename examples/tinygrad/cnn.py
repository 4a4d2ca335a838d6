"""The cnn workload of examples/traces: a two-layer MNIST-style CNN with log-softmax. x 4x1x28x28; conv 8x1x5x5,
relu, maxpool 2x2 (-> 4x8x12x12); conv 16x8x3x3, relu, maxpool 2x2 (-> 4x16x5x5); flatten, a 400x10 linear layer,
log_softmax; float32, no biases, fixed seed; output 4x10. Record it: ``mtlir record examples/tinygrad/cnn.py -o
cnn.json [--arch apple7]``; ``python examples/tinygrad/cnn.py`` runs it."""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor


def main() -> Tensor:
    """The workload's output, 4x10 float32 (log-probabilities)."""
    rng = np.random.default_rng(3)
    x = Tensor(rng.random((4, 1, 28, 28), dtype=np.float32))
    w1 = Tensor(rng.standard_normal((8, 1, 5, 5), dtype=np.float32) / 5)
    w2 = Tensor(rng.standard_normal((16, 8, 3, 3), dtype=np.float32) / 8)
    w3 = Tensor(rng.standard_normal((400, 10), dtype=np.float32) / 20)
    h = x.conv2d(w1).relu().max_pool2d(2)
    h = h.conv2d(w2).relu().max_pool2d(2)
    return (h.flatten(1) @ w3).log_softmax()


if __name__ == "__main__":
    out = main().numpy()
    print(out.shape, float(out.sum()))
