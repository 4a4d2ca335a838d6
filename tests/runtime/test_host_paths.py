"""The host side of a submit on the simulated device: what is shared with the device's memory through a view
(``HostMemory.view``, ``SimDevice.host_view``: a Session's cbslots table, the compiled replay's store into it), the
wait's messages resolved once (``Messenger.getter``), and a deallocated object remembered without its text
(``SimObject.zombie``): each must behave as the path it replaces, errors included."""
from __future__ import annotations

import struct

import pytest

from mtlir.errors import BridgeError, MetalValidationError
from mtlir.ir.dtypes import dtypes
from mtlir.program.instructions import Store
from mtlir.program.program import Program
from mtlir.runtime.bridge.memory import HostMemory
from mtlir.runtime.bridge.messenger import Messenger
from mtlir.runtime.bridge.recording import RecordingBridge
from mtlir.runtime.executors.replay import CompiledReplay
from mtlir.runtime.session import Session
from mtlir.runtime.sim import SimDevice
from progbuild import submit_program


def test_a_view_is_the_bytes_of_a_malloc_block_and_none_inside_an_object() -> None:
    m = HostMemory()
    base = m.alloc(64).base
    view = m.view(base + 8, 16)
    assert view is not None and view.nbytes == 16
    view[:] = bytes(range(16))
    assert m.read(base + 8, 16) == bytes(range(16))
    m.write(base + 8, b"\xff" * 4)
    assert bytes(view[:4]) == b"\xff" * 4
    owned = m.alloc(64, owner=object(), what="MTLBuffer contents").base
    assert m.view(owned, 8) is None  # a buffer's bytes: the device checks every CPU write there (rule 15)
    with pytest.raises(BridgeError, match="run past the end"):
        m.view(base + 60, 8)
    m.free(base)
    with pytest.raises(BridgeError, match="freed memory"):
        m.view(base, 8)


def _store_program(addr: int) -> Program:
    # *(uint64*)addr = value (a variable): the store the lowered Program makes of a command buffer into cbslots
    return Program([Store(dtypes.uint64, 0, 1)], 2, {0: addr}, variables={"value": (1, 0, 2**64 - 1)},
                   target="x86_64")


def test_the_compiled_replay_stores_into_malloc_memory_through_a_view_with_the_same_errors() -> None:
    dev = SimDevice("x86_64")
    addr = dev.malloc(8)
    ex = CompiledReplay(_store_program(addr), dev)
    assert "store(" in ex.source and ".pack_into" not in ex.source  # the pack is a constant of the namespace
    assert any(getattr(v, "__name__", "") == "pack_into" for v in ex.namespace.values())
    ex.run(value=0x6000_0000_4040)
    assert struct.unpack("<Q", dev.read(addr, 8))[0] == 0x6000_0000_4040
    ex.run(value=2**64 - 1)
    assert dev.read(addr, 8) == b"\xff" * 8
    # a value the view does not take goes through store, which refuses it as before
    prog = Program([Store(dtypes.uint64, 0, 1)], 2, {0: addr}, variables={"value": (1, -5, 5)}, target="x86_64")
    with pytest.raises(BridgeError, match="does not fit"):
        CompiledReplay(prog, dev).run(value=-1)


def test_a_store_into_a_buffer_still_goes_through_the_device_checks() -> None:
    """The contents of an MTLBuffer get no view: the replay's store is the device's, with rule 15's check."""
    dev = SimDevice("x86_64")
    buf = dev.memory.alloc(8, owner=object(), what="contents").base
    ex = CompiledReplay(_store_program(buf), dev)
    assert not any(getattr(v, "__name__", "") == "pack_into" for v in ex.namespace.values())
    ex.run(value=7)
    assert struct.unpack("<Q", dev.read(buf, 8))[0] == 7


@pytest.mark.parametrize("viewed", [True, False])
def test_a_session_reads_its_command_buffers_alike_with_or_without_a_view(viewed: bool) -> None:
    dev = SimDevice("arm64")
    bridge = dev if viewed else RecordingBridge(dev)  # a RecordingBridge lends no view: read and write
    with Session(submit_program("arm64"), bridge) as s:
        assert (s._slot_view is not None) is viewed
        for n in (4, 64, 9):
            sub = s.submit(n=n)
            assert len(sub.cbs) == 1 and sub.cbs[0] != 0
            done = s.wait()
            assert [d.index for d in done] == [sub.index] and done[0].spans[0].ns is not None
        # a submit that fails before its commit: the table says which command buffers it retained (none stored
        # yet: the bad value is refused before anything is sent), and nothing stays in flight
        with pytest.raises(ValueError):
            s.submit(n=65)
        assert not s.inflight
    assert s._slot_view is None


def test_a_getter_sends_what_send_sends_and_refuses_arguments() -> None:
    dev = SimDevice("x86_64")
    m = Messenger(dev)
    queue = m.send(m.device(), "newCommandQueueWithMaxCommandBufferCount:", 4)
    cb = m.send(queue, "commandBuffer")
    status = m.getter("status")
    assert status(cb) == m.send(cb, "status") == 0
    with pytest.raises(ValueError, match="takes 1 arguments"):
        m.getter("setLabel:")
    m.getter("release")(queue)
    with pytest.raises(BridgeError, match=r"deallocated instance MTLCommandQueue 0x[0-9a-f]+"):
        status(queue)


def test_a_deallocated_object_is_named_with_its_label_and_link_name() -> None:
    dev = SimDevice("x86_64")
    m = Messenger(dev)
    buf = m.send(m.device(), "newBufferWithLength:options:", 64, 0)
    dev.name_object(buf, "buffer:x")
    label = m.string("weights")
    m.send(buf, "setLabel:", label)
    m.send(buf, "release")
    with pytest.raises(BridgeError, match=r"deallocated instance MTLBuffer 0x[0-9a-f]+ 'weights' \(buffer:x\)"):
        m.send(buf, "length")
    with pytest.raises(MetalValidationError):  # a message the device refuses still raises its own error
        cb = m.send(m.send(m.device(), "newCommandQueueWithMaxCommandBufferCount:", 4), "commandBuffer")
        m.send(cb, "commit")
        m.send(cb, "commit")
