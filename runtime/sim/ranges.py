"""Whole ICB ranges run again without their per-command checks (``RangeBatch``, kept by ``executor.Executor``).

An ``executeCommandsInBuffer:withRange:`` runs each command of the range through the full checks (its pipeline,
warm-up, sizes, bindings, residency: ``Executor._icb_command``) and adds its launch to the batch. A Program replayed
with the same ICB content runs the same range again and again: once a range ran without a fault, what it added to
the batch is kept as a ``RangeBatch`` on the ICB, and the next run of the same range takes it whole while nothing
those checks read has changed:

- the ICB's ``version`` (every CPU write that changes a command bumps it: ``methods.icb``), so every command's
  pipeline, sizes and bindings are what they were;
- every pipeline of the range is alive, has the ``maxTotalThreadsPerThreadgroup`` it had (a dispatch over it is
  dropped, rule 13) and, on a family that needs the warm-up (rule 16), was bound by this encoder;
- every buffer the range's commands bind is alive (rule 14) and resident for this encoder or command buffer
  (rule 10);
- the order is the default adversarial one (reverse within barriers: the same at every run; a shuffled order,
  ``order_seed``, and armed fault injection take the full path).

Anything else takes the full path, which raises the fault the change causes. The check is per distinct pipeline
and buffer, not per command: a range of 200 dispatches over 10 buffers costs 10 set lookups, not 200 command
checks (docs/simulator.md, "Replaying ICB ranges").
"""
from __future__ import annotations

from typing import Any

from mtlir.runtime.sim.kernels.launch import MAX_BATCH
from mtlir.runtime.sim.objects import ICB, Buffer, CommandBuffer, Encoder, Execute, Pipeline

__all__ = ["RangeBatch", "Recording", "build_range"]


class RangeBatch:
    """One ICB range's batch as it last ran: ``items`` (what ``Executor._run`` added to the batch, in the GPU's
    order: (launch, pipeline, what)), ``dispatches`` (the dispatches that ran, a zero-size or dropped one not
    counted), the ICB ``version`` it holds for, the ``pipelines`` with the thread limit they had and the
    ``buffers`` the commands bind. ``chunks``: the items cut into the batches the kernel runner gets (at most
    ``batch`` each), with each batch's launches, made once here instead of at every run."""

    __slots__ = ("version", "items", "dispatches", "pipelines", "buffers", "chunks")

    def __init__(self, version: int, items: list[tuple[Any, Pipeline, str]], dispatches: int,
                 pipelines: dict[Pipeline, int], buffers: tuple[Buffer, ...], batch: int = MAX_BATCH) -> None:
        self.version, self.items, self.dispatches = version, items, dispatches
        self.pipelines, self.buffers = pipelines, buffers
        self.chunks = [(items[i:i + batch], [item[0] for item in items[i:i + batch]])
                       for i in range(0, len(items), batch)]

    def usable(self, icb: ICB, ex: Execute, enc: Encoder, cb: CommandBuffer, warmup: bool) -> bool:
        """Whether the range may run as kept (the module docstring's conditions); False sends it through the
        full checks."""
        if icb.version != self.version:
            return False
        bound = ex.bound_pipelines
        for p, limit in self.pipelines.items():
            if not p.alive or p.max_threads != limit or (warmup and p not in bound):
                return False
        used, resident = enc.used, cb.resident
        for b in self.buffers:
            if not b.alive or not (b in used or b in resident):
                return False
        return True


class Recording:
    """What a range running through the full checks added to the batch (``items``) and the dispatches that ran
    (``dispatches``): ``Executor._run`` appends to it."""

    __slots__ = ("items", "dispatches")

    def __init__(self) -> None:
        self.items: list[tuple[Any, Pipeline, str]] = []
        self.dispatches = 0


def build_range(icb: ICB, order: list[int], rec: Recording) -> RangeBatch | None:
    """The ``RangeBatch`` of a range that just ran in full without a fault over the commands ``order`` (the
    GPU's order), from its ``Recording``; None when a command has no pipeline (it faulted: nothing to keep)."""
    pipelines: dict[Pipeline, int] = {}
    buffers: dict[Buffer, None] = {}
    for i in order:
        slot = icb.slots.get(i)
        if slot is None or slot.grid is None:
            continue
        p = slot.pipeline
        if p is None:
            return None
        pipelines[p] = p.max_threads
        bound = slot.bindings
        for index, _, _ in p.params:
            b = bound.get(index)
            if b is not None:
                buffers[b[0]] = None
    return RangeBatch(icb.version, rec.items, rec.dispatches, pipelines, tuple(buffers))
