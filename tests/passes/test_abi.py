"""abi: every MSG becomes a CALL of objc_msgSend with the selector's exact prototype per target; structs travel as
METAL.md §2 says; a missing selector or arguments that do not fit raise AbiError naming selector and argument."""
from __future__ import annotations

import re

import pytest

from mtlir.ir.dtypes import DType, PtrDType, dtypes
from mtlir.metal import SELECTORS, AbiError, DeviceSpec, Obj, abi_prototype
from mtlir.ir.ops import Ops
from mtlir.passes.abi import Abi
from mtlir.passes.pipeline import PassContext
from mtlir.ir.uop import UOp

ENC = UOp(Ops.OBJECT, dtypes.id, (), Obj("queue", "enc"))
N = UOp.variable("n", 1, 100)


def run(*msgs: UOp, target: str = "arm64") -> UOp:
    p = Abi(target)
    out = p.apply(UOp.sink(*msgs, arg=DeviceSpec()), PassContext())
    p.verify(out)
    return out


def msg(selector: str, *args: UOp, recv: UOp = ENC, dtype: DType | None = None) -> UOp:
    return UOp(Ops.MSG, dtype or SELECTORS[selector].ret, (recv, *args), selector)


def _dummy(dt: DType) -> UOp:
    if dt is dtypes.id:
        return ENC
    if isinstance(dt, PtrDType):
        return UOp(Ops.OBJECT, dtypes.id.ptr(), (), Obj("scratch", "scratch:t", (8,)))
    if dt in (dtypes.MTLSize, dtypes.NSRange):
        return UOp.struct(dt, *([2] * len(dt.fields)))  # type: ignore[attr-defined]
    return UOp.const(dt, 1)


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
@pytest.mark.parametrize("selector", sorted(SELECTORS))
def test_every_selector_lowers_to_its_exact_prototype(selector: str, target: str) -> None:
    m = msg(selector, *(_dummy(a) for a in SELECTORS[selector].args))
    call = run(m, target=target).src[0]
    proto = abi_prototype(selector, target)
    assert call.op is Ops.CALL and call.arg == ("objc_msgSend", selector, proto) and call.dtype is proto.ret
    assert call.src[0] is ENC and call.src[1].dtype is dtypes.SEL and call.src[1].arg == selector
    assert len(call.src) == len(proto.args)
    for s, want in zip(call.src, proto.args):
        assert s.dtype is want or (isinstance(want, PtrDType) and want.base is dtypes.void)


def test_nsrange_is_two_words_on_both_targets() -> None:
    icb = UOp(Ops.OBJECT, dtypes.id, (), Obj("icb", "icb"))
    for target in ("arm64", "x86_64"):
        call = run(msg("executeCommandsInBuffer:withRange:", icb, UOp.struct(dtypes.NSRange, N.cast(dtypes.uint64), 5)),
                   target=target).src[0]
        assert call.src[2:] == (icb, N.cast(dtypes.uint64), UOp.const(dtypes.uint64, 5))


def test_mtlsize_arm64_constant_is_a_link_time_copy() -> None:
    size = UOp.struct(dtypes.MTLSize, 4, 2, 1)
    call = run(msg("dispatchThreadgroups:threadsPerThreadgroup:", size, size)).src[0]
    assert call.src[2] is call.src[3]
    assert call.src[2].op is Ops.OBJECT and call.src[2].dtype is PtrDType(dtypes.MTLSize)
    assert call.src[2].arg == Obj("struct", "mtlsize[4,2,1]", (4, 2, 1))


def test_mtlsize_arm64_runtime_is_a_scratch_copy_written_before_the_call() -> None:
    grid = UOp.struct(dtypes.MTLSize, N.cast(dtypes.uint64), 1, 1)
    call = run(msg("dispatchThreadgroups:threadsPerThreadgroup:", grid, UOp.struct(dtypes.MTLSize, 32, 1, 1))).src[0]
    arg = call.src[2]
    assert arg.op is Ops.AFTER and arg.dtype is PtrDType(dtypes.MTLSize)
    stores = arg.src[1:]
    assert len(stores) == 3 and all(s.op is Ops.STORE for s in stores)
    assert [s.src[1] for s in stores] == [N.cast(dtypes.uint64), UOp.const(dtypes.uint64, 1), UOp.const(dtypes.uint64, 1)]
    scratch = arg.src[0].src[0]
    assert scratch.op is Ops.OBJECT and scratch.arg.kind == "scratch" and scratch.arg.payload == (24,)


def test_mtlsize_x86_64_is_the_struct_by_value() -> None:
    grid = UOp.struct(dtypes.MTLSize, N, 1, 1)  # an int32 field is widened to the NSUInteger it is
    call = run(msg("dispatchThreadgroups:threadsPerThreadgroup:", grid, grid), target="x86_64").src[0]
    assert call.src[2] is UOp.struct(dtypes.MTLSize, N.cast(dtypes.uint64), 1, 1) and call.src[3] is call.src[2]


