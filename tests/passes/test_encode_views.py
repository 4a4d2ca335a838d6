"""encode's inline path for a view on a buffer it has read before (views are often one per command, so they are
checked without a memo): every check of the general path still refuses a bad view there, and the ICB binds what
the general path binds."""
from __future__ import annotations

import pytest

from mtlir.ir.dtypes import dtypes
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp
from mtlir.frontend.nodes import buffer
from mtlir.frontend.queue import Queue
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj
from mtlir.passes import lower
from mtlir.passes.encode.commands import EncodeError
from mtlir.program.payloads import CommandList, IcbSpec

_K = Kernel("vk", "vk", "", (KernelParam(None, 0, "float32", 16), KernelParam(None, 1)))
_X = buffer("views_x", 1 << 16)


def _submit(views: list[UOp]) -> UOp:
    """One EXEC per view (parameter 0), each binding ``_X`` whole as parameter 1, built without the Queue."""
    knode = UOp(Ops.KERNEL, dtypes.void, (), _K)
    size = UOp.struct(dtypes.MTLSize, 1, 1, 1)
    ops = [UOp(Ops.EXEC, dtypes.void, (knode, size, size, v, _X)) for v in views]
    ops.append(UOp(Ops.SIGNAL, dtypes.void, (Queue().timeline, UOp.const(dtypes.uint64, 1))))
    return UOp(Ops.SUBMIT, dtypes.void, tuple(ops), DeviceSpec("Apple7"))


def _view(offset: object, nbytes: object) -> UOp:
    return UOp(Ops.BUFFER_VIEW, dtypes.id, (_X,), (offset, nbytes))


@pytest.mark.parametrize("bad, message", [
    (_view(6, 64), "command 1 (vk): buffer parameter 0 is bound at byte offset 6, not a multiple of its element "
                   "size 4"),
    (_view(1 << 16, 64), r"command 1 (vk): buffer parameter 0: view [65536, 65600) runs past the end"),
    (_view(0, 32), "command 1 (vk): buffer parameter 0 takes 64 bytes (KernelParam.elements), but the view bound "
                   "to it holds 32"),
    (_view(-4, 64), "view offset -4 / size 64: expected ints, offset >= 0, size >= 1"),
    (_view(4.0, 64), "view offset 4.0 / size 64: expected ints"),
])
def test_a_bad_view_after_good_ones_on_the_same_buffer_is_refused(bad: UOp, message: str) -> None:
    with pytest.raises(EncodeError) as e:
        lower(_submit([_view(0, 64), bad]))
    assert message in str(e.value)


def test_views_bind_their_offsets_and_extents() -> None:
    p = lower(_submit([_view(256 * i, 64) for i in range(5)]), keep_stages=False).program
    (icb,) = [o for o in p.objects.values() if o.kind == "icb"]
    spec = icb.payload[0]
    assert isinstance(spec, IcbSpec) and isinstance(spec.commands, CommandList)
    assert [c.bindings for c in spec.commands] == [(("buffer:views_x", 256 * i, 0), ("buffer:views_x", 0, 1))
                                                   for i in range(5)]
    assert all(c.extents == (64, 1 << 16) for c in spec.commands)


def test_a_command_list_caches_its_hash_but_not_across_pickling() -> None:
    import pickle
    spec = CommandList([(1, "a"), (2, "b")])
    assert spec == ((1, "a"), (2, "b")) and hash(spec) == hash(CommandList([(1, "a"), (2, "b")]))
    assert hash(CommandList([(1, "a"), (3, "b"), (2, "b")])) != hash(CommandList([(1, "a"), (2, "b"), (2, "b")]))
    assert CommandList(()) == () and hash(CommandList(())) == hash(CommandList([]))
    back = pickle.loads(pickle.dumps(spec))
    assert type(back) is CommandList and "_hash" not in back.__dict__  # recomputed in the process that loads it
    assert back == spec and hash(back) == hash(spec)
    obj = Obj("icb", "icb", (IcbSpec(spec, (), (), 0),))
    assert UOp(Ops.OBJECT, dtypes.id, (), obj) is UOp(Ops.OBJECT, dtypes.id, (), Obj("icb", "icb", (
        IcbSpec(CommandList([(1, "a"), (2, "b")]), (), (), 0),)))
