"""linearize: a valid straight-line order with loops as RANGE ... END (loop-invariant work hoisted, never
repeated), registers and pools, the listing, and clear errors; a linearized loop runs
on the runtime's Interpreter as mtlir.program.instructions specifies."""
from __future__ import annotations

import struct

import pytest
from lowering_cases import small_queue

from mtlir.ir.dtypes import dtypes
from mtlir.metal import DeviceSpec, Obj, abi_prototype
from mtlir.ir.ops import Ops
from mtlir.passes import lower
from mtlir.passes.linearize import LinearizeError
from mtlir.passes.linearize import linearize, schedule
from mtlir.passes.verify import VerifyError, verify_program
from mtlir.program.instructions import Alu, Call, End, Index, Range, Store
from mtlir.program.program import Program
from mtlir.ir.uop import UOp

DEV = DeviceSpec("Apple9")
SCRATCH = UOp(Ops.OBJECT, dtypes.uint64.ptr(), (), Obj("scratch", "scratch:t", (64,)))


def _loop_sum() -> UOp:
    """for i in 0..<n: scratch[i] = i * i + k, with k = n * 3 computed once, then scratch[7] = k."""
    n = UOp.variable("n", 0, 6, dtypes.uint64)
    k = n * 3
    r = UOp.range(n.after(), 0, dtypes.uint64)
    body = SCRATCH.index(r).store(r * r + k)
    end = r.end(body)
    last = SCRATCH.after(end).index(UOp.const(dtypes.int64, 7)).store(k)
    return UOp.sink(last, arg=DEV)


def test_loop_invariant_work_stays_outside_the_loop() -> None:
    p = linearize(_loop_sum(), "x86_64")
    verify_program(p)
    ops = [type(ins) for ins in p.instrs]
    start, end = ops.index(Range), ops.index(End)
    body = p.instrs[start + 1:end]
    assert sorted(ins.opcode for ins in body) == ["ALU", "ALU", "INDEX", "STORE"]  # i * i, + k, &scratch[i], store
    k_mul = next(ins for ins in p.instrs[:start] if type(ins) is Alu)  # n * 3 before the loop
    assert k_mul.op is Ops.MUL
    head, tail = p.instrs[start], p.instrs[end]
    assert head == Range(head.dst, head.bound, end) and tail == End(head.dst, start)
    assert ops[end + 1:] == [Index, Store]


def test_a_linearized_loop_runs_on_the_interpreter() -> None:
    import mtlir.runtime as runtime
    from mtlir.runtime.executors.executor import prepare_registers
    from mtlir.runtime.executors.interpreter import Interpreter
    p = linearize(_loop_sum(), "x86_64")
    bridge = runtime.RecordingBridge(target="x86_64")
    addr = bridge.malloc(64)
    regs = prepare_registers(p, bridge, {r: addr for r in p.objects})
    Interpreter(p, bridge, regs).run(n=5)
    assert struct.unpack("<8Q", bridge.read(addr, 64)) == (15, 16, 19, 24, 31, 0, 0, 15)
    Interpreter(p, bridge, regs).run(n=0)  # an empty loop jumps past its END
    assert struct.unpack("<8Q", bridge.read(addr, 64))[7] == 0


def test_nested_loops() -> None:
    i = UOp.range(UOp.const(dtypes.uint64, 3), 1, dtypes.uint64)
    j = UOp.range(UOp.const(dtypes.uint64, 2).after(i), 2, dtypes.uint64)
    inner = j.end(SCRATCH.index(i * 2 + j).store(i))
    p = linearize(UOp.sink(i.end(inner), arg=DEV), "arm64")
    verify_program(p)
    loops = [(pc, ins) for pc, ins in enumerate(p.instrs) if type(ins) in (Range, End)]
    assert [type(ins) for _, ins in loops] == [Range, Range, End, End]
    (outer_pc, outer), (inner_pc, inner), _, _ = loops
    assert p.instrs[outer.end_pc] == End(outer.dst, outer_pc) and p.instrs[inner.end_pc] == End(inner.dst, inner_pc)
    assert inner.end_pc < outer.end_pc


def test_loops_that_do_not_nest_are_refused() -> None:
    i = UOp.range(UOp.const(dtypes.uint64, 3), 1, dtypes.uint64)
    j = UOp.range(UOp.const(dtypes.uint64, 2), 2, dtypes.uint64)
    with pytest.raises(LinearizeError, match="two loops that do not nest"):
        schedule(UOp.sink(i.end(j.end(SCRATCH.index(i + j).store(i))), arg=DEV))


