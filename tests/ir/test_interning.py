"""The intern table (mtlir.ir.interning): equal nodes are one object, a freed node leaves the table at once, a
stale finalizer never removes another node's entry, and threads building the same nodes get the same objects."""
from __future__ import annotations

import gc
import threading

from mtlir.ir.dtypes import dtypes
from mtlir.ir.interning import live_nodes, table
from mtlir.ir.ops import Ops
from mtlir.ir.uop import UOp, _Filling


def test_equal_nodes_are_one_object_and_freed_ones_leave_the_table() -> None:
    gc.collect()
    before = live_nodes()
    buf = UOp(Ops.BUFFER, dtypes.id, (), ("interning_buf", 1 << 20))
    views = [UOp(Ops.BUFFER_VIEW, dtypes.id, (buf,), (256 * i, 256)) for i in range(100)]
    assert all(UOp(Ops.BUFFER_VIEW, dtypes.id, (buf,), (256 * i, 256)) is v for i, v in enumerate(views))
    assert live_nodes() == before + 101
    del views
    assert live_nodes() == before + 1  # no gc pass: reference counting frees them and their entries go
    del buf
    assert live_nodes() == before


def test_checked_builds_the_node_uop_builds() -> None:
    from mtlir.ir.interning import NONE_KEY
    buf = UOp(Ops.BUFFER, dtypes.id, (), ("interning_checked", 1 << 20))
    view = UOp.checked(Ops.BUFFER_VIEW, dtypes.id, (buf,), (256, 64), (256, 64))
    assert view is UOp(Ops.BUFFER_VIEW, dtypes.id, (buf,), (256, 64)) and view._rank == 1
    assert UOp.checked(Ops.BUFFER_VIEW, dtypes.id, (buf,), (256, 64), (256, 64)) is view
    stamp = UOp(Ops.TIMESTAMP, dtypes.void, (), 7)  # made first by UOp: checked finds it
    assert UOp.checked(Ops.TIMESTAMP, dtypes.void, (), 7, 7) is stamp
    ex = UOp.checked(Ops.EXEC, dtypes.void, (buf, view), None, NONE_KEY)
    assert ex is UOp(Ops.EXEC, dtypes.void, (buf, view)) and ex._rank == 2
    gc.collect()
    before = live_nodes()
    del ex, stamp
    assert live_nodes() == before - 2  # freed at once, entries gone


def test_a_front_end_view_keys_with_its_own_arg() -> None:
    from mtlir.frontend.nodes import buffer, view
    v = view(buffer("interning_view", 1 << 16), 512, 64)
    assert v._key[3] is v.arg  # no second (offset, nbytes) tuple in the key: 56 bytes per command


def test_a_stale_finalizer_puts_back_the_entry_of_the_live_node() -> None:
    node = UOp.variable("interning_live", 0, 3)
    key = node._key
    stale = object.__new__(_Filling)  # a node of the same key that died after ``node`` took its place
    stale._key = key
    UOp.__del__(stale)  # type: ignore[arg-type]
    ref = table.get(key)
    assert ref is not None and ref() is node
    assert UOp.variable("interning_live", 0, 3) is node


def test_threads_building_the_same_nodes_get_the_same_objects() -> None:
    results: list[list[UOp]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def build(out: list[UOp]) -> None:
        start.wait(timeout=10)
        x = UOp.variable("interning_threads", 0, 100)
        for i in range(2000):
            out.append(x + i)

    threads = [threading.Thread(target=build, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert all(len(r) == 2000 for r in results)
    assert all(all(a is b for a, b in zip(results[0], r)) for r in results[1:])


def test_nodes_without_an_arg_key_by_their_sources() -> None:
    """An EXEC, a SIGNAL, an ALU node (sources, no arg, no tag) is keyed by its src tuple in a table of its
    (op, dtype): no key tuple of its own (72 bytes a node), the same contract as every node."""
    from mtlir.ir.interning import NONE_KEY, src_keys
    gc.collect()
    before = live_nodes()
    x = UOp.variable("interning_src", 0, 100)
    # constants no other test keeps alive (0..49 may be: then fewer than 100 nodes would be new in a full run)
    sums = [x + (7_000_000 + i) for i in range(50)]
    assert all(x + (7_000_000 + i) is s for i, s in enumerate(sums)) and sums[3]._key[3] is NONE_KEY
    assert sums[3]._key is sums[4]._key  # one shared key per (op, dtype)
    sub = src_keys[Ops.ADD][dtypes.int32][2]
    assert sub[sums[3].src]() is sums[3] and sums[3]._key[2] is sub
    assert UOp.checked(Ops.ADD, dtypes.int32, sums[3].src, None, NONE_KEY) is sums[3]
    assert UOp(Ops.ADD, dtypes.int32, sums[3].src, tag="t") is not sums[3]  # a tagged node keys apart
    assert UOp(Ops.ADD, dtypes.int64, (x.cast(dtypes.int64), x.cast(dtypes.int64))).dtype is dtypes.int64
    assert live_nodes() > before + 100
    del sums
    assert live_nodes() == before + 1  # no gc pass: the sums, their constants and the other nodes above gone at once
    del x
    assert live_nodes() == before


def test_a_stale_finalizer_of_a_node_keyed_by_src_spares_the_live_node() -> None:
    x = UOp.variable("interning_src_stale", 0, 3)
    node = x + 1
    stale = object.__new__(_Filling)  # an equal node that died after ``node`` took its place
    stale._key, stale.src = node._key, node.src
    UOp.__del__(stale)  # type: ignore[arg-type]
    assert node._key[2][node.src]() is node and x + 1 is node


def test_a_bad_op_or_dtype_with_sources_gets_the_node_s_own_type_error() -> None:
    """The src-keyed table is looked up by (op, dtype) before the fields are checked: a bad op or dtype falls back
    to the full key, whose checks name the problem (no bare IndexError, no table made for the bad value)."""
    import pytest
    from mtlir.ir.interning import src_keys
    x = UOp.variable("interning_bad", 0, 3)
    with pytest.raises(TypeError, match="not an Ops member"):
        UOp("ADD", dtypes.int32, (x, x))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a DType"):
        UOp(Ops.ADD, "int32", (x, x))  # type: ignore[arg-type]
    assert "ADD" not in src_keys and all("int32" not in per for per in src_keys.values())
