"""The Queue's per-command fast paths (view(), exec's inline checks, the memo of (grid, threadgroup) pairs, a
checked event, the timestamp slots) refuse bad input exactly as the first, slow call does: a memo never lets a bad
argument through."""
from __future__ import annotations

import pytest
from lowering_cases import N, SAXPY, SCALE

from mtlir.ir.dtypes import dtypes
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp
from mtlir.frontend.nodes import QueueError, buffer, buffer_variable, shared_event, view
from mtlir.frontend.queue import Queue
from mtlir.metal import DeviceSpec


def test_view_fast_path_builds_the_node_of_the_general_one() -> None:
    x = buffer("memo_x", 4096)
    assert view(x, 256, 1024) is UOp(Ops.BUFFER_VIEW, dtypes.id, (x,), (256, 1024))
    assert view(view(x, 256, 1024), 4, 8) is UOp(Ops.BUFFER_VIEW, dtypes.id, (x,), (260, 8))
    with pytest.raises(QueueError, match=r"bytes \[4000, 4100\) run past the end of the 4096-byte buffer"):
        view(x, 4000, 100)
    with pytest.raises(QueueError, match="offset must be an int >= 0"):
        view(x, -4, 8)
    with pytest.raises(QueueError, match="nbytes must be an int >= 1"):
        view(x, 0, 0)
    with pytest.raises(QueueError, match="offset must be an int >= 0"):
        view(x, True, 8)  # a bool is not an offset, though it is an int


def test_a_memoized_grid_does_not_let_a_bool_or_a_bad_size_through() -> None:
    x, y = buffer("memo_a", 4096), buffer("memo_b", 4096)
    q = Queue(DeviceSpec("Apple7"))
    for _ in range(3):
        q.exec(SCALE, [x, y], grid=(1, 2), threadgroup=(32,))
    with pytest.raises(QueueError, match=r"command 3 \(scale\): grid.x: a size must be an int"):
        q.exec(SCALE, [x, y], grid=(True, 2), threadgroup=(32,))
    with pytest.raises(QueueError, match="threadgroup"):
        q.exec(SCALE, [x, y], grid=(1, 2), threadgroup=(2048,))
    q.exec(SCALE, [x, y], grid=[1, 2], threadgroup=[32])  # lists: the same nodes
    assert q.ops[-1] is q.ops[0]


def test_a_bad_buffer_after_good_commands_names_its_parameter() -> None:
    x, y = buffer("memo_c", 4096), buffer("memo_d", 4096)
    q = Queue(DeviceSpec("Apple7"))
    q.exec(SAXPY, [x, view(y, 0, 64)], [N], grid=(1,), threadgroup=(32,))
    with pytest.raises(QueueError, match=r"command 1 \(saxpy\): buffer parameter 1 must be a buffer or a view"):
        q.exec(SAXPY, [x, N], [N], grid=(1,), threadgroup=(32,))
    with pytest.raises(QueueError, match=r"buffer parameter 0 must be a buffer or a view, got 5"):
        q.exec(SAXPY, [5, y], [N], grid=(1,), threadgroup=(32,))  # type: ignore[list-item]
    q.exec(SAXPY, [buffer_variable("memo_in"), y], [3], grid=(1,), threadgroup=(32,))


def test_a_checked_event_and_constant_values_still_refuse_bad_ones() -> None:
    q = Queue(DeviceSpec("Apple7"))
    ev = shared_event("memo_ev")
    q.signal(ev, 1).signal(ev, 2)
    assert q.ops[0].src == (ev, UOp.const(dtypes.uint64, 1))
    with pytest.raises(QueueError, match=r"signal after command 0: value -1 does not fit a uint64"):
        q.signal(ev, -1)
    with pytest.raises(QueueError, match="the event must be an event placeholder"):
        q.signal(buffer("memo_e", 8), 3)
    with pytest.raises(QueueError, match="the value must be an int or a uint64 UOp, got True"):
        q.wait(ev, True)


def test_a_timestamp_slot_taken_twice_names_the_first() -> None:
    x, y = buffer("memo_f", 4096), buffer("memo_g", 4096)
    q = Queue(DeviceSpec("Apple7"))
    q.exec(SCALE, [x, y]).timestamp(0).exec(SCALE, [x, y]).exec(SCALE, [x, y]).timestamp(7)
    with pytest.raises(QueueError, match="slot 7 is already taken by the timestamp after command 3"):
        q.timestamp(7)
    with pytest.raises(QueueError, match="slot 0 is already taken by the timestamp after command 1"):
        q.timestamp(0)
