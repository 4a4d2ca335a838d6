"""MetalBridge marshalling, through real ctypes calls into a stand-in libobjc (tests/native/), plus the arm64
prototypes, host memory, and the real device where there is one (macOS only).

The stand-in's objc_msgSend is x86_64 assembly that looks the method up with a C helper which scribbles on every
argument register, then jumps to it: a value arrives intact only if the bridge passed it right and the register
and stack contents survived the dispatch, as with Apple's objc_msgSend.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from mtlir.ir.dtypes import PtrDType, dtypes
from mtlir.metal import SELECTORS, Prototype, abi_prototype, c_prototype
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.errors import BridgeError
from mtlir.runtime.metal.bridge import NOT_AVAILABLE, MetalBridge, host_target, metal_available
from mtlir.runtime.metal.marshal import MTLSizeStruct, NativeMemory, ctypes_signature

NATIVE = Path(__file__).resolve().parents[2] / "native"
X86_64 = host_target() == "x86_64" and sys.platform in ("linux", "darwin")
needs_x86_64 = pytest.mark.skipif(not X86_64, reason="the stand-in objc_msgSend is x86_64 assembly (Linux/macOS); "
                                  "arm64 marshalling is checked at the prototype level")
needs_metal = pytest.mark.skipif(not metal_available(), reason=f"{NOT_AVAILABLE} (no Metal device here)")


class Record(ctypes.Structure):
    """``fake_record`` of tests/native/fakeobjc.c: what the last method received."""

    _fields_ = [("calls", ctypes.c_uint64), ("unrecognized", ctypes.c_uint64), ("self", ctypes.c_uint64),
                ("cmd", ctypes.c_uint64), ("nwords", ctypes.c_uint64), ("words", ctypes.c_uint64 * 16),
                ("nreals", ctypes.c_uint64), ("reals", ctypes.c_double * 4), ("selector", ctypes.c_char * 128)]

    def got(self) -> list[int]:
        return list(self.words[:self.nwords])


class Fake:
    """The stand-in library as the tests see it: its record and its settable return values."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.lib = ctypes.CDLL(self.path)  # the same handle the bridge gets
        self.last = Record.in_dll(self.lib, "fake_last")

    def var(self, ctype: Any, name: str) -> Any:
        return ctype.in_dll(self.lib, name)


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Fake:
    """The stand-in libobjc, built for the tests that use it (each marked ``needs_x86_64``: the stand-in
    objc_msgSend is x86_64 assembly). A C compiler is required: the Makefile installs one (build-essential)."""
    assert X86_64, "only tests marked needs_x86_64 use the stand-in libobjc"
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc is not None, "no C compiler (cc, gcc or clang) on PATH: install build-essential (make test does)"
    out = tmp_path_factory.mktemp("fakeobjc") / ("libfakeobjc.dylib" if sys.platform == "darwin" else "libfakeobjc.so")
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out),
           str(NATIVE / "fakeobjc.c"), str(NATIVE / "objc_msgSend_x86_64.S")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"building the stand-in libobjc failed: {' '.join(cmd)}\n{done.stderr}")
    return Fake(out)


@pytest.fixture(scope="module")
def bridge(fake: Fake) -> MetalBridge:
    return MetalBridge(libobjc=fake.path, metal=fake.path, coregraphics=None)


def send(bridge: MetalBridge, selector: str, receiver: int, *args: Any) -> Any:
    """A message exactly as a lowered program sends it: the selector's abi prototype on the bridge's target."""
    return bridge.msg_send(abi_prototype(selector, bridge.target), (receiver, bridge.sel_registerName(selector), *args))


@pytest.fixture(scope="module")
def device(bridge: MetalBridge) -> int:
    return int(bridge.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ()))


@pytest.fixture(scope="module")
def encoder(bridge: MetalBridge, device: int) -> int:
    queue = send(bridge, "newCommandQueueWithMaxCommandBufferCount:", device, 16)
    return int(send(bridge, "computeCommandEncoder", send(bridge, "commandBuffer", queue)))


BIG = (1 << 64) - 1


# ---- through the stand-in libobjc (x86_64) -----------------------------------------------------------------

