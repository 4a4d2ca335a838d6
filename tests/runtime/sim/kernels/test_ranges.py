"""An ICB range that ran without a fault is kept whole (``runtime/sim/ranges.py``) and run again without its
per-command checks, while nothing those checks read has changed; every change that would make a command fault or
run differently sends the range through the full checks again, which give the same fault as before keeping."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mtlir.metal import MTL
from mtlir.runtime.sim.executor import Executor
from mtlir.runtime.sim.kernels.launch import MAX_BATCH
from mtlir.runtime.sim.kernels.runner import KernelRunner
from simscene import Scene

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
MSL = HEAD + """
kernel void fill(device float* out, uint3 lid [[thread_position_in_threadgroup]]) { out[lid.x] = 7.0f; }
kernel void add1(device float* out, uint3 lid [[thread_position_in_threadgroup]]) { out[lid.x] += 1.0f; }
kernel void copy(device float* out, device const float* src, uint3 lid [[thread_position_in_threadgroup]]) {
  out[lid.x] = src[lid.x] * 2.0f;
}
"""


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    return KernelRunner()


def _scene(runner: KernelRunner, **kw: Any) -> Scene:
    s = Scene(strict=False, runner=runner, autorun=True, **kw)
    s.lib = s.send(s.device, "newLibraryWithSource:options:error:", s.m.string(MSL), 0, s.err)
    s.pipelines = {k: s.pipeline(k) for k in ("fill", "add1", "copy")}
    return s


@pytest.fixture
def scene(runner: KernelRunner) -> Iterator[Scene]:
    s = _scene(runner)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ICB commands that went through the full checks (``Executor._icb_command``), by index."""
    seen: list[int] = []
    real = Executor._icb_command

    def counting(self: Executor, cb: Any, enc: Any, ex: Any, i: int, slot: Any) -> None:
        seen.append(i)
        real(self, cb, enc, ex, i, slot)
    monkeypatch.setattr(Executor, "_icb_command", counting)
    return seen


def _run(s: Scene, icb: int, count: int, *use: int, warmup: tuple[str, ...] = ()) -> int:
    cb = s.submit_icb(icb, 0, count, use=use, warmup=warmup)
    s.send(cb, "waitUntilCompleted")
    return cb


def _chain(s: Scene) -> tuple[int, int, int]:
    """An ICB of three commands: fill a, copy a*2 into b, add 1 to b (barriers between); (icb, a, b)."""
    a, b = s.buffer(16), s.buffer(16)
    icb = s.icb(3, max_bind=2)
    s.command(icb, 0, "fill", [(a, 0)])
    s.command(icb, 1, "copy", [(b, 0), (a, 0)])
    s.command(icb, 2, "add1", [(b, 0)])
    return icb, a, b


def test_a_range_runs_again_kept_and_gives_the_same_result(scene: Scene, checked: list[int]) -> None:
    s = scene
    icb, a, b = _chain(s)
    for round_ in range(3):
        cb = _run(s, icb, 3, a, b)
        assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
        assert s.floats(b)[:4].tolist() == [15.0] * 4
        s.floats(b)[:4] = 0.0  # the host clears it: the next run must write it again
    assert sorted(checked) == [0, 1, 2]  # only the first run checked its commands
    assert (0, 3) in s.dev.object(icb).ranges  # type: ignore[attr-defined]
    assert s.dev.gpu.kernels_run == 9  # the kept runs count their dispatches too


def test_a_changed_command_takes_the_full_path_and_runs_as_changed(scene: Scene, checked: list[int]) -> None:
    s = scene
    icb, a, b = _chain(s)
    _run(s, icb, 3, a, b)
    _run(s, icb, 3, a, b)
    s.command(icb, 2, "fill", [(b, 0)])  # the version changes
    cb = _run(s, icb, 3, a, b)
    assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
    assert s.floats(b)[:4].tolist() == [7.0] * 4
    assert sorted(checked) == [0, 0, 1, 1, 2, 2]
    _run(s, icb, 3, a, b)  # kept again for the new version
    assert len(checked) == 6


def _release_b(s: Scene, a: int, b: int) -> tuple[int, ...]:
    s.send(b, "release")  # an ICB does not retain its commands' buffers (rule 14)
    return (a,)


def _b_not_used(s: Scene, a: int, b: int) -> tuple[int, ...]:
    return (a,)  # b not in useResources: (rule 10)


def _release_pipeline(s: Scene, a: int, b: int) -> tuple[int, ...]:
    s.send(s.pipelines["add1"], "release")  # the ICB does not retain it either
    return (a, b)


@pytest.mark.parametrize("change, text", [(_release_b, "was released"), (_b_not_used, "not resident"),
                                          (_release_pipeline, "was released")],
                         ids=["released buffer", "buffer no longer resident", "released pipeline"])
def test_a_change_after_a_kept_run_faults_as_without_keeping(scene: Scene, change: Any, text: str) -> None:
    s = scene
    icb, a, b = _chain(s)
    _run(s, icb, 3, a, b)
    _run(s, icb, 3, a, b)
    cb = _run(s, icb, 3, *change(s, a, b))
    assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorInvalidResource
    assert text in s.error_text(cb)


def test_a_lower_thread_limit_drops_the_dispatch(scene: Scene) -> None:
    s = scene
    icb, a, b = _chain(s)
    _run(s, icb, 3, a, b)
    _run(s, icb, 3, a, b)
    s.dev.set_max_total_threads(s.pipelines["add1"], 2)  # the 4-thread add1 is now over the limit: dropped (13)
    s.floats(b)[:4] = 0.0
    cb = _run(s, icb, 3, a, b)
    assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
    assert s.floats(b)[:4].tolist() == [14.0] * 4


def test_a_pipeline_not_warmed_up_faults_on_apple7(runner: KernelRunner) -> None:
    s = _scene(runner, family="Apple7")
    try:
        icb, a, b = _chain(s)
        warm = ("fill", "copy", "add1")
        for _ in range(2):
            cb = _run(s, icb, 3, a, b, warmup=warm)
            assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
        cb = _run(s, icb, 3, a, b, warmup=("fill", "copy"))  # add1 not bound by this encoder (rule 16)
        assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorInvalidResource
        assert "did not bind" in s.error_text(cb)
    finally:
        s.close()


def test_a_shuffled_order_is_never_kept(runner: KernelRunner, checked: list[int]) -> None:
    s = _scene(runner, order_seed=3)
    try:
        icb, a, b = _chain(s)
        for _ in range(2):
            cb = _run(s, icb, 3, a, b)
            assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
        assert len(checked) == 6 and not s.dev.object(icb).ranges  # type: ignore[attr-defined]
    finally:
        s.close()


def test_a_kept_range_longer_than_a_batch(scene: Scene, checked: list[int]) -> None:
    s, n = scene, MAX_BATCH + 6
    out = s.buffer(16 * n)
    icb = s.icb(n, max_bind=1)
    for i in range(n):  # command i adds 1 to its own 4 floats
        s.command(icb, i, "add1", [(out, 16 * i)], barrier=False)
    for round_ in (1, 2, 3):
        cb = _run(s, icb, n, out)
        assert s.status(cb) == MTL.StatusCompleted, s.error_text(cb)
        assert s.floats(out)[:4 * n].tolist() == [float(round_)] * (4 * n)
    assert len(checked) == n
