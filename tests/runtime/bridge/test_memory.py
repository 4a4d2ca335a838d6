"""HostMemory, the host address space of the simulated device and of the recording's fake device: blocks above
2**32 with a guard gap after each, accesses checked against one block, typed loads and stores that must fit."""
from __future__ import annotations

import array
import resource

import pytest

from mtlir.errors import BridgeError
from mtlir.ir.dtypes import dtypes
from mtlir.runtime.bridge.memory import HOST_BASE, PAGE, HostMemory


def test_blocks_are_page_aligned_above_2_32_with_a_gap_after_each() -> None:
    m = HostMemory()
    a, b = m.alloc(16).base, m.alloc(16).base
    assert a == HOST_BASE and a >= 2**32 and a % PAGE == 0 and b == a + 2 * PAGE
    assert HostMemory(0x20_0000_0000).alloc(8).base == 0x20_0000_0000
    with pytest.raises(BridgeError, match=r"not mapped \(a 64-bit address cut to 32 bits\?\)"):
        m.read(a & 0xFFFFFFFF, 4)
    with pytest.raises(BridgeError, match="not mapped"):
        m.read(a + PAGE, 4)  # the guard gap after the first block
    with pytest.raises(BridgeError, match=r"16 bytes at host address .* run past the end of malloc block"):
        m.read(a + 8, 16)  # never from one block into the next


def test_a_write_counts_the_bytes_of_its_data() -> None:
    """A memoryview of float32 is 4 bytes an element: the range checked is its bytes (len() counted elements, so a
    write running past its block was a numpy broadcast error instead of the bridge's)."""
    m = HostMemory()
    a = m.alloc(16).base
    with pytest.raises(BridgeError, match=r"16 bytes at host address .* run past the end of malloc block"):
        m.write(a + 4, memoryview(array.array("f", [1.0] * 4)))  # type: ignore[arg-type]
    m.write(a, memoryview(array.array("f", [1.0] * 4)))  # type: ignore[arg-type]
    assert m.read(a, 16) == array.array("f", [1.0] * 4).tobytes()


def test_typed_values_wrap_nothing_and_must_fit() -> None:
    m = HostMemory()
    a = m.alloc(32).base
    m.store(a, dtypes.int32, -1)
    assert m.load(a, dtypes.uint32) == 2**32 - 1
    m.store(a + 8, dtypes.float32, 1.5)
    assert m.load(a + 8, dtypes.float32) == 1.5
    m.store(a + 8, dtypes.MTLSize, (7, 2, 1))
    assert m.load(a + 8, dtypes.MTLSize) == (7, 2, 1)
    with pytest.raises(BridgeError, match=r"store of -1 as uint64 .*does not fit"):
        m.store(a, dtypes.uint64, -1)
    with pytest.raises(BridgeError, match="does not fit"):
        m.store(a, dtypes.int32, 1.5)


def test_free_and_strings() -> None:
    m = HostMemory()
    a = m.alloc(8).base
    owned = m.alloc(8, owner=object(), what="contents of a buffer").base
    m.write(a, b"hi\0")
    assert m.read_cstring(a) == "hi"
    with pytest.raises(BridgeError, match="is not malloc memory"):
        m.free(owned)
    with pytest.raises(BridgeError, match="not the start of a block from malloc"):
        m.free(a + 1)
    m.free(a)
    with pytest.raises(BridgeError, match="in freed memory"):
        m.read(a, 1)
    with pytest.raises(BridgeError, match="double free"):
        m.free(a)
    m.write(owned, b"abcdefgh")
    with pytest.raises(BridgeError, match="no terminating NUL"):
        m.read_cstring(owned)
    with pytest.raises(BridgeError, match="the size is negative"):
        m.alloc(-1)


def test_a_string_is_read_to_the_end_of_its_block_whatever_its_length() -> None:
    """A 3 MiB MSL source (the reader once stopped at 1 MiB and said the string had no NUL): only the malloc
    block bounds a C string."""
    m = HostMemory()
    text = ("kernel void k() {}  // " + "x" * 1000 + "\n") * 3000
    a = m.alloc(len(text) + 1).base
    m.write(a, text.encode() + b"\0")
    assert m.read_cstring(a) == text and m.read_cstring(a + len(text) - 3) == "xx\n"
    m.write(a + len(text), b"y")
    with pytest.raises(BridgeError, match="no terminating NUL inside"):
        m.read_cstring(a)


def test_a_big_block_costs_nothing_until_it_is_touched() -> None:
    """A trace's 4 GiB buffer on the fake device of ``mtlir lower --json`` (4.2 GB and 14 s when host memory was one
    bytearray arena): the OS maps its pages only when they are written."""
    m = HostMemory()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    big = m.alloc(1 << 32).base
    m.write(big + (1 << 32) - 4, b"\x01\x02\x03\x04")
    m.store(big + 8, dtypes.uint64, 2**64 - 1)
    assert m.read(big + (1 << 32) - 4, 4) == b"\x01\x02\x03\x04" and m.read(big, 4) == bytes(4)
    assert m.load(big + 8, dtypes.uint64) == 2**64 - 1
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 << 10  # KiB: far below 4 GiB
    with pytest.raises(BridgeError, match="run past the end"):
        m.read(big + (1 << 32) - 2, 4)
