"""TinyJit batches on mtlir: a batch of kernels is lowered to one Program (one ICB, one command per kernel, a barrier
after each) once, linked on the device's ``DeviceContext``, and replayed per call: one submit that rebinds the JIT's
input buffers, writes the variables' values and the symbolic grid sizes (tinygrad's ``runtime/graph/metal.py``
does the same by hand with Metal's ICB; here the lowering writes those messages).

Buffers the batch made itself (intermediates, weights) are fixed in the ICB (bound once at link); the inputs
(``uop_replace``) are buffer variables, each at a byte offset given per call (``in<i>_off``): inputs at other
offsets replay the same Program; only inputs of other view sizes lower a second one (kept too). Each Program is
linked as a ring of ``RING`` Sessions (``DeviceContext.ring``): a call patches one Session's ICB while the call
before runs on the other, instead of waiting for it (METAL.md §3 rule 15)."""
from __future__ import annotations

from typing import Any, cast

from tinygrad.device import Buffer, Device
from tinygrad.engine.jit import GraphRunner
from tinygrad.uop.ops import UOp

from mtlir.runtime.context import SessionRing
from mtlir.tinygrad.batch import Arg, Batch, Dispatch, Size
from mtlir.tinygrad.device import MetalBuffer, MetalDevice, MetalProgram
from mtlir.tinygrad.settings import SETTINGS

__all__ = ["MtlirGraph"]

_MAX_THREADS = 2**32 - 1
_LOCAL = (1, 1024)
RING = 2  # Sessions per lowered batch used in turn: the CPU patches one while the GPU runs the other


class MtlirGraph(GraphRunner):
    """One TinyJit batch as one mtlir Program (``GraphRunner``: tinygrad's interface for a device's graph).
    ``lowered`` / ``replays`` (class-wide): Programs lowered and submits made by every graph, ``last`` the graph
    made last, for tests and benchmarks."""

    lowered = 0
    replays = 0
    last: MtlirGraph | None = None

    def __init__(self, linear: Any, input_uops: tuple[UOp, ...] = ()) -> None:
        super().__init__(linear, input_uops)
        # the device of the batch's buffers: tinygrad's GraphRunner.device drops the ":N" of METAL:N, so
        # Device[self.device] is METAL's for a METAL:1 batch (on a Mac both are the one GPU; here each METAL:N is
        # its own DeviceContext, and METAL's does not know METAL:1's buffers)
        self.dev = cast(MetalDevice, Device[self.calls[0][2][0].device])
        self.sessions: dict[tuple[Any, ...], SessionRing] = {}
        self.submits = 0
        # per call only the values change: the inputs' indices and the variables' names are made once
        self._input_idx = tuple(sorted({iidx for replace in self.uop_replace for _, iidx in replace}))
        self._in_names = tuple((i, f"in{i}", f"in{i}_off") for i in self._input_idx)
        self._var_names = tuple((v, f"var_{v}") for v in self.vars)
        self._session(input_uops)
        MtlirGraph.last = self

    def _inputs(self, input_uops: tuple[UOp, ...]) -> dict[int, MetalBuffer]:
        return {i: cast(MetalBuffer, cast(Buffer, input_uops[i].buffer)._buf) for i in self._input_idx}

    def batch(self, inputs: dict[int, MetalBuffer]) -> Batch:
        """The Batch of the JIT's calls with its inputs at the byte offsets of ``inputs``."""
        batch = Batch()
        for j, ((_, ast, bufs, device_vars), runtime) in enumerate(zip(self.calls, self.runtimes)):
            prg = cast(MetalProgram, runtime)
            replaced = dict(self.uop_replace[j])
            args = []
            for i, b in enumerate(bufs):
                if i in replaced:
                    mb = inputs[replaced[i]]
                    args.append(Arg(f"in{replaced[i]}", 0, mb.buf.nbytes, f"in{replaced[i]}_off", mb.size))
                else:
                    mb = cast(MetalBuffer, b._buf)
                    args.append(Arg(None, mb.buf.handle, mb.buf.nbytes, mb.offset, mb.size))
            vals: list[Size] = []
            for v in ast.arg.vars:
                if v.expr in device_vars:
                    vals.append(int(device_vars[v.expr]))
                elif v.expr in ast.arg.runtimevars:
                    vals.append(0)
                else:
                    name = f"var_{v.expr}"
                    batch.bounds[name] = (int(v.vmin), int(v.vmax))
                    vals.append(name)
            grid: tuple[Size, Size, Size]
            local: tuple[Size, Size, Size]
            if j in self.launch_dims_replace:
                g_idx, l_idx = self.launch_dims_replace[j]
                base_g, base_l = self.launch_dims_base[j]
                grid = cast(Any, tuple(f"g{g_idx}_{a}" if g_idx is not None else int(base_g[a]) for a in range(3)))
                local = cast(Any, tuple(f"l{l_idx}_{a}" if l_idx is not None else int(base_l[a]) for a in range(3)))
                for g, t in zip(grid, local):
                    if isinstance(t, str):
                        batch.bounds[t] = _LOCAL
                    if isinstance(g, str):
                        batch.bounds[g] = (1, _MAX_THREADS // (t if isinstance(t, int) else _LOCAL[1]))
            else:
                gs, ls = ast.arg.launch_dims({})
                grid = cast(Any, tuple(int(x) for x in (*gs, 1, 1)[:3]))
                local = cast(Any, tuple(int(x) for x in (*(ls or (1, 1, 1)), 1, 1)[:3]))
            batch.dispatches.append(Dispatch(prg.kernel, tuple(args), tuple(vals), grid, local))
        return batch

    def _session(self, input_uops: tuple[UOp, ...]) -> tuple[SessionRing, dict[int, MetalBuffer]]:
        inputs = self._inputs(input_uops)
        key = tuple(sorted((i, b.size) for i, b in inputs.items()))
        s = self.sessions.get(key)
        if s is None:
            batch = self.batch(inputs)
            program = batch.lower(self.dev.spec, self.dev.target)
            s = self.sessions[key] = self.dev.ctx.ring(program, RING, shared_extra=batch.shared_buffers())
            MtlirGraph.lowered += 1
        return s, inputs

    def __call__(self, input_uops: tuple[UOp, ...], var_vals: dict[str, int], wait: bool = False) -> float | None:
        s, inputs = self._session(input_uops)
        values: dict[str, Any] = {}
        for i, name, off in self._in_names:
            b = inputs[i]
            values[name], values[off] = b.buf.handle, b.offset
        for v, name in self._var_names:
            values[name] = int(var_vals[v])
        if self.symbolic_dims:
            dims = [tuple(int(x) for x in d) for d in self._symbolic_dims(var_vals)]
            for i, d in enumerate(dims):
                for a in range(3):
                    values[f"g{i}_{a}"] = values[f"l{i}_{a}"] = d[a] if a < len(d) else 1
        values = {k: v for k, v in values.items() if k in s.program.variables}
        sub = s.submit(**values)
        self.submits += 1
        MtlirGraph.replays += 1
        if not wait:
            return None
        s.wait(timeout_s=SETTINGS.timeout_s)
        return sub.gpu_ns / 1e9 if sub.gpu_ns is not None else 0.0

    def _symbolic_dims(self, var_vals: dict[str, int]) -> list[tuple[Any, ...]]:
        from tinygrad.uop.ops import sym_infer
        return [tuple(sym_infer(s, var_vals) for s in dim) for dim in self.symbolic_dims]
