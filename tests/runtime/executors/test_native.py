"""Direct calls on a native MetalBridge (mtlir.runtime.executors.native): both executors send exactly the messages
the msg_send path sends, through the stand-in libobjc of tests/native (x86_64), and only where every value is
proven to fit; anything else keeps msg_send and its checks."""
from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from mtlir.frontend.trace import load_trace
from mtlir.ir.dtypes import dtypes
from mtlir.passes import lower
from mtlir.program.instructions import Index
from mtlir.runtime.bridge.recording import RecordingBridge
from mtlir.runtime.executors.interpreter import Interpreter
from mtlir.runtime.executors.native import NativeCalls, fits, value_bounds
from mtlir.runtime.executors.replay import CompiledReplay
from mtlir.runtime.metal.bridge import MetalBridge, host_target
from mtlir.runtime.metal.marshal import MTLSizeStruct

ROOT = Path(__file__).resolve().parents[3]
needs_x86_64 = pytest.mark.skipif(host_target() != "x86_64" or sys.platform != "linux",
                                  reason="the stand-in objc_msgSend is x86_64 assembly")


class Checked(MetalBridge):
    """A MetalBridge subclass: NativeCalls refuses it, so every message goes through msg_send (the reference)."""


def _standin() -> Any:
    """benchmarks/standin.py (it builds the stand-in and links a Program onto it), loaded from its file."""
    spec = importlib.util.spec_from_file_location("standin_for_tests", ROOT / "benchmarks" / "standin.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, MetalBridge, MetalBridge, Any]:
    mod = _standin()
    out = tmp_path_factory.mktemp("standin")
    native = mod.build_standin(out)
    path = str(out / "libfakeobjc.so")
    lib = ctypes.CDLL(path)  # the same library the bridges load: its record counts their messages
    checked = Checked(target="x86_64", libobjc=path, metal=path, coregraphics=None)
    return mod, native, checked, lib


def _calls(lib: Any) -> tuple[int, int]:
    """(messages the stand-in's methods answered, messages none answered)."""
    words = (ctypes.c_uint64 * 2).in_dll(lib, "fake_last")
    return int(words[0]), int(words[1])


@needs_x86_64
@pytest.mark.parametrize("trace", ["mlp_deep.apple7", "symbolic_kv.apple7"])
@pytest.mark.parametrize("icb", [True, False], ids=["icb", "direct"])
def test_direct_calls_send_what_msg_send_sends(standin: Any, trace: str, icb: bool) -> None:
    mod, native, checked, lib = standin
    tr = load_trace(ROOT / "examples" / "traces" / f"{trace}.json")
    program = lower(tr.queue(dataclasses.replace(tr.device(), icb=icb)), target="x86_64", keep_stages=False).program
    values = {k: int(v) for k, v in tr.values.items() if k in program.variables}
    if "timeline" in program.variables:
        values["timeline"] = 3
    regs = mod.standin_registers(program, native)
    counts = []
    for bridge in (checked, native):
        for cls in (Interpreter, CompiledReplay):
            ex = cls(program, bridge, regs)
            before = _calls(lib)
            ex.run(**values)
            after = _calls(lib)
            counts.append((after[0] - before[0], after[1] - before[1]))
    assert len(set(counts)) == 1 and counts[0][0] > 5, counts
    direct = CompiledReplay(program, native, regs)
    assert "msg_send(" not in direct.source.split("try:", 1)[1], direct.source  # every message direct here
    assert "msg_send(" in CompiledReplay(program, checked, regs).source
    interp = Interpreter(program, native, regs)
    assert not any(c[0] == 1 for c in interp.code)  # no _MSG left: all direct (blocks or single)
    # after a run the fused, direct interpreter holds what the checked one holds, register by register
    reference = Interpreter(program, checked, regs)
    reference.run(**values)
    interp.run(**values)
    addresses = {ins.dst for ins in program.instrs if type(ins) is Index}  # a table entry's: read as an array
    # a pointer result kept as ctypes returns it holds None for NULL (msg_send converts it to 0)
    got = [(v.width, v.height, v.depth) if isinstance(v, MTLSizeStruct) else 0 if v is None and r in interp._raw else v
           for r, v in enumerate(interp.registers[:program.nregs]) if r not in addresses]
    assert got == [v for r, v in enumerate(reference.registers[:program.nregs]) if r not in addresses]


@needs_x86_64
def test_a_bad_variable_is_still_refused_by_name(standin: Any) -> None:
    mod, native, _, _ = standin
    tr = load_trace(ROOT / "examples" / "traces" / "symbolic_kv.apple7.json")
    program = lower(tr.queue(tr.device()), target="x86_64", keep_stages=False).program
    regs = mod.standin_registers(program, native)
    for cls in (Interpreter, CompiledReplay):
        with pytest.raises(ValueError, match="start_pos"):
            cls(program, native, regs).run(start_pos=10**6, timeline=1)


def test_only_a_native_metal_bridge_gets_direct_calls() -> None:
    assert NativeCalls.of(RecordingBridge(target="x86_64")) is None
    assert NativeCalls.of(object()) is None


def test_fits_and_constants() -> None:
    assert fits((0, 2**64 - 1), dtypes.uint64) and fits((0, 2**64 - 1), dtypes.id)
    assert not fits((-1, 3), dtypes.uint64) and not fits(None, dtypes.uint64)
    assert not fits((0, 2**32), dtypes.uint32) and not fits((0, 1), dtypes.float32)
    assert fits((0, 1), dtypes.bool) and not fits((0, 2), dtypes.bool)
    assert NativeCalls.constant(dtypes.uint64, -1) == (False, None)
    assert NativeCalls.constant(dtypes.uint64, 5) == (True, 5)
    ok, size = NativeCalls.constant(dtypes.MTLSize, (4, 2, 1))
    assert ok and (size.width, size.height, size.depth) == (4, 2, 1)
    assert NativeCalls.constant(dtypes.MTLSize, (4, -2, 1))[0] is False


def test_value_bounds_follow_dtypes_and_variables() -> None:
    tr = load_trace(ROOT / "examples" / "traces" / "symbolic_kv.apple7.json")
    program = lower(tr.queue(tr.device()), target="x86_64", keep_stages=False).program
    bounds, fields = value_bounds(program, {r: v for r, v in program.consts.items()})
    r, lo, hi = program.variables["start_pos"]
    assert bounds[r] == (lo, hi)
    assert any(len(f) == 3 for f in fields.values())  # the MTLSize of the symbolic grid


@needs_x86_64
@pytest.mark.parametrize("icb", [True, False], ids=["icb", "direct"])
def test_a_nil_result_is_nil_on_every_path(standin: Any, icb: bool) -> None:
    """A queue that answers no commandBuffer gives nil: every message after it goes to nil on the direct paths
    too (a pointer result kept as ctypes returns it is NULL where it is passed on), as on the checked path."""
    mod, native, checked, lib = standin
    tr = load_trace(ROOT / "examples" / "traces" / "mlp_deep.apple7.json")
    program = lower(tr.queue(dataclasses.replace(tr.device(), icb=icb)), target="x86_64", keep_stages=False).program
    regs = mod.standin_registers(program, native)
    queue = next(r for r, o in program.objects.items() if o.kind == "queue")
    event = next(r for r, o in program.objects.items() if o.kind == "event")
    regs[queue] = regs[event]  # an object whose class has no commandBuffer: the message answers nil
    addresses = {ins.dst for ins in program.instrs if type(ins) is Index}  # a table entry's: read as an array
    counts, files = [], []
    for bridge in (checked, native):
        for cls in (Interpreter, CompiledReplay):
            ex = cls(program, bridge, regs)
            before = _calls(lib)
            ex.run(timeline=2)
            after = _calls(lib)
            counts.append((after[0] - before[0], after[1] - before[1]))
            if cls is Interpreter:
                files.append([0 if v is None else v for r, v in enumerate(ex.registers[:program.nregs])
                              if r not in addresses])
    assert len(set(counts)) == 1 and counts[0][1] == 1, counts  # one unrecognized message, the rest to nil
    assert files[0] == files[1]


@needs_x86_64
@pytest.mark.parametrize("icb,stamps", [(True, True), (False, False), (False, True)], ids=["icb+ts", "direct",
                                                                                          "direct+ts"])
def test_loops_over_host_tables(standin: Any, icb: bool, stamps: bool) -> None:
    """Queues whose submit loops over host tables (bench_lowering's: every EXEC different): the loads of a
    table entry become ctypes array reads, a loop of known bound is unrolled into the interpreter's block, and
    both executors still send what the checked path sends and end with the same registers."""
    mod, native, checked, lib = standin
    spec = importlib.util.spec_from_file_location("bench_lowering_for_tests", ROOT / "benchmarks" / "bench_lowering.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from mtlir.metal import DeviceSpec
    program = lower(bench.build(12, DeviceSpec("Apple7", residency_set=False, icb=icb), stamps), target="x86_64",
                    keep_stages=False).program
    values = {k: lo for k, (_, lo, _) in program.variables.items()}
    regs = mod.standin_registers(program, native)
    addresses = {ins.dst for ins in program.instrs if type(ins) is Index}
    counts, files = [], []
    for bridge in (checked, native):
        for cls in (Interpreter, CompiledReplay):
            ex = cls(program, bridge, regs)
            before = _calls(lib)
            ex.run(**values)
            after = _calls(lib)
            counts.append((after[0] - before[0], after[1] - before[1]))
            if cls is Interpreter:
                files.append([(v.width, v.height, v.depth) if isinstance(v, MTLSizeStruct) else 0 if v is None else v
                              for r, v in enumerate(ex.registers[:program.nregs]) if r not in addresses])
    assert len(set(counts)) == 1 and counts[0][0] > 10, counts
    assert files[0] == files[1]
    direct = CompiledReplay(program, native, regs)
    assert "load(" not in direct.source.split("try:", 1)[1]  # every table read is an array read
    interp = Interpreter(program, native, regs)
    ranges = [pc for pc, ins in enumerate(program.instrs) if type(ins).__name__ == "Range"]
    blocks = [(start, c[3]) for start, c in enumerate(interp.code) if c[0] == 13]  # _BLOCK: (first pc, next pc)
    assert ranges and all(any(a <= pc < b for a, b in blocks) for pc in ranges)  # each loop unrolled into a block


@needs_x86_64
def test_a_nil_pointer_result_stored_at_a_constant_address_writes_zero(standin: Any) -> None:
    """A pointer result that only a store at a constant address reads stays as ctypes returns it (None for NULL)
    and is stored through a c_void_p cell: the word written is 0, as msg_send's converted result writes."""
    from mtlir.metal import abi_prototype
    from mtlir.program.instructions import Call, Store
    from mtlir.program.program import Program
    _, native, checked, _ = standin
    word = ctypes.c_uint64()
    program = Program([Call(2, "objc_msgSend", abi_prototype("commandBuffer", "x86_64"), (0, 1)),
                       Store(dtypes.uint64, 3, 2)], 4, {0: 0, 3: ctypes.addressof(word)},
                      selectors={1: "commandBuffer"}, target="x86_64")  # a message to nil: NULL
    compiled = CompiledReplay(program, native)
    assert "or 0" not in compiled.source and ".value = r2" in compiled.source
    interp = Interpreter(program, native)
    assert 2 in interp._raw
    for ex in (interp, compiled, Interpreter(program, checked), CompiledReplay(program, checked)):
        word.value = 0xDEADBEEF
        assert ex.run() == ()
        assert word.value == 0


@needs_x86_64
def test_a_one_block_program_runs_its_own_loop_and_checks_as_run_does(standin: Any) -> None:
    """A Program that is one block on a native bridge (every submit of the shipped traces) runs through the
    Interpreter's own loop for it; a value to convert still binds, a bad one is refused by name, and an error
    inside the block names the instruction."""
    import numpy as np
    mod, native, _, _ = standin
    tr = load_trace(ROOT / "examples" / "traces" / "symbolic_kv.apple7.json")
    program = lower(tr.queue(tr.device()), target="x86_64", keep_stages=False).program
    regs = mod.standin_registers(program, native)
    interp = Interpreter(program, native, regs)
    assert interp.code[0][0] == 13 and interp.code[0][3] == len(interp.code)  # _BLOCK: the whole Program
    assert getattr(interp.run, "__self__", None) is None  # its own loop, not the general _run
    assert interp.run(start_pos=5, timeline=1) == ()
    assert interp.run(program, start_pos=np.int64(5), timeline=1) == ()
    with pytest.raises(ValueError, match=r"'start_pos' has no value"):
        interp.run(timeline=1)
    with pytest.raises(ValueError, match=r"unknown variable.*'start'"):
        interp.run(start=5, timeline=1)
    with pytest.raises(ValueError, match=r"'start_pos' = 0 is outside its bounds"):
        interp.run(start_pos=0, timeline=1)
    with pytest.raises(TypeError, match="not an integer"):
        interp.run(start_pos=True, timeline=1)
    fn, get, _ = interp.code[0][2][0]  # the first op: a store through a ctypes cell (the cell, the value)
    interp.registers[get.__reduce__()[1][0]] = ("not a cell",)
    with pytest.raises(TypeError) as e:
        interp.run(start_pos=5, timeline=1)
    assert f"while running instruction {interp.code[0][4][0]}: STORE" in "\n".join(e.value.__notes__)


@needs_x86_64
def test_an_integer_cast_is_nothing_only_where_the_value_is_proven_to_fit(standin: Any) -> None:
    """On a native bridge a cast of an int whose bounds fit the target keeps the value as it is (no wrap); one
    that may not fit still wraps as C does: the same results as on a RecordingBridge."""
    import operator
    from mtlir.program.instructions import Cast
    from mtlir.program.program import Program
    _, native, _, _ = standin
    program = Program([Cast(2, dtypes.uint32, 0), Cast(3, dtypes.uint64, 1)], 4,
                      variables={"n": (0, 0, 5), "d": (1, -5, 5)}, target="x86_64")
    interp = Interpreter(program, native, results=(2, 3))
    fns = [fn for fn, _, _ in interp.code[0][2]]  # one block of two ops
    assert fns[0] is operator.index and fns[1] is not operator.index
    compiled = CompiledReplay(program, native, results=(2, 3))
    assert "r2 = r0\n" in compiled.source and "r3 = r1\n" not in compiled.source
    for ex in (interp, compiled, Interpreter(program, RecordingBridge(target="x86_64"), results=(2, 3)),
               CompiledReplay(program, RecordingBridge(target="x86_64"), results=(2, 3))):
        assert ex.run(n=5, d=-1) == (5, 2**64 - 1)
        assert ex.run(n=0, d=4) == (0, 4)
