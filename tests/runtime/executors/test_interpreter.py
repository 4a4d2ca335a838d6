"""The executors (Interpreter, CompiledReplay) on hand-written Programs: C semantics of the arithmetic, memory,
structs, loops, calls through the Bridge, variable binding, Program validation; a differential property test."""
from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtlir.ir.dtypes import DType, dtypes
from mtlir.metal import abi_prototype, c_prototype
from mtlir.ir.ops import Ops
from mtlir.program.instructions import (Alu, Bitcast, Call, Cast, End, Gep, Index, Instr, Load, Range, Store,
                                        Struct)
from mtlir.program.program import Program
from mtlir.runtime.bridge.recording import RecordingBridge
from mtlir.runtime.executors.executor import ProgramError, prepare_registers
from mtlir.runtime.executors.interpreter import Interpreter
from mtlir.runtime.executors.replay import CompiledReplay, make_executor
from mtlir.errors import BridgeError, LinkError

EXECUTORS = [Interpreter, CompiledReplay]


def run1(cls: type, instrs: list[Instr], nregs: int, consts: dict[int, Any], result: int,
         bridge: RecordingBridge | None = None, **values: Any) -> Any:
    variables = {name: (r, -2**63, 2**64) for name, r in values.pop("_vars", {}).items()}
    prog = Program(instrs, nregs, consts, variables=variables)
    ex = cls(prog, bridge or RecordingBridge(), results=(result,))
    return ex.run(**values)[0]


def alu(cls: type, op: Ops, dtype: DType, *vals: Any) -> Any:
    consts = dict(enumerate(vals))
    n = len(vals)
    return run1(cls, [Alu(n, op, dtype, tuple(range(n)))], n + 1, consts, n)


@pytest.mark.parametrize("cls", EXECUTORS)
class TestArithmetic:
    def test_integers_wrap_to_their_dtype(self, cls: type) -> None:
        assert alu(cls, Ops.ADD, dtypes.int32, 2**31 - 1, 1) == -2**31
        assert alu(cls, Ops.ADD, dtypes.uint8, 255, 1) == 0
        assert alu(cls, Ops.SUB, dtypes.uint64, 0, 1) == 2**64 - 1
        assert alu(cls, Ops.MUL, dtypes.int16, 300, 300) == np.int16(np.int32(90000).astype(np.int16))
        assert alu(cls, Ops.SHL, dtypes.uint32, 1, 35) == 0
        assert alu(cls, Ops.NEG, dtypes.int8, -128) == -128

    def test_division_truncates_toward_zero(self, cls: type) -> None:
        assert alu(cls, Ops.IDIV, dtypes.int32, -7, 2) == -3
        assert alu(cls, Ops.MOD, dtypes.int32, -7, 2) == -1
        assert alu(cls, Ops.IDIV, dtypes.int32, 7, -2) == -3
        assert alu(cls, Ops.MOD, dtypes.int32, 7, -2) == 1
        with pytest.raises(ZeroDivisionError):
            alu(cls, Ops.IDIV, dtypes.int32, 1, 0)

    def test_division_of_a_variable_by_a_constant(self, cls: type) -> None:
        prog = Program([Alu(2, Ops.IDIV, dtypes.int32, (0, 1)), Alu(3, Ops.MOD, dtypes.int32, (0, 1))], 4, {1: 4},
                       variables={"x": (0, -100, 100)})
        ex = cls(prog, RecordingBridge(), results=(2, 3))
        assert [ex.run(x=x) for x in (-9, -8, -1, 0, 7)] == [(-2, -1), (-2, 0), (0, -1), (0, 0), (1, 3)]

    def test_comparisons_where_max_min(self, cls: type) -> None:
        assert alu(cls, Ops.CMPLT, dtypes.bool, -1, 0) is True
        assert alu(cls, Ops.CMPNE, dtypes.bool, 3, 3) is False
        assert alu(cls, Ops.WHERE, dtypes.int32, False, 5, 9) == 9
        assert alu(cls, Ops.MAX, dtypes.int32, -5, 2) == 2
        assert alu(cls, Ops.MIN, dtypes.uint64, 5, 2) == 2
        assert alu(cls, Ops.SHR, dtypes.int32, -16, 2) == -4  # arithmetic shift of a signed value

    def test_float32_results_are_rounded(self, cls: type) -> None:
        got = alu(cls, Ops.ADD, dtypes.float32, 0.1, 0.2)
        assert got == float(np.float32(0.1) + np.float32(0.2))
        assert alu(cls, Ops.ADD, dtypes.float64, 0.1, 0.2) == 0.1 + 0.2
        assert alu(cls, Ops.MUL, dtypes.float32, 1e30, 1e30) == float("inf")

    def test_float_ops_that_do_not_exist_are_refused(self, cls: type) -> None:
        with pytest.raises(ProgramError, match="IDIV.*float32"):
            alu(cls, Ops.IDIV, dtypes.float32, 1.0, 2.0)

    def test_cast(self, cls: type) -> None:
        def cast(dt: DType, v: Any) -> Any:
            return run1(cls, [Cast(1, dt, 0)], 2, {0: v}, 1)
        assert cast(dtypes.int32, -2.7) == -2
        assert cast(dtypes.float32, 2**24 + 1) == 16777216.0
        assert cast(dtypes.uint8, 257) == 1
        assert cast(dtypes.int8, 200) == -56
        assert cast(dtypes.bool, 7) is True
        assert cast(dtypes.float64, 3) == 3.0 and isinstance(cast(dtypes.float64, 3), float)
        with pytest.raises(ValueError, match="nan"):
            cast(dtypes.int32, float("nan"))

    def test_bitcast(self, cls: type) -> None:
        def bitcast(dt: DType, v: Any) -> Any:
            return run1(cls, [Bitcast(1, dt, 0)], 2, {0: v}, 1)
        assert bitcast(dtypes.int32, 1.0) == 0x3F800000
        assert bitcast(dtypes.uint32, -1) == 0xFFFFFFFF
        assert bitcast(dtypes.int64, 2**64 - 1) == -1
        assert bitcast(dtypes.float32, 0x40490FDB) == struct.unpack("<f", struct.pack("<I", 0x40490FDB))[0]
        assert bitcast(dtypes.float64, 0x3FF0000000000000) == 1.0