@needs_x86_64
def test_is_a_bridge_and_names_resolve(bridge: MetalBridge, fake: Fake, device: int) -> None:
    assert isinstance(bridge, Bridge) and bridge.target == "x86_64"
    sel = bridge.sel_registerName("newSharedEvent")
    assert sel == bridge.sel_registerName("newSharedEvent") and sel > 1 << 32
    assert device > 1 << 32
    send(bridge, "newSharedEvent", device)
    assert fake.last.cmd == sel and fake.last.self == device and fake.last.selector == b"newSharedEvent"
    assert bridge.objc_getClass("NSString") > 1 << 32
    with pytest.raises(BridgeError, match="no Objective-C class named 'NoSuchClass'"):
        bridge.objc_getClass("NoSuchClass")


@needs_x86_64
def test_64_bit_words_arrive_and_return(bridge: MetalBridge, fake: Fake, device: int) -> None:
    length, options = (1 << 34) + 17, (1 << 8) | (1 << 40)
    buf = send(bridge, "newBufferWithLength:options:", device, length, options)
    assert fake.last.selector == b"newBufferWithLength:options:" and fake.last.got() == [length, options]
    assert buf > 1 << 32
    assert send(bridge, "length", buf) == length
    send(bridge, "newBufferWithLength:options:", device, BIG, BIG - 1)
    assert fake.last.got() == [BIG, BIG - 1]


@needs_x86_64
def test_arguments_on_the_stack_arrive(bridge: MetalBridge, fake: Fake, device: int) -> None:
    """Eight words: self, _cmd and four more in registers, the last two on the stack."""
    words = [BIG, 1 << 63, (1 << 32) + 1, 0, 0xDEADBEEF_00000001, 7]
    proto = Prototype(dtypes.void, (dtypes.id, dtypes.SEL) + (dtypes.uint64,) * 6)
    bridge.msg_send(proto, (device, bridge.sel_registerName("fakeWords:b:c:d:e:f:"), *words))
    assert fake.last.selector == b"fakeWords:b:c:d:e:f:" and fake.last.got() == words