def test_integer_arguments_are_cast_to_the_declared_type() -> None:
    buf = UOp(Ops.OBJECT, dtypes.id, (), Obj("buffer", "buffer:x", (64,)))
    call = run(msg("setBuffer:offset:atIndex:", buf, N, UOp.const(dtypes.int32, 2))).src[0]
    assert call.src[3] is N.cast(dtypes.uint64) and call.src[4].op is Ops.CAST


def test_tags_survive() -> None:
    m = UOp(Ops.MSG, dtypes.uint64, (ENC,), "signaledValue", "timeline")
    assert run(m).src[0].tag == "timeline"


@pytest.mark.parametrize("bad, message", [
    (msg("frobnicate:", ENC, dtype=dtypes.void), "selector 'frobnicate:' is not in the selector table"),
    (msg("waitForFence:"), "waitForFence:: takes 1 arguments (id), got 0"),
    (msg("commit", ENC), "commit: takes 0 arguments (none), got 1"),
    (msg("commit", recv=UOp.const(dtypes.uint64, 5)), "commit: the receiver must be an object (id), got a uint64"),
    (msg("waitForFence:", UOp.const(dtypes.uint64, 5)), "waitForFence:: argument 0 must be an object (id)"),
    (msg("dispatchThreadgroups:threadsPerThreadgroup:", UOp.const(dtypes.uint64, 1), UOp.struct(dtypes.MTLSize, 1, 1, 1)),
     "argument 0 must be an MTLSize, got a uint64"),
    (msg("useResources:count:usage:", ENC, UOp.const(dtypes.uint64, 1), UOp.const(dtypes.uint64, 3)),
     "argument 0 must be a pointer (void*), got a id"),
    (msg("encodeSignalEvent:value:", ENC, UOp.const(dtypes.float64, 1.0)), "argument 1 must be a uint64, got a float64"),
    (msg("commandBuffer", dtype=dtypes.uint64), "commandBuffer: the MSG is typed uint64 but the selector returns id"),
])
def test_arguments_that_do_not_fit_raise_abi_error(bad: UOp, message: str) -> None:
    with pytest.raises(AbiError) as e:
        run(bad)
    assert message in str(e.value)


def test_unknown_target() -> None:
    with pytest.raises(ValueError, match="unknown target 'ppc'"):
        Abi("ppc")


# ---- MSGS: void messages to one receiver as data (the direct path's commands) become one CALLS


def msgs(*entries: tuple[str, tuple[int, ...]], operands: tuple[UOp, ...]) -> UOp:
    from mtlir.program.payloads import MessageList
    return UOp(Ops.MSGS, dtypes.void, (ENC, *operands), MessageList(entries))


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_msgs_become_calls_with_each_prototype(target: str) -> None:
    size = UOp.struct(dtypes.MTLSize, N.cast(dtypes.uint64), 1, 1)
    m = msgs(("setBuffer:offset:atIndex:", (1, 2, 3)), ("dispatchThreadgroups:threadsPerThreadgroup:", (4, 4)),
             ("setBuffer:offset:atIndex:", (1, 2, 3)), operands=(ENC, UOp.const(dtypes.uint32, 8),
                                                                  UOp.const(dtypes.uint64, 1), size))
    (calls,) = [u for u in run(m, target=target).toposort() if u.op is Ops.CALLS]
    assert [c[1] for c in calls.arg] == ["setBuffer:offset:atIndex:", "dispatchThreadgroups:threadsPerThreadgroup:",
                                         "setBuffer:offset:atIndex:"]
    for fn, selector, proto, refs in calls.arg:
        assert fn == "objc_msgSend" and proto == abi_prototype(selector, target) and refs[0] == 0
        assert [calls.src[r].dtype for r in refs] == list(proto.args)  # the offset was cast to uint64
    assert calls.arg[0] is calls.arg[2]  # a repeated message is converted once
    assert (size in calls.src) is (target == "x86_64")  # arm64 passes a pointer to a copy, not the STRUCT


@pytest.mark.parametrize("entries, operands, message", [
    ((("commandBuffer", ()),), (), "commandBuffer: returns id; an MSGS holds void messages only"),
    ((("setBuffer:offset:atIndex:", (1,)),), (ENC,), "setBuffer:offset:atIndex:: takes 3 arguments"),
    ((("setBuffer:offset:atIndex:", (1, 1, 1)),), (ENC,), "argument 1 must be a uint64, got a id"),
    ((("noSuchSelector:", (1,)),), (ENC,), "'noSuchSelector:' is not in the selector table"),
])
def test_msgs_that_do_not_fit_raise_abi_error(entries: tuple, operands: tuple[UOp, ...], message: str) -> None:
    with pytest.raises(AbiError, match=re.escape(message)):
        run(msgs(*entries, operands=operands))


def test_verify_names_a_bad_msgs() -> None:
    from mtlir.passes.verify import VerifyError, verify_graph
    with pytest.raises(VerifyError, match=r"argument indices must name sources 1..1, got \(5,\)"):
        verify_graph(UOp.sink(msgs(("setComputePipelineState:", (5,)), operands=(ENC,))), "encode")
    with pytest.raises(VerifyError, match="an MSGS is left after abi"):
        verify_graph(UOp.sink(msgs(("setComputePipelineState:", (1,)), operands=(ENC,))), "abi")
