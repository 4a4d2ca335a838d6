"""The instruction records of mtlir.program.instructions: what each reads and writes, equality by opcode and
fields, immutability; a Program of them reads back (calls, listing) and is refused when an entry is not a record."""
from __future__ import annotations

import dataclasses

import pytest

from mtlir.ir.dtypes import dtypes
from mtlir.ir.ops import Ops
from mtlir.metal import abi_prototype, c_prototype
from mtlir.passes.verify import VerifyError, verify_program
from mtlir.program.instructions import (INSTRUCTIONS, Alu, Bitcast, Call, Cast, End, Gep, Index, Load, Range, Store,
                                        Struct)
from mtlir.program.program import Program

CB = abi_prototype("commandBuffer", "arm64")

# one record of each opcode: (record, registers it reads, destination)
EXAMPLES = [
    (Alu(5, Ops.ADD, dtypes.int32, (1, 2)), (1, 2), 5),
    (Cast(5, dtypes.uint8, 1), (1,), 5),
    (Bitcast(5, dtypes.float32, 1), (1,), 5),
    (Index(5, 8, 1, 2), (1, 2), 5),
    (Load(5, dtypes.uint64, 1), (1,), 5),
    (Store(dtypes.uint64, 1, 2), (1, 2), -1),
    (Struct(5, (1, 2, 3)), (1, 2, 3), 5),
    (Gep(5, 2, 1), (1,), 5),
    (Call(5, "objc_msgSend", CB, (1, 2)), (1, 2), 5),
    (Range(5, 1, 7), (1,), 5),
    (End(5, 3), (5,), -1),
]


def test_every_opcode_has_an_example() -> None:
    assert [type(ins) for ins, _, _ in EXAMPLES] == list(INSTRUCTIONS)
    assert [ins.opcode for ins, _, _ in EXAMPLES] == ["ALU", "CAST", "BITCAST", "INDEX", "LOAD", "STORE", "STRUCT",
                                                      "GEP", "CALL", "RANGE", "END"]


@pytest.mark.parametrize("ins, reads, dst", EXAMPLES, ids=lambda x: type(x).__name__)
def test_reads_and_destination(ins: object, reads: tuple[int, ...], dst: int) -> None:
    assert ins.reads() == reads  # type: ignore[attr-defined]
    assert ins.dst == dst  # type: ignore[attr-defined]


def test_equal_only_with_the_same_opcode_and_fields() -> None:
    """Cast, Bitcast and Load have the same fields: a record is never equal to another opcode's, nor to a tuple."""
    cast, bitcast, load = Cast(1, dtypes.int32, 0), Bitcast(1, dtypes.int32, 0), Load(1, dtypes.int32, 0)
    assert cast == Cast(1, dtypes.int32, 0) and hash(cast) == hash(Cast(1, dtypes.int32, 0))
    assert cast != bitcast and cast != load and bitcast != load
    assert cast != ("CAST", 1, dtypes.int32, 0)
    assert Range(1, 0, 3) != Range(1, 0, 4)


def test_records_are_immutable_and_not_indexable() -> None:
    ins = Call(-1, "objc_msgSend", CB, (0, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ins.dst = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        ins[0]  # type: ignore[index]  # a positional read of the old tuple form fails loudly


def test_a_program_reads_its_calls_back() -> None:
    pool = c_prototype("objc_autoreleasePoolPush")
    p = Program([Call(2, "objc_autoreleasePoolPush", pool, ()), Call(3, "objc_msgSend", CB, (0, 1))], 4,
                selectors={1: "commandBuffer"}, names={0: "queue"})
    views = p.calls()
    assert [(c.pc, c.fn, c.selector, c.dst, c.receiver, c.args) for c in views] == [
        (0, "objc_autoreleasePoolPush", None, 2, -1, ()), (1, "objc_msgSend", "commandBuffer", 3, 0, ())]
    assert p.patch_end() == 1
    assert p.listing(header=False).splitlines() == ["    0  r2 = objc_autoreleasePoolPush()",
                                                    "    1  r3 = [queue commandBuffer]"]


def test_a_tuple_is_not_an_instruction() -> None:
    with pytest.raises(VerifyError, match="instruction 0: tuple is not an instruction"):
        verify_program(Program([("ALU", 1, Ops.ADD, dtypes.int32, 0, 0)], 2, consts={0: 1}))  # type: ignore[list-item]
