"""mtlir's METAL device for tinygrad: eager calls, views at offsets, TinyJit replay (one ICB submit per call), a
symbolic JIT, and the DeviceContext under it (shared objects, handles that name their device)."""
from __future__ import annotations

import numpy as np
import pytest
from tinygrad import Device, Tensor, TinyJit, Variable

from mtlir.errors import MtlirError
from mtlir.runtime.context import ContextError, DeviceContext
from mtlir.runtime.sim.device import SimDevice
from mtlir.tinygrad.device import MetalDevice
from mtlir.tinygrad.graph import MtlirGraph


def test_the_metal_device_is_mtlirs() -> None:
    dev = Device["METAL"]
    assert isinstance(dev, MetalDevice)
    assert (Tensor([1, 2, 3], device="METAL") + 1).tolist() == [2, 3, 4]


def test_eager_calls_replay_one_lowering_per_program() -> None:
    dev = Device["METAL"]
    a = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8)).realize()
    before = dev.eager_calls
    out = [((a * k) + 1).sum(axis=1).numpy() for k in (1.0, 2.0, 3.0)]
    for k, got in zip((1.0, 2.0, 3.0), out):
        np.testing.assert_allclose(got, (np.arange(64, dtype=np.float32).reshape(8, 8) * k + 1).sum(axis=1))
    assert dev.eager_calls > before


def test_views_at_byte_offsets() -> None:
    base = Tensor(np.arange(32, dtype=np.float32)).realize()
    got = (base[8:16] + base[16:24]).numpy()
    np.testing.assert_array_equal(got, np.arange(8, 16) + np.arange(16, 24))
    got2 = (base.reshape(4, 8)[1:3, 2:6] * 2).numpy()
    np.testing.assert_array_equal(got2, np.arange(32, dtype=np.float32).reshape(4, 8)[1:3, 2:6] * 2)


def test_tinyjit_replays_one_icb_submit_per_call() -> None:
    w = Tensor(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        h = (x @ w).relu().contiguous()
        return (h.sum(axis=1) * 2 + h.max(axis=1)).realize()

    rng = np.random.default_rng(1)
    lowered, replays = MtlirGraph.lowered, MtlirGraph.replays
    for _ in range(6):
        xs = rng.standard_normal((4, 16)).astype(np.float32)
        got = step(Tensor(xs)).numpy()
        h = np.maximum(xs @ w.numpy(), 0)
        np.testing.assert_allclose(got, h.sum(axis=1) * 2 + h.max(axis=1), rtol=1e-4, atol=1e-4)
    assert MtlirGraph.lowered - lowered == 1  # lowered once ...
    assert MtlirGraph.replays - replays >= 3  # ... replayed per call once captured


def test_symbolic_jit_rebinds_the_variable_per_call() -> None:
    cache = Tensor(np.arange(64, dtype=np.float32).reshape(16, 4)).realize()

    @TinyJit
    def head(n: Variable) -> Tensor:
        return cache[:n].sum(axis=0).realize()

    for n in (3, 5, 7, 9, 16):
        v = Variable("n", 1, 16).bind(n)
        got = head(v).numpy()
        np.testing.assert_allclose(got, np.arange(64, dtype=np.float32).reshape(16, 4)[:n].sum(axis=0))


def test_a_handle_names_its_device() -> None:
    with SimDevice(family="Apple9") as sim_a, SimDevice(family="Apple9") as sim_b, \
            DeviceContext(sim_a, name="A") as a, DeviceContext(sim_b, name="B") as b:
        buf = a.alloc(64)
        with pytest.raises(ContextError, match="belongs to device A, not to B"):
            b.write(buf, b"\x00" * 8)
        a.free(buf)
        with pytest.raises(ContextError, match="was freed"):
            a.read(buf)
        assert issubclass(ContextError, MtlirError)
        with pytest.raises(ValueError, match="outside"):
            a.write(a.alloc(8), b"\x00" * 16)
