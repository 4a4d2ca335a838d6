"""The layernorm_attn workload of examples/traces: ``layernorm(scaled_dot_product_attention(q, k, v))`` with q, k,
v 1x4x16x32 float32 (batch 1, 4 heads, 16 positions, 32 features; fixed seed); output 1x4x16x32. Record it:
``mtlir record examples/tinygrad/layernorm_attn.py -o layernorm_attn.json [--arch apple7]``; ``python
examples/tinygrad/layernorm_attn.py`` runs it."""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor


def main() -> Tensor:
    """The workload's output, 1x4x16x32 float32."""
    rng = np.random.default_rng(4)
    q, k, v = (Tensor(rng.standard_normal((1, 4, 16, 32), dtype=np.float32)) for _ in range(3))
    return q.scaled_dot_product_attention(k, v).layernorm()


if __name__ == "__main__":
    out = main().numpy()
    print(out.shape, float(out.sum()))
