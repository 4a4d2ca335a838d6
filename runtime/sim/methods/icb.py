"""Handlers of indirect command buffers: ``newIndirectCommandBufferWithDescriptor:...``, its descriptor,
``indirectComputeCommandAtIndex:`` and the compute command setters (METAL.md §1 "The ICB is built once").

Every setter is a CPU write into the ICB (shared memory on a Mac): rule 15 is checked on each (strict mode refuses
a write to a command an in-flight command buffer executes; faithful mode lets the GPU see whatever is there when
it gets to the command). Rule 8 at the call: the command index, the bind index against maxKernelBufferBindCount,
offsets stored as 32 bits (faithful mode keeps the low 32 bits, as the hardware does, and the kernel silently
reads the wrong place). Strict mode checks a command's sizes as soon as its pipeline and sizes are set
(``checks.size_problem``: rule 13, fewer than 2**32 threads per grid axis); faithful mode leaves them to the GPU.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mtlir.metal import MTL
from mtlir.errors import BridgeError
from mtlir.runtime.sim.msgsend import NIL, MethodTable
from mtlir.runtime.sim.rules.checks import check_icb_write, size_problem
from mtlir.runtime.sim.objects import ICB, Buffer, Device, ICBCommand, ICBDescriptor, ICBSlot, Pipeline
from mtlir.runtime.sim.rules.rule import Call, Rule, violation

if TYPE_CHECKING:
    from mtlir.runtime.sim.device import SimDevice

__all__ = ["METHODS"]

METHODS = MethodTable()  # the handlers of this module (SimDevice joins them with the others)


# ---------------------------------------------------------------------------- the descriptor
@METHODS.method(ICBDescriptor, "setCommandTypes:")
def _set_types(dev: SimDevice, d: ICBDescriptor, types: int) -> None:
    d.command_types = types


@METHODS.method(ICBDescriptor, "setInheritBuffers:")
def _set_inherit_buffers(dev: SimDevice, d: ICBDescriptor, flag: int) -> None:
    d.inherit_buffers = bool(flag)


@METHODS.method(ICBDescriptor, "setInheritPipelineState:")
def _set_inherit_pipeline(dev: SimDevice, d: ICBDescriptor, flag: int) -> None:
    d.inherit_pipeline = bool(flag)


@METHODS.method(ICBDescriptor, "setMaxKernelBufferBindCount:")
def _set_max_bind(dev: SimDevice, d: ICBDescriptor, n: int) -> None:
    d.max_bind = n


@METHODS.method(Device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", ICBDescriptor)
def _new_icb(dev: SimDevice, d: Device, desc: ICBDescriptor, max_count: int, options: int) -> ICB | None:
    """The ICB (+1), or nil: on a device without ICB support, for zero commands, or (faithful mode) for a
    descriptor the simulator does not model, or when an injected fault makes the allocation fail
    (``SimDevice.inject("alloc:icb")``); strict mode names what is wrong with the descriptor."""
    call = Call("newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", d, desc, max_count, options)
    if not dev.spec.icb or max_count == 0:
        return None
    problem: tuple[Rule, str] | None = None
    if not desc.command_types & MTL.IndirectCommandTypeConcurrentDispatch:
        problem = (Rule.API_VALIDATION,
                   f"commandTypes {desc.command_types:#x} lacks ConcurrentDispatch "
                   f"({MTL.IndirectCommandTypeConcurrentDispatch:#x}), the only compute command type modelled")
    elif desc.inherit_buffers or desc.inherit_pipeline:
        problem = (Rule.API_VALIDATION, "inheritBuffers and inheritPipelineState must be NO: ICB commands set their "
                   "own pipeline and buffers (METAL.md §1)")
    elif desc.max_bind > MTL.MAX_BUFFER_BIND:
        problem = (Rule.ICB_LIMITS, f"maxKernelBufferBindCount {desc.max_bind} is above {MTL.MAX_BUFFER_BIND}")
    elif max_count > 1 << 24:
        problem = (Rule.ICB_LIMITS, f"maxCommandCount {max_count} is more than the simulator models (2**24)")
    if problem is not None:
        if dev.strict:
            raise violation(problem[0], call, problem[1])
        return None
    if dev.faults.allocation_fails("icb"):  # an injected nil (SimDevice.inject("alloc:icb"))
        return None
    return dev.new(ICB(max_count, desc.max_bind, desc.command_types))  # type: ignore[no-any-return]


@METHODS.method(ICB, "indirectComputeCommandAtIndex:")
def _command_at(dev: SimDevice, icb: ICB, index: int) -> ICBCommand:
    """Command ``index`` (+0). Past maxCommandCount strict mode raises (rule 8); faithful mode returns a command
    whose writes land outside the ICB and are lost."""
    if index >= icb.max_count:
        if dev.strict:
            raise violation(Rule.ICB_LIMITS, Call("indirectComputeCommandAtIndex:", icb, index),
                            f"index {index} is not below maxCommandCount {icb.max_count}")
        return dev.new_autoreleased(ICBCommand(icb, None))  # type: ignore[no-any-return]
    return dev.new_autoreleased(ICBCommand(icb, index))  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- the compute command
def _slot(dev: SimDevice, cmd: ICBCommand, selector: str, *args: object) -> ICBSlot | None:
    """The slot a setter writes (None: out of range, lost), after the rule-15 check of strict mode. A setter that
    changes the slot bumps the ICB's version (``_changed``); one that writes what is there already leaves it, so
    what is cached per version (the range analysis, the kept launches) stays valid: a Session patches its
    commands with the values they had at every submit. ``selector`` and ``args``: the call, for the errors (its
    ``Call`` is made only for one: a Session's submit sends several setters)."""
    icb = cmd.icb
    if not icb.alive:
        raise BridgeError(f"{Call(selector, cmd, *args)}: the ICB of this command was deallocated "
                          f"({icb.describe()})")
    if dev.strict and icb.readers:  # rule 15 needs a command buffer in flight that reads the ICB
        check_icb_write(dev, cmd, Call(selector, cmd, *args))
    if cmd.index is None:
        return None
    return cmd.icb.slots[cmd.index]


def _changed(cmd: ICBCommand) -> None:
    cmd.icb.version += 1


def _check_sizes(dev: SimDevice, grid: tuple[int, int, int] | None, tg: tuple[int, int, int], p: Pipeline | None,
                 call: Call) -> None:
    """Strict: the sizes a setter is about to leave in a command against Metal's limits (``checks.size_problem``:
    rule 13, 2**32 threads per grid axis), before it changes anything. Faithful mode lets the GPU meet them."""
    if dev.strict and grid is not None:
        problem = size_problem(grid, tg, p)
        if problem is not None:
            raise violation(problem[0], call, problem[1])


@METHODS.method(ICBCommand, "setComputePipelineState:", Pipeline)
def _cmd_pipeline(dev: SimDevice, cmd: ICBCommand, p: Pipeline) -> None:
    call = Call("setComputePipelineState:", cmd, p)
    if dev.strict and not p.support_icb:
        raise violation(Rule.API_VALIDATION, call,
                        f"{p.describe()} was made without supportIndirectCommandBuffers = YES: pipelines "
                        "an ICB uses need it (METAL.md §1)")
    slot = _slot(dev, cmd, "setComputePipelineState:", p)
    if slot is not None:
        _check_sizes(dev, slot.grid, slot.threadgroup, p, call)
        if slot.pipeline is not p:
            slot.pipeline = p
            _changed(cmd)


_SET_BUFFER = "setKernelBuffer:offset:atIndex:"


@METHODS.method(ICBCommand, _SET_BUFFER, (Buffer, NIL))
def _cmd_buffer(dev: SimDevice, cmd: ICBCommand, buf: Buffer | None, offset: int, index: int) -> None:
    if index >= cmd.icb.max_bind:
        if dev.strict:
            raise violation(Rule.ICB_LIMITS, Call(_SET_BUFFER, cmd, buf, offset, index),
                            f"index {index} is not below maxKernelBufferBindCount {cmd.icb.max_bind}")
        _slot(dev, cmd, _SET_BUFFER, buf, offset, index)
        return  # the ICB has no slot for it: the binding is lost
    if offset > 0xFFFFFFFF:
        if dev.strict:
            raise violation(Rule.ICB_LIMITS, Call(_SET_BUFFER, cmd, buf, offset, index),
                            f"offset {offset:#x} does not fit the 32 bits an ICB command stores it in "
                            "(tinygrad PR #15129): the kernel would read at the wrong place")
        offset &= 0xFFFFFFFF
    if dev.strict and buf is not None and offset >= buf.length:
        raise violation(Rule.API_VALIDATION, Call(_SET_BUFFER, cmd, buf, offset, index),
                        f"offset({offset}) must be < [buffer length]({buf.length})")
    slot = _slot(dev, cmd, _SET_BUFFER, buf, offset, index)
    if slot is None:
        return
    old = slot.bindings.get(index)
    if buf is None:
        if old is not None:
            del slot.bindings[index]
            _changed(cmd)
    elif old is None or old[0] is not buf or old[1] != offset:
        slot.bindings[index] = (buf, offset)
        _changed(cmd)


_DISPATCH = "concurrentDispatchThreadgroups:threadsPerThreadgroup:"


@METHODS.method(ICBCommand, _DISPATCH)
def _cmd_dispatch(dev: SimDevice, cmd: ICBCommand, grid: tuple[int, int, int], tg: tuple[int, int, int]) -> None:
    slot = _slot(dev, cmd, _DISPATCH, grid, tg)
    if slot is not None:
        p = slot.pipeline
        checked = (grid, tg, p, p.max_threads if p is not None else None)
        if slot.sizes_ok != checked:  # a Session patches each command with the sizes it had at every submit
            _check_sizes(dev, grid, tg, p, Call(_DISPATCH, cmd, grid, tg))
            slot.sizes_ok = checked if dev.strict else None
        if slot.grid != grid or slot.threadgroup != tg:
            slot.grid, slot.threadgroup = grid, tg
            _changed(cmd)


@METHODS.method(ICBCommand, "setBarrier")
def _cmd_barrier(dev: SimDevice, cmd: ICBCommand) -> None:
    slot = _slot(dev, cmd, "setBarrier")
    if slot is not None and not slot.barrier:
        slot.barrier = True
        _changed(cmd)
