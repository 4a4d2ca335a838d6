"""What keeps an object alive while a command buffer is in flight (docs/simulator.md, "Object lifetimes"): each
object kind (buffer, pipeline, the ICB) x how the command buffer reaches it (encoded directly, referenced only from
ICB commands, the ICB itself) x mode (strict, faithful). A command buffer made by ``commandBuffer`` retains what is
encoded into it directly, so releasing that in flight is deferred in both modes; an ICB retains nothing its commands
reference, so releasing the last reference to such a buffer or pipeline in flight is a use-after-free: refused at the
call in strict mode, InvalidResource (9) in faithful mode."""
from __future__ import annotations


import pytest

from mtlir.errors import BridgeError, MetalValidationError
from mtlir.metal import MTL
from simscene import MODES, Scene, scene, scenes  # noqa: F401  (scenes: a fixture)

def alive(s: Scene, handle: int) -> bool:
    try:
        s.dev.object(handle)
    except BridgeError as e:
        assert "deallocated instance" in str(e)
        return False
    return True


def direct_copy(s: Scene, pipeline: int, dst: int, src: int) -> int:
    """A committed, retained command buffer with one direct dispatch of ``copy`` (dst <- src, 4 elements)."""
    cb = s.send(s.queue, "commandBuffer")
    s.send(cb, "retain")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "setComputePipelineState:", pipeline)
    s.send(enc, "setBuffer:offset:atIndex:", dst, 0, 0)
    s.send(enc, "setBuffer:offset:atIndex:", src, 0, 1)
    s.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (4, 1, 1))
    s.send(enc, "endEncoding")
    s.send(cb, "commit")
    return int(cb)


def source(s: Scene) -> int:
    src = s.buffer(64)
    s.floats(src)[:4] = [1.0, 2.0, 3.0, 4.0]
    return src


# ---------------------------------------------------------------------------- encoded directly: deferred
@pytest.mark.parametrize("strict", MODES)
def test_buffer_encoded_directly_lives_until_the_command_buffer_completes(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    dst, src = s.buffer(64), source(s)
    cb = direct_copy(s, s.pipelines["copy"], dst, src)
    s.send(src, "release")  # the caller's last reference: Metal defers the free to the command buffer's completion
    assert alive(s, src) and s.status(cb) == MTL.StatusCommitted
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and s.error_code(cb) == 0
    assert list(s.floats(dst)[:4]) == [1.0, 2.0, 3.0, 4.0]  # the kernel read the bytes of the released buffer
    assert not alive(s, src)  # freed when the command buffer let go of it


@pytest.mark.parametrize("strict", MODES)
def test_pipeline_encoded_directly_lives_until_the_command_buffer_completes(scenes: list[Scene],
                                                                            strict: bool) -> None:
    s = scene(scenes, strict)
    pipeline = s.pipeline("copy")
    dst, src = s.buffer(64), source(s)
    cb = direct_copy(s, pipeline, dst, src)
    s.send(pipeline, "release")
    assert alive(s, pipeline)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and s.error_code(cb) == 0
    assert list(s.floats(dst)[:4]) == [1.0, 2.0, 3.0, 4.0]
    assert not alive(s, pipeline)


@pytest.mark.parametrize("strict", MODES)
def test_the_icb_itself_lives_until_the_command_buffer_completes(scenes: list[Scene], strict: bool) -> None:
    s = scene(scenes, strict)
    out, var = s.buffer(64), s.buffer(256)
    s.set_int(var, 0, 7)
    icb = s.icb(1)
    s.send(s.command(icb, 0, "fill", [(out, 0), (var, 0)]), "release")  # the command view is not needed
    s.residency(out, var)
    cb = s.submit_icb(icb, 0, 1)
    s.send(icb, "release")  # encoded directly with executeCommandsInBuffer:withRange:: retained
    assert alive(s, icb)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and s.error_code(cb) == 0
    assert (s.floats(out)[:4] == 7).all()
    assert not alive(s, icb)


@pytest.mark.parametrize("strict", MODES)
def test_icb_pipeline_bound_for_the_warm_up_is_encoded_directly(scenes: list[Scene], strict: bool) -> None:
    """Before Apple9 the encoder binds each ICB pipeline with setComputePipelineState: first (rule 16): that binding
    is a direct encoding, so the command buffer keeps the pipeline alive."""
    s = scene(scenes, strict, family="Apple7")
    pipeline = s.pipeline("fill")
    out, var = s.buffer(64), s.buffer(256)
    s.set_int(var, 0, 5)
    icb = s.icb(1)
    cmd = s.command(icb, 0, None, [(out, 0), (var, 0)])
    s.send(cmd, "setComputePipelineState:", pipeline)
    s.residency(out, var)
    cb = s.send(s.queue, "commandBuffer")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "setComputePipelineState:", pipeline)
    s.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (0, 0, 0), (0, 0, 0))
    s.send(enc, "executeCommandsInBuffer:withRange:", icb, (0, 1))
    s.send(enc, "endEncoding")
    s.send(cb, "commit")
    s.send(pipeline, "release")
    s.dev.run_until_idle()
    assert (s.floats(out)[:4] == 5).all() and not alive(s, pipeline)


def test_a_command_buffer_released_uncommitted_lets_go_of_what_it_holds(scenes: list[Scene]) -> None:
    s = scene(scenes, True)
    buf = s.buffer(64)
    pool = s.m.push()
    cb = s.send(s.queue, "commandBuffer")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "setBuffer:offset:atIndex:", buf, 0, 0)
    s.send(enc, "endEncoding")
    s.send(buf, "release")
    assert alive(s, buf)  # the uncommitted command buffer holds it
    s.m.pop(pool)  # the command buffer is deallocated, never committed
    assert not alive(s, buf)


