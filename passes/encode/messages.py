"""Typed Objective-C messages as ``encode`` builds them: a MSG node per message that returns a value (``msg``), and
the void messages to one receiver as data in one MSGS node (``MessageBatch``: a node per message cost ~25 µs each
over the later passes and verifiers).
"""
from __future__ import annotations

from mtlir.ir.dtypes import dtypes
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp
from mtlir.metal import SELECTORS
from mtlir.program.payloads import MessageList

__all__ = ["msg", "u64", "MessageBatch"]


def msg(selector: str, recv: UOp, *args: UOp) -> UOp:
    """A typed Objective-C message: ``MSG(recv, *args)`` of ``selector``, typed by ``SELECTORS``."""
    return UOp(Ops.MSG, SELECTORS[selector].ret, (recv, *args), selector)


def u64(v: int | UOp) -> UOp:
    """A uint64 constant (NSUInteger arguments); a UOp (a value of run-time variables) as it is."""
    if isinstance(v, UOp):
        return v
    if type(v) is int and 0 <= v <= 0xFFFFFFFFFFFFFFFF:  # the usual case: no conversion to make
        return UOp(Ops.CONST, dtypes.uint64, (), v)
    return UOp.const(dtypes.uint64, v)


class MessageBatch:
    """Void messages to one receiver, collected as data for one MSGS node: each operand once (its index in the
    node's sources, 0 being the receiver), the messages in order; ``receiver``: where the batch's caller keeps
    the receiver it is to go to, when it is not the plain object (e.g. an encoder after a loop)."""

    __slots__ = ("operands", "msgs", "receiver")

    def __init__(self) -> None:
        self.operands: dict[UOp, int] = {}
        self.msgs: list[tuple[str, tuple[int, ...]]] = []
        self.receiver: UOp | None = None

    def ref(self, u: UOp) -> int:
        """The index of operand ``u`` in the MSGS's sources (added on first use)."""
        i = self.operands.get(u)
        if i is None:
            i = self.operands[u] = len(self.operands) + 1
        return i

    def send(self, selector: str, *args: UOp) -> None:
        """Append the message ``selector`` with ``args`` (typed by ``SELECTORS`` when abi lowers the MSGS)."""
        self.msgs.append((selector, tuple([self.ref(a) for a in args])))

    def node(self, recv: UOp) -> UOp:
        """The MSGS of every message sent, to ``recv``."""
        return UOp(Ops.MSGS, dtypes.void, (recv, *self.operands), MessageList(self.msgs))