@pytest.mark.parametrize("cls", EXECUTORS)
class TestMemoryStructsLoops:
    def test_index_load_store(self, cls: type) -> None:
        b = RecordingBridge()
        base = b.malloc(64)
        # r2 = base + 3 * 4; *(int32*)r2 = -5; r4 = *(uint32*)r2
        instrs = [Index(2, 4, 0, 1), Store(dtypes.int32, 2, 3), Load(4, dtypes.uint32, 2)]
        assert run1(cls, instrs, 5, {0: base, 1: 3, 3: -5}, 4, b) == 2**32 - 5
        assert b.read(base + 12, 4) == struct.pack("<i", -5)

    def test_struct_and_gep(self, cls: type) -> None:
        instrs = [Struct(3, (0, 1, 2)), Gep(4, 2, 3)]
        assert run1(cls, instrs, 5, {0: 4, 1: 5, 2: 6}, 3) == (4, 5, 6)
        assert run1(cls, instrs, 5, {0: 4, 1: 5, 2: 6}, 4) == 6

    def test_loops_nested_and_zero_trip(self, cls: type) -> None:
        # acc += i * j for i < n, j < m; r0 = n, r1 = m (variables), r2 = acc (0), r3 = 1
        b = RecordingBridge()
        acc = b.malloc(8)
        instrs = [
            Range(4, 0, 7),
            Range(5, 1, 6),
            Alu(6, Ops.MUL, dtypes.int64, (4, 5)),
            Load(7, dtypes.int64, 2),
            Alu(8, Ops.ADD, dtypes.int64, (7, 6)),
            Store(dtypes.int64, 2, 8),
            End(5, 1),
            End(4, 0),
        ]
        prog = Program(instrs, 9, {2: acc}, variables={"n": (0, 0, 100), "m": (1, 0, 100)})
        ex = cls(prog, b)
        for n, m in ((4, 5), (0, 5), (3, 0), (1, 1)):
            b.write(acc, bytes(8))
            ex.run(n=n, m=m)
            assert struct.unpack("<q", b.read(acc, 8))[0] == sum(i * j for i in range(n) for j in range(m))

    def test_empty_loop_body(self, cls: type) -> None:
        prog = Program([Range(1, 0, 1), End(1, 0)], 2, {0: 3})
        cls(prog, RecordingBridge()).run()


