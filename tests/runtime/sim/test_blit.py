"""The blit command encoder on the simulated device (issue 17): copyFromBuffer:sourceOffset:toBuffer:
destinationOffset:size: and fillBuffer:range:value: run in order with fences and compute work; strict mode refuses
offsets and sizes that are not multiples of 4 (macOS) or run past a buffer; a compute selector on a blit encoder is
an unrecognized selector."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from mtlir.errors import BridgeError, MetalValidationError
from mtlir.metal import MTL
from simscene import Scene


@pytest.fixture
def s() -> Iterator[Scene]:
    scene = Scene()
    yield scene
    scene.close()


def test_copy_and_fill_run_in_encoding_order(s: Scene) -> None:
    a, b = s.buffer(64), s.buffer(64)
    s.dev.write(s.contents(a), np.arange(16, dtype=np.float32).tobytes())
    cb = s.send(s.queue, "commandBuffer")
    blit = s.send(cb, "blitCommandEncoder")
    s.send(blit, "fillBuffer:range:value:", b, (0, 64), 0xFF)
    s.send(blit, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", a, 16, b, 0, 32)
    s.send(blit, "updateFence:", s.fence)
    s.send(blit, "endEncoding")
    s.send(cb, "commit")
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted
    got = np.frombuffer(s.dev.read(s.contents(b), 64), np.uint8)
    assert (got[:32].view(np.float32) == np.arange(4, 12)).all() and (got[32:] == 0xFF).all()


def test_strict_refuses_unaligned_or_outside_ranges(s: Scene) -> None:
    a, b = s.buffer(64), s.buffer(64)
    cb = s.send(s.queue, "commandBuffer")
    blit = s.send(cb, "blitCommandEncoder")
    with pytest.raises(MetalValidationError, match=r"source: offset 2 and size 8 must be multiples of 4"):
        s.send(blit, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", a, 2, b, 0, 8)
    with pytest.raises(MetalValidationError, match=r"range: bytes \[32, 96\) run past the end of MTLBuffer"):
        s.send(blit, "fillBuffer:range:value:", b, (32, 64), 1)
    with pytest.raises(BridgeError, match=r"-\[MTLBlitCommandEncoder setComputePipelineState:\]: unrecognized "
                                          r"selector"):
        s.send(blit, "setComputePipelineState:", s.pipelines["fill"])
    with pytest.raises(MetalValidationError, match="A command encoder is already encoding"):
        s.send(cb, "computeCommandEncoder")


def test_a_copy_between_overlapping_ranges_of_one_buffer() -> None:
    """Metal leaves it undefined (Metal Programming Guide, "Copying Data Between Two Buffers"): strict refuses the
    message naming both ranges; faithful copies as if through a temporary (a memmove). Adjacent ranges are fine."""
    for strict in (True, False):
        s = Scene(strict=strict)
        try:
            b = s.buffer(64)
            s.dev.write(s.contents(b), np.arange(16, dtype=np.float32).tobytes())
            cb = s.send(s.queue, "commandBuffer")
            blit = s.send(cb, "blitCommandEncoder")
            s.send(blit, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", b, 0, b, 32, 32)
            if strict:
                with pytest.raises(MetalValidationError, match=r"source bytes \[0, 32\) and destination bytes "
                                                               r"\[16, 48\) of MTLBuffer .* overlap"):
                    s.send(blit, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", b, 0, b, 16, 32)
                s.send(blit, "endEncoding")
                s.send(cb, "commit")
                s.dev.run_until_idle()
                got = np.frombuffer(s.dev.read(s.contents(b), 64), np.float32)
                assert (got == np.r_[np.arange(8), np.arange(8)]).all()
                continue
            s.send(blit, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", b, 0, b, 16, 32)
            s.send(blit, "endEncoding")
            s.send(cb, "commit")
            s.dev.run_until_idle()
            got = np.frombuffer(s.dev.read(s.contents(b), 64), np.float32)
            # [0, 32) -> [32, 64): 0..7 twice; then [0, 32) -> [16, 48) from a snapshot: 0..3, 0..7, 4..7
            assert (got == np.r_[np.arange(4), np.arange(8), np.arange(4, 8)]).all()
        finally:
            s.close()
