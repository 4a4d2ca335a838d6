"""The whole pipeline on the simulated device: every Apple7 trace of examples/traces runs and matches, on both
targets and both executors; symbolic_kv replayed for start_pos = 1..32 from one lowering and one link matches
numpy; a hand-written Program links and runs on the SimDevice."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from progbuild import submit_program

from mtlir.cli.lower import lower_trace
from mtlir.metal import DeviceSpec
from mtlir.runtime.session import Session
from mtlir.runtime.sim.device import SimDevice
from mtlir.frontend.trace import Trace, load_trace

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
APPLE7 = sorted(TRACES.glob("*.apple7.json"))


def _sim(target: str, device: DeviceSpec, **kw: object) -> object:
    return SimDevice(target, family=device.family, residency_sets=device.residency_set, icb=device.icb, **kw)


def _output(s: Session, trace: Trace) -> np.ndarray:
    o = trace.output
    return np.frombuffer(s.read(o.placeholder, o.offset, o.nbytes), dtype=np.float32).reshape(o.shape)


def _check(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", APPLE7, ids=lambda p: p.name.split(".")[0])
def test_every_apple7_trace_matches(path: Path) -> None:
    trace = load_trace(path)
    device = trace.device()
    # both ABIs (the simulated device decodes either); the two executors split between them
    for target, executor in (("x86_64", "compiled"), ("arm64", "interpreter")):
        program = lower_trace(trace, device, target, keep_stages=False).program
        with _sim(target, device) as dev, Session(program, dev, initial=trace.initial_data(),
                                                  executor=executor, timeout_s=60) as s:
            s.submit(**trace.values)
            s.submit(**trace.values)  # a replay reads the same inputs and writes the same output
            done = s.wait(timeout_s=60)
            assert [r.value for r in done] == [2] and s.timeline_value() == 2
            assert all(0 < b <= e for b, e in done[0].gpu_times)
            _check(_output(s, trace), trace.output.expected_array())


def _attention(cache: np.ndarray, q: np.ndarray, n: int) -> np.ndarray:
    s = (q.astype(np.float64) @ cache[:n].astype(np.float64).T)
    p = np.exp(s - s.max())
    return (p / p.sum()) @ cache[:n].astype(np.float64)


@pytest.mark.parametrize("target", ["x86_64", "arm64"])
def test_symbolic_kv_replayed_for_every_start_pos(target: str) -> None:
    trace = load_trace(TRACES / "symbolic_kv.apple7.json")
    init = trace.initial_data()
    cache = np.frombuffer(init["buffer:1"], dtype=np.float32).reshape(32, 16)
    q = np.frombuffer(init["buffer:2"], dtype=np.float32).reshape(1, 16)
    program = lower_trace(trace, trace.device(), target, keep_stages=False).program  # ONE lowering
    lo, hi = program.variables["start_pos"][1:]
    assert (lo, hi) == (1, 32)
    with _sim(target, trace.device()) as dev, Session(program, dev, initial=init, timeout_s=60) as s:  # ONE link
        # every kernel overwrites what a later one reads (intermediates in buffer 3, output in 8), so nothing is
        # reset between submits: a stale intermediate would show up as a mismatch at a smaller start_pos
        for n in list(range(1, 33)) + [11, 3]:
            s.submit(start_pos=n)
            s.wait(timeout_s=60)
            _check(_output(s, trace), _attention(cache, q, n))
        assert s.submits == 34 and s.last_value == 34


def test_hand_written_program_on_the_sim() -> None:
    prog = submit_program("x86_64", kernels=2, family="Apple7", residency_set=False)
    x = np.arange(64, dtype=np.float32)
    with _sim("x86_64", prog.device) as dev, Session(prog, dev, initial={"buffer:1": x.tobytes()}) as s:
        s.submit(n=10)  # icb[0]: buffer:0 = buffer:1 + 1; icb[1]: buffer:1 = buffer:0 + 1 (first n elements)
        s.wait(timeout_s=30)
        a = np.frombuffer(s.read("buffer:0"), np.float32)
        b = np.frombuffer(s.read("buffer:1"), np.float32)
        np.testing.assert_array_equal(a[:10], x[:10] + 1)
        np.testing.assert_array_equal(a[10:], 0)
        np.testing.assert_array_equal(b[:10], x[:10] + 2)
        np.testing.assert_array_equal(b[10:], x[10:])


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
@pytest.mark.parametrize("residency_set", [True, False])
def test_link_and_release_on_the_sim_leave_nothing(target: str, residency_set: bool) -> None:
    prog = submit_program(target, kernels=3, family="Apple7", residency_set=residency_set)
    with _sim(target, prog.device) as dev:
        with Session(prog, dev) as s:
            for n in (1, 33, 64):
                s.submit(n=n)
            s.wait(timeout_s=30)
            assert dev.live_objects()  # buffers, pipeline, ICB and its commands, queue, event, fence...
        assert dev.live_objects() == {}  # every object link made and every retained command buffer released


def test_gpu_fault_on_the_sim_is_reported_and_the_session_goes_on() -> None:
    from mtlir.metal import MTL
    from mtlir.errors import GPUExecutionError
    prog = submit_program("x86_64", kernels=2, family="Apple7")
    x = np.arange(64, dtype=np.float32)
    with _sim("x86_64", prog.device) as dev, Session(prog, dev, initial={"buffer:1": x.tobytes()}) as s:
        dev.inject_fault(MTL.ErrorInvalidResource, after_commands=1)
        s.submit(n=8)
        with pytest.raises(GPUExecutionError) as e:
            s.wait(timeout_s=30)
        assert (e.value.code, e.value.name) == (9, "InvalidResource")
        assert "submit 0 (timeline value 1)" in str(e.value) and not s.inflight
        s.submit(n=8)  # the next submit runs (the fault was one shot) although value 1 was never signalled
        s.wait(timeout_s=30)
        assert s.timeline_value() == 2


def test_faithful_mode_runs_the_same() -> None:
    trace = load_trace(TRACES / "mlp_deep.apple7.json")
    program = lower_trace(trace, trace.device(), "x86_64", keep_stages=False).program
    with _sim("x86_64", trace.device(), strict=False) as dev, Session(program, dev,
                                                                      initial=trace.initial_data()) as s:
        s.submit(**trace.values)
        s.wait(timeout_s=60)
        _check(_output(s, trace), trace.output.expected_array())


SAXPY = """#include <metal_stdlib>
using namespace metal;
kernel void saxpy(device float* y, device float* x, constant int& n, constant int& a,
                  uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  int i = gid.x * 32 + lid.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def _saxpy_queue(device: DeviceSpec, *, stamps: bool) -> object:
    from mtlir.metal import Kernel, KernelParam
    from mtlir.frontend.nodes import buffer, buffer_variable, timeline_value
    from mtlir.frontend.queue import Queue
    from mtlir.ir.uop import UOp
    k = Kernel("saxpy", "saxpy", SAXPY, (KernelParam(None, 0), KernelParam(None, 1), KernelParam("n", 2, "int32"),
                                         KernelParam("a", 3, "int32")))
    n = UOp.variable("n", 1, 256)
    y, x = buffer("y", 1024), buffer_variable("x")
    q = Queue(device)
    if stamps:
        q.timestamp(0)
    q.exec(k, [y, x], [n, 3], grid=((n + 31) // 32,), threadgroup=(32,))  # a = 3: a constant in the varbuf
    q.exec(k, [y, x], [n, 2], grid=((n + 31) // 32,), threadgroup=(32,))
    if stamps:
        q.timestamp(1)
    return q.signal(q.timeline, timeline_value()).submit()


@pytest.mark.parametrize("icb, residency_set, stamps", [(True, True, False), (True, False, True), (False, True, True)])
def test_hand_built_queue_with_an_input_buffer_variable(icb: bool, residency_set: bool, stamps: bool) -> None:
    from mtlir.passes import lower
    device = DeviceSpec("Apple7", residency_set=residency_set, icb=icb)
    program = lower(_saxpy_queue(device, stamps=stamps), target="x86_64", keep_stages=False).program
    y0 = np.linspace(-1, 1, 256, dtype=np.float32)
    with _sim("x86_64", device) as dev, Session(program, dev, initial={"buffer:y": y0.tobytes()}) as s:
        inputs = [np.full(256, v, dtype=np.float32) for v in (1.0, -2.0)]
        handles = [s.linked.new_buffer(f"input{i}", 1024, a.tobytes()) for i, a in enumerate(inputs)]
        expect = y0.astype(np.float64)
        for n, (h, a) in zip((100, 256), zip(handles, inputs)):  # the input rebound per submit
            s.submit(n=n, x=h)
            (done,) = s.wait(timeout_s=60)
            expect[:n] += 5.0 * a[:n]
            np.testing.assert_allclose(np.frombuffer(s.read("buffer:y"), np.float32), expect, rtol=1e-6)
            if stamps:
                assert set(done.timestamps) == {0, 1} and 0 < done.timestamps[0] <= done.timestamps[1]
    assert dev.live_objects() == {}


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "faithful"])
def test_a_grid_that_wrapped_never_reaches_opencl(strict: bool) -> None:
    """icb[0]'s grid is n - 5 threadgroups: at n = 1 it wraps to 2**64 - 4. Strict mode refuses the patch at once;
    faithful mode fails the command buffer (Timeout) and the session goes on. No 20-second wait, no PoCL abort."""
    from mtlir.metal import MTL
    from mtlir.errors import GPUExecutionError, MetalValidationError
    prog = submit_program("x86_64", kernels=2, family="Apple7", grid_minus=5)
    with _sim("x86_64", prog.device, strict=strict) as dev, Session(prog, dev, timeout_s=30) as s:
        s.submit(n=9)
        s.wait(timeout_s=30)
        if strict:
            with pytest.raises(MetalValidationError, match=r"concurrentDispatchThreadgroups:\(18446744073709551612, "
                                                           r"1, 1\).*is not below 2\*\*32"):
                s.submit(n=1)
        else:
            s.submit(n=1)
            with pytest.raises(GPUExecutionError) as e:
                s.wait(timeout_s=30)
            assert e.value.code == MTL.ErrorTimeout and "is not below 2**32" in str(e.value)
        s.submit(n=9)
        s.wait(timeout_s=30)
        assert not s.inflight


def test_the_example_script_says_what_is_wrong_with_an_option_in_one_line() -> None:
    """examples/saxpy_reduce.py --family bogus printed a ValueError traceback; now argparse's one line, exit 2, and a
    family in any case is taken."""
    import subprocess
    import sys
    script = TRACES.parent / "saxpy_reduce.py"
    proc = subprocess.run([sys.executable, str(script), "--family", "bogus"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("saxpy_reduce.py: error: argument --family: unknown GPU family 'bogus': expected one of "
                           "Apple7, Apple8, Apple9, Mac2\n")
    proc = subprocess.run([sys.executable, str(script), "--family", "APPLE9", "--target", "x86_64"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("; Apple9, residency set, ICB, x86_64:"), proc.stderr