@needs_x86_64
def test_mtlsize_by_value_on_x86_64(bridge: MetalBridge, fake: Fake, device: int, encoder: int) -> None:
    grid, group = ((1 << 33) + 1, 7, (1 << 40) + 3), (32, (1 << 63) + 5, 1)
    send(bridge, "dispatchThreadgroups:threadsPerThreadgroup:", encoder, grid, group)
    assert fake.last.selector == b"dispatchThreadgroups:threadsPerThreadgroup:"
    assert fake.last.self == encoder and fake.last.got() == [*grid, *group]
    icb = send(bridge, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", device, 0, 1 << 33, 0)
    assert fake.last.got() == [0, 1 << 33, 0]
    cmd = send(bridge, "indirectComputeCommandAtIndex:", icb, (1 << 32) + 3)
    assert fake.last.got() == [(1 << 32) + 3]
    send(bridge, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", cmd, [BIG, 0, 2], (4, 5, 6))
    assert fake.last.self == cmd and fake.last.got() == [BIG, 0, 2, 4, 5, 6]


@needs_x86_64
def test_nsrange_as_two_words(bridge: MetalBridge, fake: Fake, device: int, encoder: int) -> None:
    icb = send(bridge, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", device, 0, 16384, 0)
    send(bridge, "executeCommandsInBuffer:withRange:", encoder, icb, 1 << 35, 16384)
    assert fake.last.selector == b"executeCommandsInBuffer:withRange:"
    assert fake.last.got() == [icb, 1 << 35, 16384]


@needs_x86_64
def test_use_resources_reads_a_c_array(bridge: MetalBridge, fake: Fake, device: int, encoder: int) -> None:
    handles = [send(bridge, "newBufferWithLength:options:", device, 64 * (i + 1), 0) for i in range(3)]
    table = bridge.malloc(8 * len(handles))
    for i, h in enumerate(handles):
        bridge.store(table + 8 * i, dtypes.id, h)
    send(bridge, "useResources:count:usage:", encoder, table, len(handles), 3)
    assert fake.last.got() == [3, 3, *handles]
    bridge.free(table)


@needs_x86_64
@pytest.mark.parametrize("selector,var", [("GPUStartTime", "fake_gpu_start_time"), ("GPUEndTime", "fake_gpu_end_time")])
@pytest.mark.parametrize("value", [12345.678901234, 5e-324, 1.7976931348623157e308, -0.0])
def test_double_returns(bridge: MetalBridge, fake: Fake, device: int, selector: str, var: str, value: float) -> None:
    cmdbuf = send(bridge, "commandBuffer", send(bridge, "newCommandQueueWithMaxCommandBufferCount:", device, 1))
    fake.var(ctypes.c_double, var).value = value
    got = send(bridge, selector, cmdbuf)
    assert isinstance(got, float) and got == value and str(got) == str(value)


@needs_x86_64
def test_doubles_between_words_survive_dispatch(bridge: MetalBridge, fake: Fake, device: int) -> None:
    """xmm0/xmm1 and rdx carry the arguments; the stand-in's lookup overwrote all three before the jump."""
    proto = Prototype(dtypes.void, (dtypes.id, dtypes.SEL, dtypes.float64, dtypes.uint64, dtypes.float64))
    bridge.msg_send(proto, (device, bridge.sel_registerName("fakeDouble:word:double:"), 1.5e300, BIG, -2.25))
    assert list(fake.last.reals[:fake.last.nreals]) == [1.5e300, -2.25] and fake.last.got() == [BIG]


@needs_x86_64
@pytest.mark.parametrize("rax,expect", [(1, 1), (0, 0), (0xDEADBEEF_CAFE0001, 1), (0xFFFFFFFF_FFFFFF00, 0),
                                        (0x100, 0), (0xFF, 1)])
def test_bool_return_reads_the_low_byte(bridge: MetalBridge, fake: Fake, device: int, rax: int, expect: int) -> None:
    event = send(bridge, "newSharedEvent", device)
    fake.var(ctypes.c_uint64, "fake_bool_word").value = rax
    assert send(bridge, "waitUntilSignaledValue:timeoutMS:", event, (1 << 40) + 1, 10_000) == expect
    assert fake.last.got() == [(1 << 40) + 1, 10_000]


@needs_x86_64
def test_uint64_return(bridge: MetalBridge, fake: Fake, device: int) -> None:
    event = send(bridge, "newSharedEvent", device)
    fake.var(ctypes.c_uint64, "fake_signaled_value").value = (1 << 63) + 12345
    assert send(bridge, "signaledValue", event) == (1 << 63) + 12345


@needs_x86_64
@pytest.mark.parametrize("flag", [True, False, 1, 0])
def test_bool_argument(bridge: MetalBridge, fake: Fake, flag: Any) -> None:
    desc = send(bridge, "new", bridge.objc_getClass("MTLComputePipelineDescriptor"))
    assert desc > 1 << 32 and fake.last.selector == b"new"
    send(bridge, "setSupportIndirectCommandBuffers:", desc, flag)
    assert fake.last.got() == [int(flag)]


@needs_x86_64
def test_message_to_nil_returns_zero(bridge: MetalBridge, fake: Fake) -> None:
    calls = fake.last.calls
    assert send(bridge, "commandBuffer", 0) == 0
    assert send(bridge, "GPUStartTime", 0) == 0.0
    assert send(bridge, "waitUntilSignaledValue:timeoutMS:", 0, 1, 1) == 0
    assert fake.last.calls == calls


@needs_x86_64
def test_strings(bridge: MetalBridge, fake: Fake) -> None:
    text = "kernel void k(device float* a) {} // héllo ✓"
    s = bridge.make_string(text)
    assert fake.last.selector == b"stringWithUTF8String:" and fake.last.self == bridge.objc_getClass("NSString")
    assert bridge.read_cstring(send(bridge, "UTF8String", s)) == text
    assert bridge.make_string("") != s
    with pytest.raises(BridgeError, match="NUL"):
        bridge.make_string("a\0b")
    with pytest.raises(BridgeError, match="read_cstring: address 0"):
        bridge.read_cstring(0)


@needs_x86_64
def test_c_calls(bridge: MetalBridge, fake: Fake, device: int) -> None:
    created = fake.var(ctypes.c_uint64, "fake_devices_created").value
    assert bridge.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ()) == device
    assert fake.var(ctypes.c_uint64, "fake_devices_created").value == created + 1
    depth = fake.var(ctypes.c_int64, "fake_pool_depth")
    before = depth.value
    pool = bridge.c_call("objc_autoreleasePoolPush", c_prototype("objc_autoreleasePoolPush"), ())
    assert pool != 0 and depth.value == before + 1
    assert bridge.c_call("objc_autoreleasePoolPop", c_prototype("objc_autoreleasePoolPop"), (pool,)) is None
    assert depth.value == before
    with pytest.raises(BridgeError, match="differs from the C function"):
        bridge.c_call("MTLCreateSystemDefaultDevice", Prototype(dtypes.uint32, ()), ())
    with pytest.raises(BridgeError, match="'MTLNoSuchFunction' is in none of the loaded libraries"):
        bridge.c_call("MTLNoSuchFunction", Prototype(dtypes.void, ()), ())
    with pytest.raises(BridgeError, match=r"objc_autoreleasePoolPop: argument 0 '#0' \(void\*\)"):
        bridge.c_call("objc_autoreleasePoolPop", c_prototype("objc_autoreleasePoolPop"), (-1,))


UNFIT = [
    ("useResources:count:usage:", ((1, 2), 1, 3), r"argument 2 'useResources:' \(void\*\): \(1, 2\) is not an integer"),
    ("newBufferWithLength:options:", (-1, 0), r"argument 2 'newBufferWithLength:' \(uint64\): -1 does not fit"),
    ("newBufferWithLength:options:", (16, 1 << 64), r"argument 3 'options:' \(uint64\): 0x10000000000000000 does not"),
    ("newBufferWithLength:options:", (16.0, 0), r"argument 2 'newBufferWithLength:' \(uint64\): 16.0 is not an int"),
    ("dispatchThreadgroups:threadsPerThreadgroup:", ((1, 2), (1, 1, 1)),
     r"argument 2 'dispatchThreadgroups:' \(MTLSize\): \(1, 2\) is not an MTLSize"),
    ("dispatchThreadgroups:threadsPerThreadgroup:", ((1, 1, 1), (1, -4, 1)),
     r"argument 3 'threadsPerThreadgroup:' \(MTLSize\): MTLSize.height = -4 does not fit"),
    ("executeCommandsInBuffer:withRange:", (0, 0, 1 << 64),
     r"argument 4 'withRange:.length' \(uint64\): 0x10000000000000000 does not fit"),
    ("dispatchThreadgroups:threadsPerThreadgroup:", ((1.5, 1, 1), (1, 1, 1)),
     r"argument 2 'dispatchThreadgroups:' \(MTLSize\): 1.5 is not an integer"),
    ("setSupportIndirectCommandBuffers:", (2,),
     r"argument 2 'setSupportIndirectCommandBuffers:' \(bool\): 2 is not a BOOL"),
    ("waitUntilSignaledValue:timeoutMS:", (1,), r"3 arguments given, the prototype .* takes 4"),
    ("encodeSignalEvent:value:", (None, 1), r"argument 2 'encodeSignalEvent:' \(id\): None is not an integer"),
]


@needs_x86_64
@pytest.mark.parametrize("selector,args,match", UNFIT)
def test_unfit_arguments_raise_before_the_call(bridge: MetalBridge, fake: Fake, device: int, selector: str,
                                               args: tuple[Any, ...], match: str) -> None:
    calls = fake.last.calls
    with pytest.raises(BridgeError, match=f"objc_msgSend '{selector}': {match}"):
        send(bridge, selector, device, *args)
    assert fake.last.calls == calls, "the message was sent although an argument did not fit"


@needs_x86_64
def test_unfit_receiver_and_selector(bridge: MetalBridge, device: int) -> None:
    proto = abi_prototype("commit", "x86_64")
    with pytest.raises(BridgeError, match=r"objc_msgSend 'commit': argument 0 'self' \(id\): -1 does not fit"):
        bridge.msg_send(proto, (-1, bridge.sel_registerName("commit")))
    with pytest.raises(BridgeError, match=r"argument 1 '_cmd' \(SEL\): 'commit' is not an integer"):
        bridge.msg_send(proto, (device, "commit"))


@needs_x86_64
def test_integer_likes_and_fresh_prototypes(bridge: MetalBridge, fake: Fake, device: int, encoder: int) -> None:
    """numpy integers take the checked path and arrive exactly; equal Prototype objects share one ctypes
    function, and the identity cache stays bounded when every call builds a new Prototype."""
    import numpy as np  # a dependency of mtlir: a plain import, so its absence fails instead of skipping
    send(bridge, "newBufferWithLength:options:", device, np.uint64(BIG), np.int64(5))
    assert fake.last.got() == [BIG, 5]
    send(bridge, "dispatchThreadgroups:threadsPerThreadgroup:", encoder, tuple(np.array([3, 2, 1], np.uint64)),
         (np.uint32(7), 1, 1))
    assert fake.last.got() == [3, 2, 1, 7, 1, 1]
    for i in range(5000):
        send(bridge, "setBuffer:offset:atIndex:", encoder, device, i, (1 << 40) + i)
    assert fake.last.got() == [device, 4999, (1 << 40) + 4999] and len(bridge._fast) <= 4096
    proto = abi_prototype("setBuffer:offset:atIndex:", "x86_64")
    assert bridge.function(proto) is bridge.function(abi_prototype("setBuffer:offset:atIndex:", "x86_64"))
    bridge.caller(proto)((encoder, bridge.sel_registerName("setBuffer:offset:atIndex:"), device, 1 << 33, 2))
    assert fake.last.got() == [device, 1 << 33, 2]
    with pytest.raises(BridgeError, match="arguments 5 are not a tuple"):
        bridge.msg_send(proto, 5)  # type: ignore[arg-type]


@needs_x86_64
def test_prototypes_are_built_once(bridge: MetalBridge) -> None:
    proto = abi_prototype("dispatchThreadgroups:threadsPerThreadgroup:", "x86_64")
    fn = bridge.function(proto)
    assert bridge.function(abi_prototype("concurrentDispatchThreadgroups:threadsPerThreadgroup:", "x86_64")) is fn
    assert list(fn.argtypes) == [ctypes.c_void_p, ctypes.c_void_p, MTLSizeStruct, MTLSizeStruct] and fn.restype is None
    wait = bridge.function(abi_prototype("waitUntilSignaledValue:timeoutMS:", "x86_64"))
    assert list(wait.argtypes) == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]
    assert wait.restype is ctypes.c_uint8


@needs_x86_64
def test_foreign_target_shows_prototypes_but_refuses_calls(fake: Fake) -> None:
    arm = MetalBridge(target="arm64", libobjc=fake.path, metal=fake.path, coregraphics=None)
    proto = abi_prototype("dispatchThreadgroups:threadsPerThreadgroup:", "arm64")
    assert arm.signature(proto).argtypes == (ctypes.c_void_p,) * 4
    with pytest.raises(BridgeError, match="target arm64 but the machine's ABI is x86_64"):
        arm.msg_send(proto, (1 << 40, arm.sel_registerName("dispatchThreadgroups:threadsPerThreadgroup:"), 8, 16))


# ---- prototypes (any machine) --------------------------------------------------------------------------------

def _positions(selector: str, target: str) -> tuple[list[int], list[int]]:
    """Indices in the abi prototype of MTLSize arguments and of NSRange words."""
    sizes, ranges, i = [], [], 2
    for a in SELECTORS[selector].args:
        if a is dtypes.NSRange:
            ranges += [i, i + 1]
            i += 2
        else:
            if a is dtypes.MTLSize:
                sizes.append(i)
            i += 1
    return sizes, ranges


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_every_selector_has_an_exact_signature(target: str) -> None:
    size_type = ctypes.c_void_p if target == "arm64" else MTLSizeStruct
    bool_arg = ctypes.c_bool if target == "arm64" else ctypes.c_int8
    for selector, sig in SELECTORS.items():
        proto = abi_prototype(selector, target)
        cs = ctypes_signature(proto, target, selector)
        assert len(cs.argtypes) == len(proto.args) and cs.argtypes[:2] == (ctypes.c_void_p, ctypes.c_void_p)
        sizes, ranges = _positions(selector, target)
        for i, (dt, ct) in enumerate(zip(proto.args, cs.argtypes)):
            if i in sizes:
                assert ct is size_type, (selector, i)
            elif i in ranges:
                assert ct is ctypes.c_uint64, (selector, i)
            elif dt is dtypes.bool:
                assert ct is bool_arg, (selector, i)
            elif isinstance(dt, PtrDType) or dt in (dtypes.id, dtypes.SEL):
                assert ct is ctypes.c_void_p, (selector, i)
            else:
                assert ct is {dtypes.uint64: ctypes.c_uint64, dtypes.int64: ctypes.c_int64,
                              dtypes.uint8: ctypes.c_uint8}[dt], (selector, i)
        want_ret = {dtypes.void: None, dtypes.bool: ctypes.c_uint8, dtypes.float64: ctypes.c_double,
                    dtypes.uint64: ctypes.c_uint64, dtypes.int64: ctypes.c_int64}.get(sig.ret, ctypes.c_void_p)
        assert cs.restype is want_ret, selector


def test_arm64_marshalling_details() -> None:
    dispatch = ctypes_signature(abi_prototype("dispatchThreadgroups:threadsPerThreadgroup:", "arm64"), "arm64")
    assert dispatch == ctypes_signature(abi_prototype("dispatchThreadgroups:threadsPerThreadgroup:", "arm64"), "arm64")
    assert dispatch.argtypes == (ctypes.c_void_p,) * 4 and dispatch.restype is None
    execute = ctypes_signature(abi_prototype("executeCommandsInBuffer:withRange:", "arm64"), "arm64")
    assert execute.argtypes == (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)
    assert ctypes_signature(abi_prototype("GPUEndTime", "arm64"), "arm64").restype is ctypes.c_double
    wait = ctypes_signature(abi_prototype("waitUntilSignaledValue:timeoutMS:", "arm64"), "arm64")
    assert wait.restype is ctypes.c_uint8 and wait.argtypes[2:] == (ctypes.c_uint64, ctypes.c_uint64)
    assert ctypes.sizeof(MTLSizeStruct) == 24


def test_prototypes_that_cannot_travel() -> None:
    by_value = abi_prototype("dispatchThreadgroups:threadsPerThreadgroup:", "x86_64")
    with pytest.raises(BridgeError, match="dispatch: argument 2: MTLSize by value on arm64"):
        ctypes_signature(by_value, "arm64", "dispatch")
    with pytest.raises(BridgeError, match="NSRange by value"):
        ctypes_signature(Prototype(dtypes.void, (dtypes.id, dtypes.SEL, dtypes.id, dtypes.NSRange)), "x86_64")
    with pytest.raises(BridgeError, match="no selector returns an MTLSize"):
        ctypes_signature(Prototype(dtypes.MTLSize, (dtypes.id, dtypes.SEL)), "x86_64")
    with pytest.raises(BridgeError, match="unknown target 'riscv64'"):
        ctypes_signature(by_value, "riscv64")
    with pytest.raises(BridgeError, match="void is not an argument type"):
        ctypes_signature(Prototype(dtypes.void, (dtypes.void,)), "arm64")


# ---- loading -------------------------------------------------------------------------------------------------

@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the default libraries exist")
def test_without_macos_the_bridge_says_so() -> None:
    with pytest.raises(BridgeError, match="MetalBridge needs macOS with Metal; use --device sim"):
        MetalBridge()
    assert metal_available() is False


def test_a_missing_library_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "libobjc-missing.so")
    with pytest.raises(BridgeError, match="could not load libobjc from '.*libobjc-missing.so'"):
        MetalBridge(target="x86_64", libobjc=missing, metal=missing, coregraphics=None)
    with pytest.raises(BridgeError, match="unknown target 'sparc'"):
        MetalBridge(target="sparc", libobjc=missing)


