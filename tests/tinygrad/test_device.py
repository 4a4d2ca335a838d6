"""mtlir's METAL device for tinygrad: eager calls, views at offsets, TinyJit replay (one ICB submit per call), a
symbolic JIT, and the DeviceContext under it (shared objects, handles that name their device)."""
from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
from tinygrad import Device, Tensor, TinyJit, Variable, dtypes

from mtlir.errors import MtlirError
from mtlir.runtime.context import ContextError, DeviceContext
from mtlir.runtime.sim.device import SimDevice
from mtlir.tinygrad.device import MetalDevice, MetalProgram
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


def test_a_threadgroup_of_no_thread_is_refused_naming_it() -> None:
    from tinygrad.engine.realize import runtime_cache
    (Tensor([1.0, 2.0, 3.0]) * 7).realize()
    prg = cast(MetalProgram, list(runtime_cache.values())[-1])
    with pytest.raises(RuntimeError, match=r"local size \(0, 1, 1\): a threadgroup has at least 1 thread"):
        prg(global_size=(1, 1, 1), local_size=(0, 1, 1), wait=True)


def test_views_at_byte_offsets() -> None:
    base = Tensor(np.arange(32, dtype=np.float32)).realize()
    got = (base[8:16] + base[16:24]).numpy()
    np.testing.assert_array_equal(got, np.arange(8, 16) + np.arange(16, 24))
    got2 = (base.reshape(4, 8)[1:3, 2:6] * 2).numpy()
    np.testing.assert_array_equal(got2, np.arange(32, dtype=np.float32).reshape(4, 8)[1:3, 2:6] * 2)


def _add_program() -> tuple[MetalProgram, tuple[tuple[int, ...], tuple[int, ...]]]:
    """The MetalProgram of an 8-element float add, and its launch (global, local)."""
    from tinygrad.engine.realize import runtime_cache
    (Tensor.empty(8, device="METAL") + Tensor.empty(8, device="METAL")).realize()
    prg = list(runtime_cache.values())[-1]
    assert isinstance(prg, MetalProgram)
    return prg, prg.last_launch


def _source_and_out() -> tuple[Any, np.ndarray, Any, Any]:
    """The METAL allocator, 64 floats 0..63, a buffer holding them and an output buffer of the same size."""
    alloc = Device["METAL"].allocator
    data = np.arange(64, dtype=np.float32)
    src, out = alloc.alloc(data.nbytes), alloc.alloc(data.nbytes)
    alloc._copyin(src, memoryview(data.tobytes()))
    return alloc, data, src, out


def test_eager_view_offsets_are_bound_per_call_one_lowering() -> None:
    prg, (gsize, local) = _add_program()
    alloc, data, src, out = _source_and_out()
    lowered = len(prg.sessions)
    for k in (0, 8, 24, 40, 7):  # each a view at another byte offset: a new offset is no new Program
        a, b = alloc._offset(src, 32, 4 * k), alloc._offset(src, 32, 4 * (k + 1))
        o = alloc._offset(out, 32, 4 * (56 - k))
        prg(o, a, b, global_size=gsize, local_size=local, wait=True)
        got = np.empty(8, np.float32)
        alloc._copyout(memoryview(got).cast("B"), o)
        np.testing.assert_array_equal(got, data[k:k + 8] + data[k + 1:k + 9])
    assert len(prg.sessions) - lowered <= 1


def test_calls_without_a_wait_alternate_a_ring_of_two_sessions() -> None:
    prg, (gsize, local) = _add_program()
    alloc, data, src, out = _source_and_out()
    for k in range(8):  # no wait between the calls: each writes its own 8 outputs
        prg(alloc._offset(out, 32, 32 * k), alloc._offset(src, 32, 32 * k), alloc._offset(src, 32, 32 * (7 - k)),
            global_size=gsize, local_size=local)
    (ring,) = prg.sessions.values()
    assert len(ring.sessions) == 2 and all(s.inflight for s in ring.sessions)  # the second linked, both in use
    got = np.empty(64, np.float32)
    alloc._copyout(memoryview(got).cast("B"), out)
    np.testing.assert_array_equal(got, data + data.reshape(8, 8)[::-1].reshape(64))