@pytest.mark.parametrize("cls", EXECUTORS)
class TestCalls:
    def test_msg_send_and_c_call(self, cls: type) -> None:
        b = RecordingBridge(target="x86_64")
        queue = b.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ())
        b.name_object(queue, "queue")
        p_cb = abi_prototype("commandBuffer", "x86_64")
        p_dispatch = abi_prototype("dispatchThreadgroups:threadsPerThreadgroup:", "x86_64")
        p_pop = c_prototype("objc_autoreleasePoolPop")
        instrs = [
            Call(0, "objc_autoreleasePoolPush", c_prototype("objc_autoreleasePoolPush"), ()),
            Call(3, "objc_msgSend", p_cb, (1, 2)),
            Call(7, "objc_msgSend", abi_prototype("computeCommandEncoder", "x86_64"), (3, 6)),
            Struct(8, (4, 5, 5)),
            Call(-1, "objc_msgSend", p_dispatch, (7, 9, 8, 8)),
            Call(-1, "objc_autoreleasePoolPop", p_pop, (0,)),
        ]
        prog = Program(instrs, 10, {1: queue, 5: 1},
                       selectors={2: "commandBuffer", 6: "computeCommandEncoder",
                                  9: "dispatchThreadgroups:threadsPerThreadgroup:"},
                       variables={"w": (4, 1, 64)}, target="x86_64")
        ex = cls(prog, b)
        b.clear()
        ex.run(w=7)
        assert b.clear() == [
            {"receiver": "queue", "selector": "commandBuffer", "args": []},
            {"receiver": "cmdbuf", "selector": "computeCommandEncoder", "args": []},
            {"receiver": "encoder", "selector": "dispatchThreadgroups:threadsPerThreadgroup:",
             "args": [[7, 1, 1], [7, 1, 1]]},
        ]

    def test_a_bridge_error_names_the_instruction(self, cls: type) -> None:
        b = RecordingBridge()
        prog = Program([Load(1, dtypes.uint64, 0)], 2, {0: 12345})
        with pytest.raises(BridgeError) as e:
            cls(prog, b).run()
        assert "0: r1 = LOAD" in "\n".join(e.value.__notes__)


@pytest.mark.parametrize("cls", EXECUTORS)
class TestVariables:
    PROG = Program([Alu(2, Ops.ADD, dtypes.int32, (0, 1))], 3, {1: 1},
                   variables={"start_pos": (0, 1, 32)})

    def test_bound_by_name(self, cls: type) -> None:
        ex = cls(self.PROG, RecordingBridge(), results=(2,))
        assert ex.run(start_pos=5) == (6,)
        assert ex.run(start_pos=32) == (33,)

    def test_missing(self, cls: type) -> None:
        with pytest.raises(ValueError, match=r"'start_pos' has no value \(bounds \[1, 32\]\)"):
            cls(self.PROG, RecordingBridge()).run()

    def test_out_of_bounds(self, cls: type) -> None:
        with pytest.raises(ValueError, match=r"'start_pos' = 33 is outside its bounds \[1, 32\]"):
            cls(self.PROG, RecordingBridge()).run(start_pos=33)

    def test_unknown_and_non_integer(self, cls: type) -> None:
        with pytest.raises(ValueError, match="unknown variable.*'n'"):
            cls(self.PROG, RecordingBridge()).run(start_pos=3, n=1)
        with pytest.raises(TypeError, match="not an integer"):
            cls(self.PROG, RecordingBridge()).run(start_pos=3.5)
        assert cls(self.PROG, RecordingBridge(), results=(2,)).run(start_pos=np.int64(4)) == (5,)


