"""Messenger: a message by selector name, its arguments in Metal's terms laid out for the target as the abi pass lays
out a Program's (recorded the same on both targets), each selector resolved once, its host memory freed by close."""
from __future__ import annotations

import pytest

from mtlir.errors import BridgeError
from mtlir.ir.dtypes import dtypes
from mtlir.metal import AbiError
from mtlir.runtime.bridge.messenger import Messenger
from mtlir.runtime.bridge.recording import FakeDevice, RecordingBridge


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_structs_are_laid_out_for_the_target_and_recorded_the_same(target: str) -> None:
    b = RecordingBridge(target=target)
    m = Messenger(b)
    enc, icb = m.device(), m.device()
    b.name_object(enc, "encoder")
    b.name_object(icb, "icb")
    m.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (7, 2, 1), (32, 1, 1))
    m.send(enc, "executeCommandsInBuffer:withRange:", icb, (0, 5))
    assert b.clear() == [
        {"receiver": "encoder", "selector": "dispatchThreadgroups:threadsPerThreadgroup:",
         "args": [[7, 2, 1], [32, 1, 1]]},
        {"receiver": "encoder", "selector": "executeCommandsInBuffer:withRange:", "args": ["icb", [0, 5]]}]
    laid = m.marshal("dispatchThreadgroups:threadsPerThreadgroup:", ((1, 2, 3), (4, 5, 6)))
    if target == "arm64":  # pointers to 24-byte copies, in one block every message reuses
        assert [b.load(a, dtypes.MTLSize) for a in laid] == [(1, 2, 3), (4, 5, 6)] and laid[1] == laid[0] + 24
        assert m.marshal("dispatchThreadgroups:threadsPerThreadgroup:", ((1, 1, 1), (1, 1, 1))) == laid
    else:
        assert laid == ((1, 2, 3), (4, 5, 6))
    assert m.marshal("executeCommandsInBuffer:withRange:", (icb, (16, 4))) == (icb, 16, 4)


def test_counts_and_selectors_are_checked_before_anything_is_sent() -> None:
    b = RecordingBridge()
    m = Messenger(b)
    with pytest.raises(ValueError, match="newBufferWithLength:options: takes 2 arguments, got 1"):
        m.send(m.device(), "newBufferWithLength:options:", 64)
    with pytest.raises(ValueError, match="dispatchThreadgroups:threadsPerThreadgroup: takes 2 arguments, got 1"):
        m.send(m.device(), "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1))
    with pytest.raises(AbiError, match="'fly' is not in the selector table"):
        m.send(m.device(), "fly")
    assert not b.messages
    assert m.sel("commit") == b.sel_registerName("commit") and m.sel("fly") == b.sel_registerName("fly")


def test_strings_classes_pools_and_close() -> None:
    dev = FakeDevice("arm64")
    m = Messenger(dev)
    s = m.string("hello")
    assert dev.strings[s] == "hello" and m.cls("NSString") == dev.objc_getClass("NSString")
    m.pop(m.push())
    addr, copy = m.cstring("x"), m.size((3, 2, 1))
    m.send(m.device(), "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (1, 1, 1))
    assert dev.read_cstring(addr) == "x" and dev.load(copy, dtypes.MTLSize) == (3, 2, 1)
    m.close()
    with pytest.raises(BridgeError, match="freed memory"):
        dev.read(addr, 1)
    with pytest.raises(BridgeError, match="freed memory"):
        dev.read(copy, 24)
    m.send(m.device(), "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (1, 1, 1))  # goes on after close