@pytest.mark.parametrize("off, match", [(2, "not a multiple of 4"), (256, r"must be < \[buffer length\]")])
def test_a_bad_view_offset_gets_metals_error(off: int, match: str) -> None:
    from mtlir.errors import MetalValidationError
    from mtlir.tinygrad.device import MetalBuffer
    prg, (gsize, local) = _add_program()
    buf = Device["METAL"].allocator.alloc(256)
    view = MetalBuffer(buf.buf, 32, off)  # what no tinygrad view is: misaligned, or at the buffer's end
    with pytest.raises(MetalValidationError, match=match):
        prg(buf, view, buf, global_size=gsize, local_size=local, wait=True)


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


def test_a_long_variable_holds_values_beyond_32_bits() -> None:
    # tinygrad renders a long Variable as a `constant long&` parameter and its Metal runtime gives the value in 8
    # bytes: the eager call must take 2**35 (it was bounded to int32 and refused), negative ones too
    for value in (2**35 + 7, -(2**33) - 1, 5):
        v = Variable("big", -(2**40), 2**40, dtype=dtypes.long).bind(value)
        assert Tensor(v).clone("METAL").item() == value


def test_a_long_variable_in_a_jit_batch_is_rebound_per_call() -> None:
    @TinyJit
    def f(a: Variable, b: Variable) -> Tensor:
        x = (Tensor(a + b).clone("METAL") * 2).contiguous()
        return (x + 1).realize()

    lowered = MtlirGraph.lowered
    for i in range(5):
        a = Variable("a", 0, 2**10, dtype=dtypes.int).bind(i)
        b = Variable("b", 0, 2**40, dtype=dtypes.long).bind(2**35)
        assert f(a, b).item() == (2**35 + i) * 2 + 1
    assert MtlirGraph.lowered > lowered  # the batch ran as an MtlirGraph


def test_a_jit_batch_on_metal_1_runs_on_metal_1s_context() -> None:
    # tinygrad's GraphRunner names a METAL:1 batch's device "METAL" (it drops the ":1"); the graph used METAL's
    # DeviceContext, which knows none of METAL:1's buffers (ContextError at the first capture). Found by tinygrad's
    # own test_jit.py (TestJitGraphSplit.test_jit_multidev) run on mtlir.
    other = f"{Device.DEFAULT}:1"

    @TinyJit
    def twice(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        x = ((a + 1).contiguous().realize() * 2).contiguous().realize()
        y = ((b - 1).contiguous().realize() * 3).contiguous().realize()
        return x, y

    rng = np.random.default_rng(7)
    for _ in range(4):
        an, bn = (rng.standard_normal((6, 5)).astype(np.float32) for _ in range(2))
        x, y = twice(Tensor(an).realize(), Tensor(bn, device=other).realize())
        np.testing.assert_allclose(x.numpy(), (an + 1) * 2, rtol=1e-6)
        np.testing.assert_allclose(y.numpy(), (bn - 1) * 3, rtol=1e-6)
    graphs = [si for si in twice.captured.linear.src]
    assert len(graphs) == 2  # one batch per device, each replayed as one ICB submit
    assert cast(MetalDevice, Device[other]).ctx is not cast(MetalDevice, Device[Device.DEFAULT]).ctx


def test_bfloat16_tensors_run_with_metals_rounding() -> None:
    """tinygrad's bfloat16 kernels (``device bfloat*`` parameters) were refused: mtlir had no bfloat16 dtype. Each
    bfloat operation is rounded to bfloat16 as Metal's ALU does (the translator's software bfloat): the result
    equals a numpy model that rounds after every operation (ml_dtypes' bfloat16), eager and in a TinyJit."""
    import ml_dtypes
    bf = ml_dtypes.bfloat16
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    a, b = Tensor(x).cast("bfloat16"), Tensor(y).cast("bfloat16")
    got = (a * b + a).float().numpy()
    xb, yb = x.astype(bf), y.astype(bf)
    np.testing.assert_array_equal(got, ((xb * yb).astype(bf) + xb).astype(bf).astype(np.float32))

    @TinyJit
    def f(t: Tensor) -> Tensor:
        return (t * 3 - 1).realize()

    for i in range(4):
        t = (x[:64] + i).astype(bf)
        got = f(Tensor(x[:64] + i).cast("bfloat16")).float().numpy()
        np.testing.assert_array_equal(got, ((t * bf(3)).astype(bf) - bf(1)).astype(bf).astype(np.float32))


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
