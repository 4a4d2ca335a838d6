"""The operations a UOp can be. docs/ir.md gives each op's sources, arg and dtype."""
from __future__ import annotations

from enum import Enum, auto

__all__ = ["Ops", "GroupOp"]


class Ops(Enum):
    """Every op of the IR, grouped by what it describes."""

    # graph structure: a sink keeps side effects alive; AFTER is src[0] ordered after the side effects src[1:]
    SINK = auto()
    AFTER = auto()
    NOOP = auto()

    # data: constants, run-time variables, placeholders, memory access, reinterpretation
    CONST = auto()
    DEFINE_VAR = auto()
    BUFFER = auto()
    BUFFER_VIEW = auto()
    OBJECT = auto()
    INDEX = auto()
    LOAD = auto()
    STORE = auto()
    BITCAST = auto()
    CAST = auto()
    STRUCT = auto()
    GEP = auto()

    # arithmetic and comparison on addresses and sizes (integers; floats where a value is one)
    NEG = auto()
    ADD = auto()
    SUB = auto()
    MUL = auto()
    IDIV = auto()
    MOD = auto()
    MAX = auto()
    MIN = auto()
    SHL = auto()
    SHR = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    CMPLT = auto()
    CMPLE = auto()
    CMPEQ = auto()
    CMPNE = auto()
    WHERE = auto()

    # loops: RANGE is a loop counter 0..src[0]-1; END closes it after the side effects of src[1:]
    RANGE = auto()
    END = auto()

    # calls: MSG is a typed Objective-C message; CALL is a foreign call with an exact C prototype; MSGS and CALLS
    # are runs of void messages / calls to one receiver carried as data (src: the receiver, then the operands)
    MSG = auto()
    CALL = auto()
    MSGS = auto()
    CALLS = auto()

    # queue operations: the front end's vocabulary, lowered by the passes
    KERNEL = auto()
    EXEC = auto()
    WAIT = auto()
    SIGNAL = auto()
    TIMESTAMP = auto()
    COPY = auto()
    FILL = auto()
    SUBMIT = auto()

    # identity hash in C: Enum's own __hash__ is Python code, and every node creation and rule lookup hashes an op
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Ops.{self.name}"

    def __lt__(self, other: Ops) -> bool:
        return self.value < other.value


class GroupOp:
    """Sets of ops that rules and printers treat alike."""

    Unary = frozenset({Ops.NEG})
    Binary = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN, Ops.SHL, Ops.SHR, Ops.AND,
                        Ops.OR, Ops.XOR, Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE})
    Ternary = frozenset({Ops.WHERE})
    ALU = Unary | Binary | Ternary
    Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.MIN, Ops.AND, Ops.OR, Ops.XOR, Ops.CMPEQ, Ops.CMPNE})
    Comparison = frozenset({Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE})
    Queue = frozenset({Ops.EXEC, Ops.WAIT, Ops.SIGNAL, Ops.TIMESTAMP, Ops.COPY, Ops.FILL})
    Effect = frozenset({Ops.STORE, Ops.MSG, Ops.CALL, Ops.MSGS, Ops.CALLS, Ops.END, Ops.EXEC, Ops.WAIT, Ops.SIGNAL, Ops.TIMESTAMP,
                        Ops.COPY, Ops.FILL, Ops.SUBMIT})