def test_registers_and_pools() -> None:
    p = lower(small_queue(DeviceSpec("Apple7"), symbolic=True), target="x86_64").program
    assert set(p.selectors.values()) >= {"commandBuffer", "computeCommandEncoder", "commit"}
    assert len(p.selectors) == len(set(p.selectors.values()))  # each selector resolved once
    kinds = sorted(o.kind for o in p.objects.values())
    assert kinds.count("queue") == 1 and kinds.count("icb") == 1 and "pipeline" in kinds
    assert set(p.variables) == {"n", "timeline"}
    assert (0, 0, 0) in p.consts.values()  # a constant MTLSize by value is one pooled tuple
    written = {ins.dst for ins in p.instrs if ins.dst >= 0}
    assert not written & (set(p.consts) | set(p.objects) | set(p.selectors))
    assert p.nregs > max(written)
    assert p.selector_sequence()[-1] == "commit"
    first = p.instrs[p.patch_end()]
    assert type(first) is Call and first.fn == "objc_msgSend" and p.selectors[first.args[1]] == "commandBuffer"
    assert [c.selector for c in p.calls() if c.pc < p.patch_end()] == [
        "concurrentDispatchThreadgroups:threadsPerThreadgroup:"]


def test_a_repeated_call_is_one_record() -> None:
    """abi shares the CallList entry of a repeated message; linearize makes it one (immutable) record at every pc
    it runs at, and the listing and the verifier still see each pc."""
    p = lower(small_queue(DeviceSpec("Apple7", icb=False)), target="arm64").program
    shared = [pc for pc, ins in enumerate(p.instrs) if sum(other is ins for other in p.instrs) > 1]
    assert [p.format(pc) for pc in shared] == ["[encoder setComputePipelineState: pipeline:saxpy]",
                                               "[encoder setBytes:length:atIndex: contents:varbuf, 4, 2]"] * 2
    assert p.instrs[shared[0]] is p.instrs[shared[2]] and p.instrs[shared[1]] is p.instrs[shared[3]]
    verify_program(p)
    call = Call(-1, "objc_msgSend", abi_prototype("commit", "arm64"), (2, 1))  # r2 is written at pc 1 only
    early = Program([call, Call(2, "objc_msgSend", abi_prototype("commandBuffer", "arm64"), (0, 3)), call], 4,
                    selectors={1: "commit", 3: "commandBuffer"}, objects={0: Obj("queue", "queue")})
    with pytest.raises(VerifyError, match=r"instruction 0 .*reads r2 before anything defines it"):
        verify_program(early)
    verify_program(Program(early.instrs[1:], 4, selectors=early.selectors, objects=early.objects))


def test_listing_reads_like_messages() -> None:
    p = lower(small_queue(DeviceSpec("Apple9"), timestamps=True), target="arm64").program
    text = p.listing()
    lines = text.splitlines()
    assert lines[0] == "; Apple9, residency set, ICB, arm64: " + f"{len(p.instrs)} instructions, {p.nregs} registers"
    body = [ln[7:] for ln in lines if ln[:5].strip().isdigit()]
    assert len(body) == len(p.instrs)
    assert "  cmdbuf = [queue commandBuffer]" in body and "cmdbuf2 = [queue commandBuffer]" in body
    assert "  [encoder executeCommandsInBuffer:withRange: icb, i, 1]" in body
    assert "[encoder2 executeCommandsInBuffer:withRange: icb, 2, 1]" in body
    assert "[cmdbuf2 encodeSignalEvent:value: event, timeline]" in body
    assert any(ln.startswith("  ") for ln in body)  # a loop body is indented
    assert any(ln.startswith("for i in 0 ..< 2:") for ln in body) and any(ln == "end i" for ln in body)
    assert "; variable timeline in [1, 9223372036854775807]" in lines


@pytest.mark.parametrize("graph, message", [
    (UOp.sink(UOp(Ops.MSG, dtypes.void, (SCRATCH.bitcast(dtypes.id),), "commit"), arg=DEV), "MSG<void> commit: run abi"),
    (UOp.sink(small_queue(DEV), arg=DEV), "run encode first"),
    (small_queue(DEV), "linearize takes a SINK"),
    (UOp.sink(UOp.variable("n", 0, 4, dtypes.uint64) + UOp.variable("n", 0, 5, dtypes.uint64), arg=DEV),
     "variable 'n' is declared twice: uint64 in [0, 4] and uint64 in [0, 5]"),
    (UOp.sink(UOp.variable("n", 0, 4, dtypes.uint64) + UOp.variable("n", 0, 4, dtypes.int64), arg=DEV),
     "variable 'n' is declared twice: uint64 in [0, 4] and int64 in [0, 4]"),  # the dtypes named
])
def test_errors(graph: UOp, message: str) -> None:
    with pytest.raises(LinearizeError) as e:
        linearize(graph)
    assert message in str(e.value)


def test_results_are_the_roots_values_by_tag() -> None:
    v = UOp.variable("v", 0, 9, dtypes.uint64)
    p = linearize(UOp.sink(UOp(Ops.ADD, dtypes.uint64, (v, v), None, "twice"), v * 3, arg=DEV))
    assert set(p.results) == {"twice", "result1"}
    assert isinstance(p, Program) and p.device == DEV and p.target == "arm64"
