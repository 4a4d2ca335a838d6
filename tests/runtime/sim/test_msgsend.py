"""The simulated objc_msgSend decodes what the abi pass produced with the target's rules and refuses the rest:
MTLSize by value on arm64 or by pointer on x86_64, truncated handles, unknown selectors, wrong counts, values that
do not fit their type, selectors a class does not answer."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from mtlir.ir.dtypes import PtrDType, dtypes
from mtlir.metal import MTL, Prototype, abi_prototype, c_prototype
from mtlir.errors import BridgeError, DeviceClosedError, MetalValidationError
from mtlir.runtime.sim.objects import Buffer
from mtlir.runtime.sim.device import SimDevice
from simscene import Scene

DISPATCH = "dispatchThreadgroups:threadsPerThreadgroup:"
ICB_DISPATCH = "concurrentDispatchThreadgroups:threadsPerThreadgroup:"


@pytest.fixture
def arm() -> Iterator[Scene]:
    s = Scene(target="arm64")
    yield s
    s.close()


@pytest.fixture
def x86() -> Iterator[Scene]:
    s = Scene(target="x86_64")
    yield s
    s.close()


def encoder(s: Scene) -> int:
    cb = s.send(s.queue, "commandBuffer")
    enc = s.send(cb, "computeCommandEncoder")
    s.send(enc, "setComputePipelineState:", s.pipelines["add1"])
    return int(enc)


def raw(s: Scene, proto: Prototype, recv: int, selector: str, *args: object) -> object:
    return s.dev.msg_send(proto, (recv, s.m.sel(selector), *args))


def test_mtlsize_by_value_on_arm64_is_refused(arm: Scene) -> None:
    enc = encoder(arm)
    by_value = Prototype(dtypes.void, (dtypes.id, dtypes.SEL, dtypes.MTLSize, dtypes.MTLSize))
    with pytest.raises(BridgeError, match=r"dispatchThreadgroups:threadsPerThreadgroup:: argument 1 is an MTLSize "
                                          r"passed by value, but on arm64 .* pointer .*AAPCS64"):
        raw(arm, by_value, enc, DISPATCH, (1, 1, 1), (4, 1, 1))
    # the right prototype with a tuple where the pointer goes is refused too
    with pytest.raises(BridgeError, match=r"argument 1 is an MTLSize by value \(1, 1, 1\), but on arm64 it must be a "
                                          r"pointer"):
        raw(arm, abi_prototype(DISPATCH, "arm64"), enc, DISPATCH, (1, 1, 1), (4, 1, 1))


def test_mtlsize_pointer_on_x86_64_is_refused(x86: Scene) -> None:
    enc = encoder(x86)
    ptr = PtrDType(dtypes.MTLSize)
    by_ref = Prototype(dtypes.void, (dtypes.id, dtypes.SEL, ptr, ptr))
    with pytest.raises(BridgeError, match=r"argument 1 is a pointer to an MTLSize, but on x86_64 the 24 bytes travel "
                                          r"by value"):
        raw(x86, by_ref, enc, DISPATCH, x86.m.size((1, 1, 1)), x86.m.size((4, 1, 1)))
    with pytest.raises(BridgeError, match=r"argument 2 is \d+, but on x86_64 an MTLSize travels by value"):
        raw(x86, abi_prototype(DISPATCH, "x86_64"), enc, DISPATCH, (1, 1, 1), x86.m.size((4, 1, 1)))


def test_mtlsize_is_decoded_on_both_targets(arm: Scene, x86: Scene) -> None:
    for s in (arm, x86):
        icb = s.icb(1)
        cmd = s.send(icb, "indirectComputeCommandAtIndex:", 0)
        s.send(cmd, ICB_DISPATCH, (3, 2, 1), (8, 4, 2))
        slot = s.dev.object(icb).slots[0]  # type: ignore[attr-defined]
        assert (slot.grid, slot.threadgroup) == ((3, 2, 1), (8, 4, 2))


def test_mtlsize_pointer_into_freed_or_unmapped_memory(arm: Scene) -> None:
    enc = encoder(arm)
    proto = abi_prototype(DISPATCH, "arm64")
    addr = arm.dev.malloc(24)
    arm.dev.free(addr)
    with pytest.raises(BridgeError, match=r"argument 1 \(MTLSize\*\): host address .* is in freed memory"):
        raw(arm, proto, enc, DISPATCH, addr, addr)
    with pytest.raises(BridgeError, match=r"argument 1 is a NULL MTLSize pointer"):
        raw(arm, proto, enc, DISPATCH, 0, 0)


def test_nsrange_travels_as_two_words(x86: Scene) -> None:
    enc = encoder(x86)
    icb = x86.icb(4)
    as_struct = Prototype(dtypes.void, (dtypes.id, dtypes.SEL, dtypes.id, dtypes.NSRange))
    with pytest.raises(BridgeError, match=r"argument 2 is an NSRange struct; it travels as two uint64 words"):
        raw(x86, as_struct, enc, "executeCommandsInBuffer:withRange:", icb, (0, 4))
    raw(x86, abi_prototype("executeCommandsInBuffer:withRange:", "x86_64"), enc,
        "executeCommandsInBuffer:withRange:", icb, 0, 4)


def test_truncated_handle_is_caught(x86: Scene) -> None:
    assert x86.queue >= 1 << 32 and x86.device >= 1 << 32
    cut = x86.queue & 0xFFFFFFFF
    with pytest.raises(BridgeError, match=rf"commandBuffer \(receiver\): unknown object {cut:#x} \(a 64-bit handle "
                                          r"cut to 32 bits\?\)"):
        x86.send(cut, "commandBuffer")
    cb = x86.send(x86.queue, "commandBuffer")
    with pytest.raises(BridgeError, match=r"encodeSignalEvent:value:: argument 1: unknown object .* cut to 32 bits"):
        x86.send(cb, "encodeSignalEvent:value:", x86.event & 0xFFFFFFFF, 1)


def test_truncated_addresses_and_sels_are_caught(x86: Scene) -> None:
    addr = x86.dev.malloc(16)
    assert addr >= 1 << 32
    with pytest.raises(BridgeError, match=r"not mapped \(a 64-bit address cut to 32 bits\?\)"):
        x86.dev.store(addr & 0xFFFFFFFF, dtypes.uint64, 1)
    sel = x86.m.sel("commandBuffer")
    assert sel >= 1 << 32
    with pytest.raises(BridgeError, match=r"not a registered SEL \(a 64-bit SEL cut to 32 bits\?\)"):
        x86.dev.msg_send(abi_prototype("commandBuffer", "x86_64"), (x86.queue, sel & 0xFFFFFFFF))
    buf = x86.buffer(64)
    assert x86.send(buf, "gpuAddress") >= 1 << 32 and x86.contents(buf) >= 1 << 32


def test_unknown_selector_is_refused(x86: Scene) -> None:
    sel = x86.dev.sel_registerName("frobnicate:")
    proto = Prototype(dtypes.void, (dtypes.id, dtypes.SEL, dtypes.uint64))
    with pytest.raises(BridgeError, match=r"unknown selector 'frobnicate:': it is not in mtlir.metal.SELECTORS"):
        x86.dev.msg_send(proto, (x86.queue, sel, 1))


def test_selector_the_class_does_not_answer(x86: Scene) -> None:
    buf = x86.buffer(64)
    with pytest.raises(BridgeError, match=r"-\[MTLBuffer commit\]: unrecognized selector sent to instance"):
        x86.send(buf, "commit")
    with pytest.raises(BridgeError, match=r"-\[MTLDevice contents\]: unrecognized selector"):
        x86.send(x86.device, "contents")


def test_wrong_argument_count_and_prototype(x86: Scene) -> None:
    proto = abi_prototype("newBufferWithLength:options:", "x86_64")
    with pytest.raises(BridgeError, match=r"newBufferWithLength:options:: wrong argument count: 1 after self and "
                                          r"_cmd, the prototype has 2"):
        raw(x86, proto, x86.device, "newBufferWithLength:options:", 64)
    short = Prototype(dtypes.id, (dtypes.id, dtypes.SEL, dtypes.uint64))
    with pytest.raises(BridgeError, match=r"wrong argument count: the call's prototype has 1 arguments after self "
                                          r"and _cmd, the selector takes 2"):
        raw(x86, short, x86.device, "newBufferWithLength:options:", 64)
    bad_ret = Prototype(dtypes.uint64, proto.args)
    with pytest.raises(BridgeError, match=r"returns id, the call's prototype says uint64"):
        raw(x86, bad_ret, x86.device, "newBufferWithLength:options:", 64, 0)
    int32 = Prototype(dtypes.id, (dtypes.id, dtypes.SEL, dtypes.uint32, dtypes.uint64))
    with pytest.raises(BridgeError, match=r"argument 1 is uint32 in the call's prototype, the selector takes uint64"):
        raw(x86, int32, x86.device, "newBufferWithLength:options:", 64, 0)


@pytest.mark.parametrize("value,match", [(-1, r"argument 1 = -1 does not fit uint64"),
                                         (1 << 64, r"does not fit uint64"),
                                         (1.5, r"argument 1 \(uint64\) must be an integer, got 1.5"),
                                         ("64", r"must be an integer")])
def test_values_that_do_not_fit(x86: Scene, value: object, match: str) -> None:
    with pytest.raises(BridgeError, match=match):
        raw(x86, abi_prototype("newBufferWithLength:options:", "x86_64"), x86.device, "newBufferWithLength:options:",
            value, 0)


def test_bool_argument_must_be_0_or_1(x86: Scene) -> None:
    desc = x86.send(x86.m.cls("MTLComputePipelineDescriptor"), "new")
    with pytest.raises(BridgeError, match=r"argument 1 = 2 does not fit bool"):
        x86.send(desc, "setSupportIndirectCommandBuffers:", 2)


def test_object_argument_of_the_wrong_class(x86: Scene) -> None:
    icb = x86.icb(1)
    cmd = x86.send(icb, "indirectComputeCommandAtIndex:", 0)
    with pytest.raises(BridgeError, match=r"setKernelBuffer:offset:atIndex:: argument 1 must be a MTLBuffer, got "
                                          r"MTLFence"):
        x86.send(cmd, "setKernelBuffer:offset:atIndex:", x86.fence, 0, 0)
    with pytest.raises(BridgeError, match=r"setComputePipelineState:: argument 1 is nil, expected a "
                                          r"MTLComputePipelineState"):
        x86.send(cmd, "setComputePipelineState:", 0)


@pytest.mark.parametrize("strict", [True, False])
def test_message_to_nil(strict: bool) -> None:
    s = Scene(strict)
    try:
        proto = abi_prototype("status", "x86_64")
        if strict:
            with pytest.raises(BridgeError, match=r"status sent to nil"):
                s.dev.msg_send(proto, (0, s.m.sel("status")))
        else:
            assert s.dev.msg_send(proto, (0, s.m.sel("status"))) == 0  # Objective-C: messages to nil return 0
            assert s.dev.msg_send(abi_prototype("GPUEndTime", "x86_64"), (0, s.m.sel("GPUEndTime"))) == 0.0
    finally:
        s.close()


def test_return_types(x86: Scene, arm: Scene) -> None:
    for s in (x86, arm):
        assert isinstance(s.send(s.event, "waitUntilSignaledValue:timeoutMS:", 0, 0), bool)
        cb = s.send(s.queue, "commandBuffer")
        assert isinstance(s.send(cb, "GPUStartTime"), float)
        assert s.send(cb, "status") == MTL.StatusNotEnqueued
        assert s.send(cb, "commit") is None


def test_c_calls() -> None:
    from mtlir.runtime.bridge.bridge import Bridge
    dev = SimDevice("x86_64", autorun=False)
    assert isinstance(dev, Bridge) and dev.bridge is dev
    p = c_prototype("MTLCreateSystemDefaultDevice")
    assert dev.c_call("MTLCreateSystemDefaultDevice", p, ()) == dev.device.handle
    with pytest.raises(BridgeError, match=r"unknown C function 'dlopen'"):
        dev.c_call("dlopen", p, ())
    with pytest.raises(BridgeError, match=r"MTLCreateSystemDefaultDevice: prototype .* differs"):
        dev.c_call("MTLCreateSystemDefaultDevice", c_prototype("objc_autoreleasePoolPush"), ())
    with pytest.raises(BridgeError, match=r"takes 0 arguments, got 1"):
        dev.c_call("MTLCreateSystemDefaultDevice", p, (1,))
    name = dev.malloc(16)
    dev.write(name, b"commit\0")
    sel = dev.c_call("sel_registerName", c_prototype("sel_registerName"), (name,))
    assert sel == dev.sel_registerName("commit") >= 1 << 32
    dev.write(name, b"NoSuchClass\0")
    with pytest.raises(BridgeError, match=r"objc_getClass\('NoSuchClass'\): no such class"):
        dev.c_call("objc_getClass", c_prototype("objc_getClass"), (name,))
    with pytest.raises(ValueError, match=r"unknown target 'ppc'"):
        SimDevice("ppc")


def test_every_selector_of_the_table_is_answered_by_some_class() -> None:
    from mtlir.metal import SELECTORS
    from mtlir.runtime.sim import objects
    from mtlir.runtime.sim.device import METHODS
    classes = [c for c in vars(objects).values() if isinstance(c, type) and issubclass(c, objects.SimObject)]
    missing = [sel for sel in SELECTORS if not any(METHODS.lookup(c, sel) for c in classes)]
    assert missing == []


def test_a_method_table_answers_through_base_classes_and_refuses_a_selector_defined_twice() -> None:
    from mtlir.runtime.sim.msgsend import MethodTable

    class Base:
        pass

    class Derived(Base):
        pass

    def answer(dev: object, obj: object) -> int:
        return 1

    one, two = MethodTable(), MethodTable()
    one.add(Base, "length", answer)
    two.add(Derived, "length", answer, lockless=True)
    assert one.lookup(Derived, "length") is not None and one.lookup(Derived, "contents") is None
    joined = MethodTable.join(one, two)
    got = joined.lookup(Derived, "length")
    assert got is not None and got.lockless and joined.lookup(Base, "length") is not None
    with pytest.raises(ValueError, match=r"-\[Base length\] is defined twice"):
        MethodTable.join(one, one)


def test_a_selector_resolved_before_is_still_checked_in_full(x86: Scene) -> None:
    """msg_send keeps what a selector resolved to per receiver class (its fast path): after a good message, the same
    selector with a wrong prototype, count, value, argument class or a deallocated receiver is still refused."""
    proto = abi_prototype("newBufferWithLength:options:", "x86_64")
    raw(x86, proto, x86.device, "newBufferWithLength:options:", 64, 0)  # resolved: the fast path from now on
    with pytest.raises(BridgeError, match=r"wrong argument count: 1 after self and _cmd"):
        raw(x86, proto, x86.device, "newBufferWithLength:options:", 64)
    int32 = Prototype(dtypes.id, (dtypes.id, dtypes.SEL, dtypes.uint32, dtypes.uint64))
    with pytest.raises(BridgeError, match=r"argument 1 is uint32 in the call's prototype"):
        raw(x86, int32, x86.device, "newBufferWithLength:options:", 64, 0)
    with pytest.raises(BridgeError, match=r"argument 1 = -1 does not fit uint64"):
        raw(x86, proto, x86.device, "newBufferWithLength:options:", -1, 0)
    for value in (1.5, "64"):  # the generated fast path takes ints alone: anything else gets the full decoding
        with pytest.raises(BridgeError, match=r"argument 1 \(uint64\) must be an integer"):
            raw(x86, proto, x86.device, "newBufferWithLength:options:", value, 0)
    icb = x86.icb(1)
    cmd = x86.send(icb, "indirectComputeCommandAtIndex:", 0)
    buf = x86.buffer(64)
    x86.send(cmd, "setKernelBuffer:offset:atIndex:", buf, 0, 0)
    with pytest.raises(BridgeError, match=r"argument 1 must be a MTLBuffer, got MTLFence"):
        x86.send(cmd, "setKernelBuffer:offset:atIndex:", x86.fence, 0, 0)
    x86.send(cmd, "setKernelBuffer:offset:atIndex:", 0, 0, 0)  # nil, which this argument accepts
    size = abi_prototype("concurrentDispatchThreadgroups:threadsPerThreadgroup:", "x86_64")
    raw(x86, size, cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (4, 1, 1))
    with pytest.raises(BridgeError, match=r"an MTLSize has 3 fields, got 4"):
        raw(x86, size, cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1, 1), (4, 1, 1))
    with pytest.raises(BridgeError, match=r"does not fit uint64"):
        raw(x86, size, cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, -1, 1), (4, 1, 1))
    x86.send(buf, "length")  # a lockless getter, resolved
    x86.send(buf, "release")
    with pytest.raises(BridgeError, match=r"deallocated"):
        x86.send(buf, "length")
    with pytest.raises(BridgeError, match=r"deallocated"):
        x86.send(cmd, "setKernelBuffer:offset:atIndex:", buf, 0, 0)


def test_a_sender_answers_and_refuses_as_msg_send(x86: Scene) -> None:
    """``SimDevice.sender(proto, sel)`` (what a compiled replay sends through) keeps every check of msg_send per
    message: a bad count or value, an argument of the wrong class, a deallocated receiver, a receiver of another
    class, a prototype or SEL msg_send refuses (refused at the message, not when the sender is made), an error the
    device deferred, a closed device; and a subclass's own msg_send is still called."""
    dev = x86.dev
    proto = abi_prototype("newBufferWithLength:options:", "x86_64")
    new_buffer = dev.sender(proto, x86.m.sel("newBufferWithLength:options:"))
    for _ in range(2):  # the first message takes msg_send's full path, the second the sender's own
        buf = new_buffer((x86.device, x86.m.sel("newBufferWithLength:options:"), 64, 0))
        assert isinstance(dev.object(buf), Buffer) and dev.object(buf).length == 64
    with pytest.raises(BridgeError, match=r"wrong argument count: 1 after self and _cmd"):
        new_buffer((x86.device, x86.m.sel("newBufferWithLength:options:"), 64))
    with pytest.raises(BridgeError, match=r"argument 1 = -1 does not fit uint64"):
        new_buffer((x86.device, x86.m.sel("newBufferWithLength:options:"), -1, 0))
    with pytest.raises(BridgeError, match=r"unrecognized selector sent to instance"):
        new_buffer((x86.fence, x86.m.sel("newBufferWithLength:options:"), 64, 0))  # a class that does not answer it
    int32 = Prototype(dtypes.id, (dtypes.id, dtypes.SEL, dtypes.uint32, dtypes.uint64))
    wrong = dev.sender(int32, x86.m.sel("newBufferWithLength:options:"))  # made: refused at each message
    with pytest.raises(BridgeError, match=r"argument 1 is uint32 in the call's prototype"):
        wrong((x86.device, x86.m.sel("newBufferWithLength:options:"), 64, 0))
    unknown = dev.sender(proto, 0x1234)
    with pytest.raises(BridgeError, match=r"not a registered SEL"):
        unknown((x86.device, 0x1234, 64, 0))
    set_buffer = dev.sender(abi_prototype("setKernelBuffer:offset:atIndex:", "x86_64"),
                            x86.m.sel("setKernelBuffer:offset:atIndex:"))
    cmd = x86.send(x86.icb(1), "indirectComputeCommandAtIndex:", 0)
    sel = x86.m.sel("setKernelBuffer:offset:atIndex:")
    for _ in range(2):
        set_buffer((cmd, sel, buf, 0, 0))
    with pytest.raises(BridgeError, match=r"argument 1 must be a MTLBuffer, got MTLFence"):
        set_buffer((cmd, sel, x86.fence, 0, 0))
    release = dev.sender(abi_prototype("release", "x86_64"), x86.m.sel("release"))
    other = x86.buffer(64)
    release((other, x86.m.sel("release")))
    release((x86.send(x86.device, "newFence"), x86.m.sel("release")))  # another receiver class, same sender
    with pytest.raises(BridgeError, match=r"deallocated"):
        set_buffer((cmd, sel, other, 0, 0))
    with pytest.raises(BridgeError, match=r"message sent to deallocated instance"):
        release((other, x86.m.sel("release")))
    dev.defer_error(MetalValidationError("a fault the GPU found"))
    with pytest.raises(MetalValidationError, match="a fault the GPU found"):
        set_buffer((cmd, sel, buf, 0, 0))
    set_buffer((cmd, sel, buf, 0, 0))  # reported once
    dev.close()
    with pytest.raises(DeviceClosedError, match="is closed"):
        set_buffer((cmd, sel, buf, 0, 0))