# ---- host memory (any machine) -------------------------------------------------------------------------------

@pytest.fixture
def mem() -> Iterator[NativeMemory]:
    yield NativeMemory()


def test_malloc_is_zeroed_aligned_and_distinct(mem: NativeMemory) -> None:
    addrs = [mem.malloc(n) for n in (0, 1, 8, 24, 100, 4096)]
    assert len(set(addrs)) == len(addrs) and all(a % 16 == 0 for a in addrs)
    assert mem.read(addrs[-1], 4096) == bytes(4096)
    mem.write(addrs[4], b"\x01\x02\x03" * 33)
    assert mem.read(addrs[4], 99) == b"\x01\x02\x03" * 33
    for a in addrs:
        mem.free(a)
    with pytest.raises(BridgeError, match="not a live block"):
        mem.free(addrs[0])
    with pytest.raises(BridgeError, match="negative size"):
        mem.malloc(-1)


@pytest.mark.parametrize("dt,value", [
    (dtypes.int8, -128), (dtypes.int16, -2), (dtypes.int32, -(1 << 31)), (dtypes.int64, -(1 << 63)),
    (dtypes.uint8, 255), (dtypes.uint16, 65535), (dtypes.uint32, (1 << 32) - 1), (dtypes.uint64, BIG),
    (dtypes.float32, 1.5), (dtypes.float64, -1e300), (dtypes.bool, 1), (dtypes.id, (1 << 63) + 8),
    (dtypes.SEL, 1 << 40), (dtypes.voidptr, BIG), (dtypes.MTLSize, (BIG, 1, 1 << 33)), (dtypes.NSRange, (5, 1 << 50)),
])
def test_load_store_round_trip(mem: NativeMemory, dt: Any, value: Any) -> None:
    addr = mem.malloc(32)
    mem.store(addr + 8, dt, value)
    assert mem.load(addr + 8, dt) == value
    assert mem.read(addr, 8) == bytes(8)  # nothing written before the address
    assert mem.read(addr + 8 + dt.itemsize, 24 - dt.itemsize) == bytes(24 - dt.itemsize)  # nor after the value


