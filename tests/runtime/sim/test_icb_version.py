"""An ICB command rewritten with the values it has keeps the ICB's version (what is cached per version stays: the
range analysis of executeCommandsInBuffer:withRange:, the kept launches); any change bumps it."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from simscene import Scene


@pytest.fixture
def scene() -> Iterator[Scene]:
    s = Scene(strict=True)
    try:
        yield s
    finally:
        s.close()


def test_a_rewrite_with_the_same_values_keeps_the_version(scene: Scene) -> None:
    s = scene
    out, other = s.buffer(64), s.buffer(64)
    icb_handle = s.icb(2)
    icb = s.dev.object(icb_handle)
    cmd = s.command(icb_handle, 0, "fill", [(out, 0)])
    version = icb.version  # type: ignore[attr-defined]
    s.command(icb_handle, 0, "fill", [(out, 0)])  # the same pipeline, buffer, offset, sizes and barrier
    assert icb.version == version  # type: ignore[attr-defined]
    changes = [("setKernelBuffer:offset:atIndex:", other, 0, 0), ("setKernelBuffer:offset:atIndex:", other, 16, 0),
               ("setComputePipelineState:", s.pipelines["add1"]),
               ("concurrentDispatchThreadgroups:threadsPerThreadgroup:", (2, 1, 1), (4, 1, 1)),
               ("setKernelBuffer:offset:atIndex:", 0, 0, 0)]  # nil: the binding goes
    for selector, *args in changes:
        s.send(cmd, selector, *args)
        assert icb.version == version + 1, selector  # type: ignore[attr-defined]
        version += 1
        s.send(cmd, selector, *args)  # again: nothing changes
        assert icb.version == version, selector  # type: ignore[attr-defined]
    fresh = s.send(icb_handle, "indirectComputeCommandAtIndex:", 1)
    s.send(fresh, "setBarrier")
    assert icb.version == version + 1  # type: ignore[attr-defined]
    s.send(fresh, "setBarrier")
    assert icb.version == version + 1  # type: ignore[attr-defined]