def test_a_sender_calls_a_subclass_s_own_msg_send() -> None:
    seen: list[int] = []

    class Counting(SimDevice):
        def msg_send(self, proto: Prototype, args: tuple[object, ...]) -> object:
            seen.append(int(args[1]))  # type: ignore[call-overload]
            return super().msg_send(proto, args)

    with Counting("x86_64") as dev:
        sel = dev.sel_registerName("newFence")
        send = dev.sender(abi_prototype("newFence", "x86_64"), sel)
        dev_handle = dev.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ())
        send((dev_handle, sel))
        send((dev_handle, sel))
        assert seen == [sel, sel]


def test_a_getter_answers_and_refuses_as_msg_send(x86: Scene) -> None:
    """``SimDevice.getter(proto, sel)`` (a Session's wait: status, GPU times, release) is ``msg_send`` of
    ``(receiver, sel)`` with its checks per message, generated once the first receiver class is known."""
    dev = x86.dev
    status = dev.getter(abi_prototype("status", "x86_64"), x86.m.sel("status"))
    release = dev.getter(abi_prototype("release", "x86_64"), x86.m.sel("release"))
    assert dev.getter(abi_prototype("status", "x86_64"), x86.m.sel("status")) is status  # one per pair
    cbs = [x86.send(x86.queue, "commandBuffer") for _ in range(3)]
    for cb in cbs:
        x86.send(cb, "retain")
        assert status(cb) == MTL.StatusNotEnqueued  # the first takes msg_send's full path, the others inline
    release(cbs[0])
    release(cbs[0])  # +1 of commandBuffer without a pool (leaked, as Objective-C does) and +1 of the retain
    with pytest.raises(BridgeError, match=r"message sent to deallocated instance"):
        status(cbs[0])
    with pytest.raises(BridgeError, match=r"unrecognized selector sent to instance"):
        status(x86.fence)  # a receiver of another class: msg_send's path and its error
    with pytest.raises(BridgeError, match=r"is a handle of another SimDevice"):
        release(0x7000_0000_0000)
    dev.defer_error(MetalValidationError("a fault the GPU found"))
    with pytest.raises(MetalValidationError, match="a fault the GPU found"):
        status(cbs[1])
    assert status(cbs[1]) == MTL.StatusNotEnqueued
    release(cbs[1])
    dev.close()
    with pytest.raises(DeviceClosedError, match="is closed"):
        release(cbs[2])
