"""The barriers pass: a barrier on an ICB command only where it conflicts with a command since the last barrier
(read-after-write, write-after-read, write-after-write) on byte ranges of the base buffer; writes from the MSL
signature (``const device`` is read-only), every buffer written when the signature is unknown, buffer variables
overlapping everything; visible as a stage of its own."""
from __future__ import annotations

import io

import pytest

from mtlir.frontend.nodes import buffer, buffer_variable, timeline_value, view
from mtlir.frontend.queue import Queue
from mtlir.ir.uop import UOp
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj
from mtlir.passes import PASSES, Barriers, PassPipeline, default_pipeline, lower
from mtlir.passes.barriers import Access, command_accesses, place_barriers, written_indices
from mtlir.program.payloads import CommandList, IcbCommand, IcbSpec
from mtlir.program.program import Program


def _kernel(name: str, x: str = "const device", y: str = "device", elements: int | None = 64) -> Kernel:
    """``y[i] = f(x[i])``, with the address spaces given (``const device``: read-only)."""
    msl = f"kernel void {name}({x} float* x [[buffer(0)]], {y} float* y [[buffer(1)]], uint i [[thread_position_in_grid]])" \
          " { y[i] = x[i]; }"
    return Kernel(name, name, msl, (KernelParam(None, 0, "float32", elements), KernelParam(None, 1, "float32", elements)))


COPY = _kernel("copy")
BOTH = _kernel("both", x="device")                       # writes x too (no const)
OPAQUE = Kernel("opaque", "opaque", "", (KernelParam(None, 0, "float32"), KernelParam(None, 1, "float32")))
WHOLE = _kernel("whole", elements=None)                  # no elements: to the end of the buffer


def _barriers(*cmds: tuple[Kernel, UOp, UOp], device: DeviceSpec = DeviceSpec("Apple9")) -> list[bool]:
    q = Queue(device)
    for k, a, b in cmds:
        q.exec(k, [a, b], [], (2,), (32,))
    q.signal(q.timeline, timeline_value())
    return [c.barrier for c in _icb(lower(q.submit(), target="arm64").program).commands]


def _icb(p: Program) -> IcbSpec:
    (spec,) = [o.payload[0] for o in p.objects.values() if o.kind == "icb"]
    assert isinstance(spec, IcbSpec)
    return spec


X, Y, Z = buffer("x", 1024), buffer("y", 1024), buffer("z", 1024)


def test_independent_commands_share_a_group() -> None:
    assert _barriers((COPY, X, Y), (COPY, X, Z)) == [False, False]  # both only read x


def test_read_after_write_write_after_read_write_after_write() -> None:
    assert _barriers((COPY, X, Y), (COPY, Y, Z)) == [False, True]   # RAW on y
    assert _barriers((COPY, Y, Z), (COPY, X, Y)) == [False, True]   # WAR on y
    assert _barriers((COPY, X, Y), (COPY, Z, Y)) == [False, True]   # WAW on y


def test_byte_ranges_of_the_base_buffer_not_view_identity() -> None:
    lo, hi = view(Y, 0, 256), view(Y, 256, 256)
    assert _barriers((COPY, X, lo), (COPY, X, hi)) == [False, False]  # disjoint halves of y
    assert _barriers((COPY, X, lo), (COPY, hi, Z)) == [False, False]  # reads bytes 256.. of y, written 0..255
    assert _barriers((COPY, X, lo), (COPY, lo, Z)) == [False, True]   # another view node of the same bytes
    assert _barriers((COPY, X, view(Y, 0, 512)), (COPY, view(Y, 252, 256), Z)) == [False, True]  # 4 bytes overlap
    # a kernel without elements touches its view, offset + size
    assert _barriers((WHOLE, X, lo), (COPY, hi, Z)) == [False, False]
    assert _barriers((WHOLE, X, view(Y, 0, 260)), (COPY, hi, Z)) == [False, True]
    spec = IcbSpec(CommandList([IcbCommand("pipeline:whole", (("buffer:y", 0, 1),), (1, 1, 1), (1, 1, 1)),
                                IcbCommand("pipeline:whole", (("buffer:y", 256, 1),), (1, 1, 1), (1, 1, 1))]),
                   (Obj("pipeline", "pipeline:whole", (WHOLE,)),), (Obj("buffer", "buffer:y", (1024,)),), 2)
    # without extents (a hand-built IcbSpec) nor elements: to the end of the buffer, conservative
    assert [c.barrier for c in place_barriers(spec).commands] == [False, True]


def test_a_barrier_starts_a_new_group() -> None:
    # 0 writes y; 1 reads y (barrier); 2 writes z, which 0 and 1 never touch, but 1 read x... and 2 reads x: no
    # conflict with 1, so it joins 1's group; 3 reads z (written by 2 in the same group): barrier
    assert _barriers((COPY, X, Y), (COPY, Y, buffer("w", 1024)), (COPY, X, Z), (COPY, Z, buffer("v", 1024))) == [
        False, True, False, True]


