"""What ``encode`` keeps of a SUBMIT's commands: the records ``SubmitReader`` builds (``KernelLayout`` per KERNEL
node, ``Size`` per grid or threadgroup, ``Binding`` per buffer argument, ``Command`` per EXEC on request, ``Blit``
per COPY or FILL, ``QueueRange`` per queue), the OBJECT placeholders they point to, the variables buffer's slot
size, and ``EncodeError``, which every problem raises naming the command.
"""
from __future__ import annotations

from typing import NamedTuple

from mtlir.errors import LoweringError
from mtlir.ir.dtypes import DType, dtypes
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp
from mtlir.metal import MTL, Kernel, Obj

__all__ = ["EncodeError", "KernelLayout", "Size", "Binding", "Command", "QueueRange", "Blit", "VAR_SLOT",
           "MAX_ICB_OFFSET", "placeholder", "where"]

VAR_SLOT = MTL.CONSTANT_OFFSET_ALIGN  # bytes per variable slot in the variables buffer (256: any family)
MAX_ICB_OFFSET = 0xFFFFFFFF


class EncodeError(LoweringError):
    """A queue graph encode cannot lower; the message names the command (its index in the queue) or queue op."""


def placeholder(kind: str, name: str, payload: tuple[object, ...] = (), dtype: DType = dtypes.id) -> UOp:
    """An OBJECT node standing for ``Obj(kind, name, payload)`` (dtype id unless given)."""
    return UOp(Ops.OBJECT, dtype, (), Obj(kind, name, payload))


class KernelLayout(NamedTuple):
    """A kernel's argument layout as encode reads it once per KERNEL node (METAL.md §1 "Kernel arguments"): its
    pipeline placeholder, the index and element size of each buffer parameter, the index and dtype of each
    variable parameter. (The simulated device's translator has its own ``KernelInfo``: what it learnt of the MSL.)"""

    kernel: Kernel
    pipeline: UOp                               # OBJECT pipeline:KEY
    buffers: tuple[tuple[int, int], ...]        # (parameter index, element size in bytes)
    vars: tuple[tuple[int, DType], ...]         # (parameter index, dtype)
    pids: tuple[int, ...]                       # ids of (index, element size, bytes needed) per buffer and
    #                                             (index, dtype, 0) per variable: buffers then vars
    var_names: tuple[tuple[str, int], ...]      # (variable name, parameter index)
    nsrc: int                                   # sources of its EXEC: 3 + buffers + variables


class Size(NamedTuple):
    """A grid or threadgroup size: the simplified MTLSize STRUCT, its link-time entries, whether it varies, and
    the range of each entry over the variables' bounds."""

    node: UOp                                   # the simplified STRUCT<MTLSize>
    link: tuple[int, int, int]                  # constant entries, 0 where set per submit
    symbolic: bool
    ranges: tuple[tuple[int, int], ...]         # per axis (lo, hi)


class Binding(NamedTuple):
    """A buffer argument: its buffer (or buffer variable), the byte offset, the placeholder name."""

    base: UOp                                   # BUFFER or buffer variable
    offset: int | UOp                           # a uint64 expression when bound per submit (a variable view)
    name: str | None                            # placeholder name; None for a buffer variable


class Command(NamedTuple):
    """One EXEC as encode read it: its kernel layout, sizes, node and ICB binding triples. Not kept per command
    (``SubmitReader`` keeps the ICB's compact record and the EXEC: ``SubmitReader.command(i)`` makes this one
    when a path wants everything at once)."""

    kernel: KernelLayout
    grid: Size
    threadgroup: Size
    node: UOp                                   # the EXEC
    icb_binds: tuple[tuple[str, int, int], ...]  # per parameter: (placeholder name, offset, index); name "" for a
    #                                             buffer variable (bound by each submit)
    symbolic: bool                              # sizes set by each submit (concurrentDispatchThreadgroups)

    @property
    def args(self) -> tuple[UOp, ...]:
        """The EXEC's buffer and variable sources."""
        return self.node.src[3:]



class Blit(NamedTuple):
    """A COPY or FILL as encode keeps it: ``selector`` and its arguments (buffer handles or placeholders, uint64
    offsets and sizes simplified, ``fillBuffer:range:value:``'s NSRange and uint8 value)."""

    selector: str
    args: tuple[UOp, ...]


class QueueRange(NamedTuple):
    """One queue of the program as ``SubmitReader.read`` found it: its ``name`` (None: the default queue), its
    commands ``first`` .. ``end - 1`` and its event ops and blits in order: ``(position, "signal" | "wait", value,
    event)``, ``(position, "blit", COPY or FILL node, the same node)`` (waits on its own timeline left out: the fence
    orders the queue)."""

    name: str | None
    first: int
    end: int
    marks: tuple[tuple[int, str, UOp, UOp], ...]



def where(i: int, k: KernelLayout, index: int, what: str) -> str:
    """Where a problem is, for an error message: ``command 3 (E_5_8): buffer parameter 1``."""
    return f"command {i} ({k.kernel.key}): {what} parameter {index}"