@pytest.mark.parametrize("cls", EXECUTORS)
class TestValidation:
    @pytest.mark.parametrize("instrs, match", [
        ([("ALU", 1, Ops.ADD, dtypes.int32, 0, 0)], "not an instruction"),  # a tuple is not an instruction
        ([Alu(1, Ops.ADD, dtypes.int32, (0, 5))], "is not a register"),
        ([Alu(1, Ops.ADD, dtypes.int32, (0, 2))], "reads r2, which no"),
        ([End(0, 0)], "does not close"),
        ([Range(1, 0, 5)], "RANGE"),
        ([Cast(0, dtypes.int32, 0)], "writes r0, which holds a constant"),
    ])
    def test_bad_programs(self, cls: type, instrs: list[Any], match: str) -> None:
        with pytest.raises(ProgramError, match=match):
            cls(Program(instrs, 3, {0: 1}), RecordingBridge())

    def test_unlinked_placeholders(self, cls: type) -> None:
        from mtlir.metal import Obj
        prog = Program([], 1, objects={0: Obj("queue", "queue")})
        with pytest.raises(LinkError, match="link the Program first"):
            cls(prog, RecordingBridge())


def test_compiled_replay_inlines_what_does_not_change() -> None:
    b = RecordingBridge()
    queue = b.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ())
    prog = Program([Call(2, "objc_msgSend", abi_prototype("commandBuffer", "arm64"), (0, 1))], 3,
                   selectors={1: "commandBuffer"}, objects={0: __import__("mtlir.metal").metal.Obj("queue", "queue")})
    regs = prepare_registers(prog, b, {0: queue})
    ex = CompiledReplay(prog, b, regs)
    sel = b.sel_registerName("commandBuffer")
    assert f"(0x{queue:x}, 0x{sel:x})" in ex.source  # a constant tuple: no register reads at run time
    assert make_executor("interpreter", prog, b, regs).name == "interpreter"
    with pytest.raises(ValueError, match="unknown executor"):
        make_executor("jit", prog, b, regs)


# ---- differential: random straight-line integer/float programs, both executors and numpy agree

_NP = {dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64, dtypes.uint8: np.uint8,
       dtypes.int16: np.int16}
_OPS = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR, Ops.MAX, Ops.MIN, Ops.IDIV, Ops.MOD, Ops.CMPLT]


def _np_ref(op: Ops, dt: DType, a: int, b: int) -> Any:
    t = _NP[dt]
    x, y = np.array([a], dtype=t), np.array([b], dtype=t)
    with np.errstate(all="ignore"):
        if op is Ops.IDIV:
            q = abs(int(x[0])) // abs(int(y[0]))
            return int(np.array([q if (int(x[0]) < 0) == (int(y[0]) < 0) else -q]).astype(t)[0])
        if op is Ops.MOD:
            return int(x[0]) - int(y[0]) * _np_ref(Ops.IDIV, dt, a, b) if int(y[0]) else None
        f = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.AND: np.bitwise_and,
             Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor, Ops.MAX: np.maximum, Ops.MIN: np.minimum,
             Ops.CMPLT: np.less}[op]
        r = f(x, y)[0]
    return bool(r) if op is Ops.CMPLT else int(r)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_OPS), st.sampled_from(list(_NP)), st.integers(-2**40, 2**40),
                          st.integers(-2**40, 2**40), st.sampled_from(["vv", "vc", "cc"])), min_size=1, max_size=12))
def test_differential_against_numpy(ops: list[tuple[Ops, DType, int, int, str]]) -> None:
    """Operands as variables (computed at run time), a variable and a constant (constant divisors inline), or two
    constants (folded when the replay is generated): every path agrees with the Interpreter and numpy."""
    instrs, consts, variables, values, expect, results = [], {}, {}, {}, [], []
    n = 0
    for i, (op, dt, a, b, kinds) in enumerate(ops):
        a, b = int(np.array([a]).astype(_NP[dt])[0]), int(np.array([b]).astype(_NP[dt])[0])
        if op in (Ops.IDIV, Ops.MOD) and b == 0:
            b = 1
        for reg, val, kind, name in ((n, a, kinds[0], f"a{i}"), (n + 1, b, kinds[1], f"b{i}")):
            if kind == "c":
                consts[reg] = val
            else:
                variables[name] = (reg, -2**63, 2**64)
                values[name] = val
        instrs.append(Alu(n + 2, op, dtypes.bool if op is Ops.CMPLT else dt, (n, n + 1)))
        expect.append(_np_ref(op, dt, a, b))
        results.append(n + 2)
        n += 3
    prog = Program(instrs, n, consts, variables=variables)
    got = [cls(prog, RecordingBridge(), results=results).run(**values) for cls in EXECUTORS]
    assert got[0] == got[1] == tuple(expect)