def test_writes_come_from_the_msl_signature() -> None:
    assert written_indices(COPY) == frozenset({1}) and written_indices(BOTH) == frozenset({0, 1})
    assert written_indices(OPAQUE) is None
    assert _barriers((BOTH, X, Y), (COPY, X, Z)) == [False, True]    # both writes its x, copy reads it
    assert _barriers((OPAQUE, X, Y), (COPY, X, Z)) == [False, True]  # unknown: every buffer written


def test_buffer_variables_overlap_everything() -> None:
    inp = buffer_variable("inp")
    reader = _kernel("reader", y="const device")  # reads both, writes nothing
    assert _barriers((reader, inp, X), (reader, Y, Z)) == [False, False]  # reads never conflict
    assert _barriers((COPY, inp, Y), (COPY, X, Z)) == [False, True]   # the handle may be z, which 1 writes
    assert _barriers((COPY, X, Y), (COPY, inp, Z)) == [False, True]   # it may be y, which 0 writes


def test_access_conflicts() -> None:
    w, r = Access("buffer:y", 0, 8, True), Access("buffer:y", 4, 12, False)
    assert w.conflicts(r) and r.conflicts(w) and not r.conflicts(r)
    assert not w.conflicts(Access("buffer:y", 8, 16, True)) and not w.conflicts(Access("buffer:z", 0, 8, True))
    assert w.conflicts(Access("", 100, 200, False)) is False and w.conflicts(Access("", 0, 1 << 64, False))


def test_barriers_is_a_stage_of_the_default_pipeline() -> None:
    assert "barriers" in PASSES and str(PassPipeline.parse("encode,barriers,abi{target=arm64},linearize")) == \
        "encode,barriers,abi{target=arm64},linearize"
    assert str(default_pipeline("x86_64")) == "encode,barriers,abi{target=x86_64},linearize"
    direct = Queue(DeviceSpec("Apple9", icb=False)).exec(COPY, [X, Y], [], (2,), (32,)).submit()
    assert str(default_pipeline("arm64", direct)) == "encode,abi{target=arm64},linearize"  # no ICB, no barriers
    q = Queue(DeviceSpec("Apple9")).exec(COPY, [X, Y], [], (2,), (32,)).exec(COPY, [Y, Z], [], (2,), (32,))
    out = io.StringIO()
    lowered = lower(q.submit(), target="arm64", print_after_all=True, out=out)
    assert [n for n, _ in lowered.stages] == ["input", "encode", "barriers", "abi", "linearize"]
    assert not lowered.unchanged(2)
    assert "// -----// IR after barriers //----- //" in out.getvalue()
    # the pass runs once: after it, it has nothing left to do
    after = lowered.stages[2][1]
    assert isinstance(after, UOp) and Barriers().apply(after, None) is after  # type: ignore[arg-type]


@pytest.mark.parametrize("pipeline", ["encode,abi{target=arm64},linearize", None])
def test_without_the_pass_every_command_keeps_its_barrier(pipeline: str | None) -> None:
    q = Queue(DeviceSpec("Apple9")).exec(COPY, [X, Y], [], (2,), (32,)).exec(COPY, [X, Z], [], (2,), (32,))
    spec = _icb(lower(q.submit(), target="arm64", pipeline=pipeline).program)
    assert [c.barrier for c in spec.commands] == ([True, True] if pipeline else [False, False])


def test_the_pass_reads_each_command_as_command_accesses_does() -> None:
    """place_barriers reads a command through its kind's template (only the offsets per command): the same
    accesses as command_accesses, on views, whole buffers, kernels with and without elements, buffer variables."""
    from mtlir.passes.barriers import _accesses_of, _kernel_facts, _template
    inp = buffer_variable("barriers_in")
    q = Queue(DeviceSpec("Apple9"))
    cases = [(COPY, view(X, 256, 512), Y), (WHOLE, X, view(Z, 512, 256)), (OPAQUE, view(Y, 0, 64), Z),
             (BOTH, inp, view(X, 0, 1024)), (COPY, X, inp)]
    for k, a, b in cases:
        q.exec(k, [a, b], [], (2,), (32,))
    q.signal(q.timeline, timeline_value())
    spec = _icb(lower(q.submit(), target="arm64").program)
    kernels = {o.name: o.payload[0] for o in spec.pipelines}
    sizes = {o.name: int(o.payload[0]) for o in spec.buffers if o.payload and isinstance(o.payload[0], int)}
    assert len(spec.commands) == len(cases)
    for cmd in spec.commands:
        want = [tuple(a) for a in command_accesses(cmd, kernels[cmd.pipeline], sizes)]
        assert _accesses_of(cmd, _template(cmd.shape, _kernel_facts(kernels[cmd.pipeline]), sizes)) == want
