"""The conv workload of examples/traces: ``mean(maxpool2x2(relu(conv2d(x, w, padding=1))), spatial)`` with x
2x3x16x16 and w 8x3x3x3 float32 (fixed seed); output 2x8. Record it: ``mtlir record examples/tinygrad/conv.py -o
conv.json [--arch apple7]``; ``python examples/tinygrad/conv.py`` runs it."""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor


def main() -> Tensor:
    """The workload's output, 2x8 float32."""
    rng = np.random.default_rng(2)
    x = Tensor(rng.standard_normal((2, 3, 16, 16), dtype=np.float32))
    w = Tensor(rng.standard_normal((8, 3, 3, 3), dtype=np.float32) / 5)
    return x.conv2d(w, padding=1).relu().max_pool2d(2).mean(axis=(2, 3))


if __name__ == "__main__":
    out = main().numpy()
    print(out.shape, float(out.sum()))