# ---------------------------------------------------------------------------- referenced only from ICB commands
def icb_only(s: Scene, *, use: bool = False) -> tuple[int, int, int, int]:
    """A committed command buffer executing one ``fill`` ICB command on its own ``out``/``var`` buffers and its own
    pipeline, made resident by a residency set (or, with ``use``, by useResources:count:usage:) and bound nowhere
    else; (command buffer, out, var, pipeline). Apple9: no warm-up binds the pipeline on the encoder."""
    pipeline = s.pipeline("fill")
    out, var = s.buffer(64), s.buffer(256)
    s.set_int(var, 0, 9)
    icb = s.icb(1)
    cmd = s.command(icb, 0, None, [(out, 0), (var, 0)])
    s.send(cmd, "setComputePipelineState:", pipeline)
    if not use:
        s.residency(out, var)
    return s.submit_icb(icb, 0, 1, use=(out, var) if use else ()), out, var, pipeline


@pytest.mark.parametrize("use", [False, True], ids=["residency-set", "useResources"])
@pytest.mark.parametrize("kind", ["buffer", "pipeline"])
def test_strict_refuses_the_release_of_what_only_an_icb_references(scenes: list[Scene], kind: str,
                                                                   use: bool) -> None:
    s = scene(scenes, True)
    cb, out, _, pipeline = icb_only(s, use=use)
    obj = out if kind == "buffer" else pipeline
    cls = "MTLBuffer" if kind == "buffer" else "MTLComputePipelineState"
    with pytest.raises(MetalValidationError, match=rf"release: {cls} {obj:#x}.* is deallocated while MTLCommandBuffer "
                                                   rf"{cb:#x} \(Committed\) executes ICB command 0 of "
                                                   rf"MTLIndirectCommandBuffer .*: an indirect command buffer does "
                                                   rf"not retain the {kind}s its commands reference.*error 9 "
                                                   r"\(InvalidResource\).*rule 14"):
        s.send(obj, "release")
    assert alive(s, obj)  # refused: nothing changed
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusCompleted and (s.floats(out)[:4] == 9).all()
    s.send(obj, "release")  # completed: now it is fine
    assert not alive(s, obj)


@pytest.mark.parametrize("kind", ["buffer", "pipeline"])
def test_faithful_fails_the_command_buffer_that_reaches_a_freed_object(scenes: list[Scene], kind: str) -> None:
    s = scene(scenes, False)
    cb, out, _, pipeline = icb_only(s)
    obj = out if kind == "buffer" else pipeline
    s.send(obj, "release")  # Metal without the validation layer: freed at once
    assert not alive(s, obj)
    s.dev.run_until_idle()
    assert s.status(cb) == MTL.StatusError and s.error_code(cb) == MTL.ErrorInvalidResource
    text = s.error_text(cb)
    assert "Invalid Resource" in text and "was released" in text and "rule 14" in text


@pytest.mark.parametrize("strict", MODES)
def test_the_last_reference_dropped_by_a_command_buffer(scenes: list[Scene], strict: bool) -> None:
    """A buffer bound directly in one command buffer and reached only through the ICB by a later one: the caller's
    release is deferred to the first one's completion, and then frees what the second still reaches. Nothing can
    refuse that call: the second command buffer fails with InvalidResource, and strict mode raises the validation
    error at the host's next call."""
    s = scene(scenes, strict)
    out, var = s.buffer(64), s.buffer(256)
    s.set_int(var, 0, 3)
    first = direct_copy(s, s.pipelines["copy"], s.buffer(64), out)
    icb = s.icb(1)
    s.command(icb, 0, "fill", [(out, 0), (var, 0)])
    s.residency(out, var)
    second = s.submit_icb(icb, 0, 1)
    s.send(out, "release")  # deferred: the first command buffer holds it
    assert alive(s, out)
    s.dev.run_until_idle()
    if strict:
        with pytest.raises(MetalValidationError, match=r"the release of its references by MTLCommandBuffer "
                                                       rf"{first:#x}: MTLBuffer {out:#x} is deallocated while "
                                                       rf"MTLCommandBuffer {second:#x}.*rule 14"):
            s.status(first)  # the host's next call to the device
    assert s.status(first) == MTL.StatusCompleted
    assert s.status(second) == MTL.StatusError and s.error_code(second) == MTL.ErrorInvalidResource
    assert not alive(s, out)


def test_a_command_buffer_gone_leaves_no_reference_cycle() -> None:
    """Its encoders point back at it (``Encoder.cb``): once its last reference goes (the Session's release at the
    wait, the autorelease pool's pop), refcounting frees them all, not the cyclic garbage collector (each submit
    left 14 objects in cycles before)."""
    import gc

    from progbuild import submit_program

    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    from mtlir.runtime.sim.objects import CommandBuffer, Encoder
    with SimDevice("x86_64", family="Apple7") as dev, Session(submit_program("x86_64", family="Apple7"), dev) as s:
        s.submit(n=8)
        s.wait()
        gc.collect()
        gc.disable()
        try:
            for n in (8, 13, 8):
                s.submit(n=n)
                s.wait()
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            cyclic = [type(o).__name__ for o in gc.garbage if isinstance(o, (CommandBuffer, Encoder))]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert cyclic == []