@pytest.mark.parametrize("dt,value,match", [
    (dtypes.uint64, -1, "-1 does not fit uint64"), (dtypes.uint32, 1 << 32, "0x100000000 does not fit uint32"),
    (dtypes.int8, 128, "0x80 does not fit int8"), (dtypes.bool, 2, "2 is not a BOOL"),
    (dtypes.id, 1 << 64, "0x10000000000000000 does not fit a 64-bit address"),
    (dtypes.float32, "x", "'x' is not a number"),
    (dtypes.MTLSize, (1, 2), r"\(1, 2\) is not a MTLSize"), (dtypes.NSRange, (1, -1), "-1 does not fit uint64"),
])
def test_store_refuses_unfit_values(mem: NativeMemory, dt: Any, value: Any, match: str) -> None:
    addr = mem.malloc(32)
    with pytest.raises(BridgeError, match=f"store {dt.name} at {addr:#x}: {match}"):
        mem.store(addr, dt, value)
    assert mem.read(addr, 32) == bytes(32)


def test_read_and_write_stay_inside_a_malloc_block_and_count_bytes(mem: NativeMemory) -> None:
    """A range that starts in a malloc block must end inside the size asked for (the write was a bare memmove:
    past the block it overwrote whatever came next); data is counted in bytes, whatever its item size; a str or an
    int as data and a float size are errors (an int was taken as that many zero bytes)."""
    a, b = mem.malloc(100), mem.malloc(100)  # each spans 112 bytes: the overruns below stay inside the span
    data = np.full(20, 7.0, np.float32).data  # a memoryview of 20 elements, 80 bytes
    with pytest.raises(BridgeError, match=rf"^write: 80 bytes at {a + 30:#x} run past the end of the malloc block "
                                          rf"of 100 bytes at {a:#x}$"):
        mem.write(a + 30, data)
    with pytest.raises(BridgeError, match=rf"^read: 101 bytes at {a:#x} run past the end of the malloc block"):
        mem.read(a, 101)
    assert mem.read(a, 100) == bytes(100)  # nothing was written
    mem.write(a + 20, data)  # [20, 100): fits
    assert mem.read(a + 20, 80) == data.tobytes() and mem.read(a, 20) == bytes(20) and mem.read(a + 100, 0) == b""
    for bad in ("abc", 5):
        with pytest.raises(BridgeError, match=rf"^write at {a:#x}: data is {type(bad).__name__}, not bytes-like$"):
            mem.write(a, bad)  # type: ignore[arg-type]
    for size in (1.5, True):
        with pytest.raises(BridgeError, match=rf"^read at {a:#x}: size {size!r} is not an integer$"):
            mem.read(a, size)  # type: ignore[arg-type]
    assert mem.read(b, 100) == bytes(100)
    mem.free(a)
    c = mem.malloc(8)  # a freed block's range is forgotten, a new one's known
    with pytest.raises(BridgeError, match="9 bytes at .* run past the end of the malloc block of 8 bytes"):
        mem.write(c, bytes(9))