@pytest.mark.parametrize("cls", EXECUTORS)
def test_casts_of_variables_at_run_time(cls: type) -> None:
    instrs = [Cast(1, dtypes.uint8, 0), Cast(2, dtypes.int8, 0), Cast(3, dtypes.float32, 0),
              Bitcast(4, dtypes.uint64, 0), Cast(5, dtypes.int32, 3)]
    prog = Program(instrs, 6, variables={"x": (0, -2**40, 2**40)})
    ex = cls(prog, RecordingBridge(), results=(1, 2, 3, 4, 5))
    assert ex.run(x=-1) == (255, -1, -1.0, 2**64 - 1, -1)
    assert ex.run(x=2**24 + 1) == (1, 1, 16777216.0, 2**24 + 1, 16777216)


@pytest.mark.parametrize("cls", EXECUTORS)
def test_run_takes_the_program_as_issue_4_names_it(cls: type) -> None:
    """``executor.run(program, **values)``: the executor's own Program, or another one on the same Bridge."""
    double = Program([Alu(2, Ops.MUL, dtypes.int32, (0, 1))], 3, {1: 2}, variables={"x": (0, -9, 9)},
                     results={"y": 2})
    ex = cls(double, RecordingBridge(), results=(2,))
    assert ex.run(double, x=4) == ex.run(x=4) == (8,)
    negate = Program([Alu(1, Ops.NEG, dtypes.int32, (0,))], 2, {}, variables={"x": (0, -9, 9)}, results={"y": 1})
    assert ex.run(negate, x=4) == (-4,) and ex.run(negate, x=5) == (-5,)  # made once, kept
    assert ex.run(x=3) == (6,)  # its own Program is untouched
    with pytest.raises(ValueError, match=r"'x' = 10 is outside its bounds"):
        ex.run(negate, x=10)
    from mtlir.metal import Obj
    linked_only = Program([], 1, objects={0: Obj("queue", "queue")})
    with pytest.raises(LinkError, match="link the Program first"):
        ex.run(linked_only)


def test_compiled_replay_sends_through_the_sim_device_s_senders() -> None:
    """On a SimDevice each message of a fixed SEL goes through ``SimDevice.sender`` (msg_send with its pair's
    look-ups done once), not ``msg_send``; a bridge without senders (RecordingBridge) keeps ``msg_send``."""
    from mtlir.metal import Obj
    from mtlir.runtime.sim.device import SimDevice
    proto = abi_prototype("commandBuffer", "x86_64")
    prog = Program([Call(2, "objc_msgSend", proto, (0, 1))], 3, selectors={1: "commandBuffer"},
                   objects={0: Obj("queue", "queue")})
    with SimDevice("x86_64") as dev:
        device = dev.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ())
        new_queue = "newCommandQueueWithMaxCommandBufferCount:"
        queue = dev.msg_send(abi_prototype(new_queue, "x86_64"), (device, dev.sel_registerName(new_queue), 4))
        ex = CompiledReplay(prog, dev, prepare_registers(prog, dev, {0: queue}))
        assert "msg_send(" not in ex.source.split("try:", 1)[1], ex.source
        pool = dev.c_call("objc_autoreleasePoolPush", c_prototype("objc_autoreleasePoolPush"), ())
        ex.run()  # a command buffer (+0, in the pool), through the sender
        assert len(dev.object(queue).live) == 1  # type: ignore[attr-defined]
        dev.c_call("objc_autoreleasePoolPop", c_prototype("objc_autoreleasePoolPop"), (pool,))
    b = RecordingBridge()
    regs = prepare_registers(prog, b, {0: b.c_call("MTLCreateSystemDefaultDevice",
                                                     c_prototype("MTLCreateSystemDefaultDevice"), ())})
    assert "msg_send(" in CompiledReplay(prog, b, regs).source
