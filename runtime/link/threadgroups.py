"""Link's check of every constant threadgroup against its pipeline's ``maxTotalThreadsPerThreadgroup`` (it can be
below 1024; Metal drops a dispatch above it silently: METAL.md §3 rule 13): the ICB's commands (``make_icb`` asks
per command) and the direct path's ``dispatchThreadgroups:threadsPerThreadgroup:`` messages
(``check_direct_dispatches``). Sizes set per submit are the device's to check: the simulated device raises in
strict mode."""
from __future__ import annotations

import math

from mtlir.errors import LinkError
from mtlir.program.instructions import Struct
from mtlir.program.program import Program
from mtlir.runtime.link.state import LinkState

__all__ = ["check_threadgroup", "check_direct_dispatches", "const_size"]


def check_threadgroup(ls: LinkState, where: str, pipeline: str, threadgroup: tuple[int, ...]) -> None:
    """A constant threadgroup against its pipeline's ``maxTotalThreadsPerThreadgroup`` (asked once per
    pipeline): ``LinkError`` naming ``where`` when it is above."""
    limit = ls.max_threads.get(pipeline)
    if limit is None:
        limit = ls.max_threads[pipeline] = int(ls.messenger.send(ls.out.handles[pipeline],
                                                                 "maxTotalThreadsPerThreadgroup"))
    if math.prod(threadgroup) > limit:
        raise LinkError(f"{where}: threadgroup {list(threadgroup)} = {math.prod(threadgroup)} threads is more than "
                        f"the pipeline's maxTotalThreadsPerThreadgroup {limit} (Metal would drop the dispatch "
                        "silently: METAL.md §3 rule 13)")


def check_direct_dispatches(ls: LinkState) -> None:
    """The direct path's ``dispatchThreadgroups:threadsPerThreadgroup:`` messages whose threadgroup is a
    constant, against the pipeline the encoder had bound when they are sent (``setComputePipelineState:`` of a
    pipeline placeholder; a pipeline taken from a register at run time, e.g. a table, leaves the dispatches
    after it to the device's own check). Empty dispatches (the warm-up) are skipped."""
    p = ls.program
    structs: dict[int, Struct] | None = None
    current: str | None = None
    for c in p.calls():
        if c.selector == "setComputePipelineState:":
            recv = p.objects.get(c.receiver)
            if recv is not None and recv.kind == "icbcmd":
                continue  # an ICB command, not the encoder (checked in make_icb)
            arg = p.objects.get(c.args[0]) if c.args else None
            current = arg.name if arg is not None and arg.kind == "pipeline" else None
        elif c.selector == "dispatchThreadgroups:threadsPerThreadgroup:" and current is not None:
            if structs is None:
                structs = {ins.dst: ins for ins in p.instrs if type(ins) is Struct}
            grid, tg = (const_size(p, r, structs) for r in c.args[:2])
            if tg is not None and 0 not in tg and (grid is None or 0 not in grid):
                check_threadgroup(ls, f"dispatch at instruction {c.pc} ({current})", current, tg)


def const_size(p: Program, reg: int, structs: dict[int, Struct]) -> tuple[int, ...] | None:
    """The MTLSize register ``reg`` of ``p`` holds when it is a constant: a 3-tuple constant (x86_64), a ``struct``
    placeholder (a host copy on arm64) or a STRUCT of constants (``structs``: the Struct instructions by
    destination register); None when it is set at run time."""
    value = p.consts.get(reg)
    if value is None and reg in p.objects and p.objects[reg].kind == "struct":
        value = p.objects[reg].payload
    if value is None:
        ins = structs.get(reg)
        if ins is not None and all(type(p.consts.get(r)) is int for r in ins.fields):
            value = tuple(p.consts[r] for r in ins.fields)
    if isinstance(value, tuple) and len(value) == 3 and all(type(v) is int for v in value):
        return value
    return None