def test_null_and_bad_addresses(mem: NativeMemory) -> None:
    for call in (lambda: mem.read(0, 4), lambda: mem.write(0, b"x"), lambda: mem.load(0, dtypes.uint64),
                 lambda: mem.store(0, dtypes.uint64, 1)):
        with pytest.raises(BridgeError, match="address 0 \\(NULL\\)"):
            call()
    with pytest.raises(BridgeError, match="is not a 64-bit address"):
        mem.read(-8, 1)
    with pytest.raises(BridgeError, match="is not an integer"):
        mem.load(1.5, dtypes.uint8)  # type: ignore[arg-type]
    with pytest.raises(BridgeError, match="no host value of dtype void"):
        mem.load(mem.malloc(8), dtypes.void)


# ---- the real device (macOS with Metal) ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def real() -> MetalBridge:
    """The real Metal bridge, for the tests marked ``needs_metal`` (a machine whose Metal gives a default device)."""
    return MetalBridge()


def real_send(b: MetalBridge, selector: str, receiver: int, *args: Any) -> Any:
    return b.msg_send(abi_prototype(selector, b.target), (receiver, b.sel_registerName(selector), *args))


@needs_metal
def test_real_device_buffer_event_and_strings(real: MetalBridge) -> None:
    pool = real.c_call("objc_autoreleasePoolPush", c_prototype("objc_autoreleasePoolPush"), ())
    device = real.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ())
    assert device != 0
    nbytes = (1 << 20) + 256
    buf = real_send(real, "newBufferWithLength:options:", device, nbytes, 0)
    assert buf != 0 and real_send(real, "length", buf) == nbytes
    contents = real_send(real, "contents", buf)
    real.write(contents + nbytes - 4, b"mtlr")
    assert real.read(contents + nbytes - 4, 4) == b"mtlr"
    event = real_send(real, "newSharedEvent", device)
    assert real_send(real, "signaledValue", event) == 0
    assert real_send(real, "waitUntilSignaledValue:timeoutMS:", event, 1, 1) == 0
    text = "kernel void k() {} // ✓"
    assert real.read_cstring(real_send(real, "UTF8String", real.make_string(text))) == text
    queue = real_send(real, "newCommandQueueWithMaxCommandBufferCount:", device, 4)
    cmdbuf = real_send(real, "commandBuffer", queue)
    enc = real_send(real, "computeCommandEncoder", cmdbuf)
    real_send(real, "endEncoding", enc)
    real_send(real, "encodeSignalEvent:value:", cmdbuf, event, 7)
    real_send(real, "commit", cmdbuf)
    real_send(real, "waitUntilCompleted", cmdbuf)
    assert real_send(real, "status", cmdbuf) == 4 and real_send(real, "signaledValue", event) == 7
    assert real_send(real, "GPUEndTime", cmdbuf) >= real_send(real, "GPUStartTime", cmdbuf) >= 0.0
    for obj in (queue, event, buf, device):
        real_send(real, "release", obj)
    real.c_call("objc_autoreleasePoolPop", c_prototype("objc_autoreleasePoolPop"), (pool,))
