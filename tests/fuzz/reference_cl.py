"""The reference executor of the differential fuzzing: the same kernels, in the same order, run directly with
pyopencl on the OpenCL device the simulated device uses. No mtlir code runs in between except the MSL -> OpenCL C
translator (``mtlir.runtime.sim.msl.translate``, without its bounds checks, and ``simd.scratch_bytes``, the size of
the local scratch its SIMD-group functions take): this module makes its own buffers, argument blocks and launches,
and reads the buffers back itself.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from msl_library import GROUP
from queue_spec import COMMANDS, KERNELS, Op, QueueSpec, n_value


class Reference:
    """Builds each library kernel once on the OpenCL ``device`` (a pyopencl Device) and runs queues on it."""

    def __init__(self, device: Any) -> None:
        import pyopencl as cl
        self.cl = cl
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx)
        self._kernels: dict[str, tuple[Any, Any]] = {}

    def _kernel(self, key: str) -> tuple[Any, Any]:
        got = self._kernels.get(key)
        if got is None:
            from mtlir.runtime.sim.msl.translate import translate
            lib = KERNELS[key].kernel
            t = translate(lib.msl, bounds_checks=False)
            program = self.cl.Program(self.ctx, t.source).build()
            got = self._kernels[key] = (getattr(program, lib.function), t.kernels[lib.function])
        return got

    def _blit(self, spec: QueueSpec, op: Op, bufs: dict[str, Any], k: int) -> None:
        """A copy (``enqueue_copy`` between the two buffers) or a fill (``enqueue_fill_buffer``) of submit ``k``, its
        offsets and size at that submit's values of the variables."""
        assert op.out is not None
        dst = bufs[spec.bound(op.out.buffer, k)]
        first, src_first, elems = op.blit(spec.submits[k])
        if op.kind == "copy":
            src = op.ins[0]
            self.cl.enqueue_copy(self.queue, dst, bufs[spec.bound(src.buffer, k)], byte_count=4 * elems,
                                 src_offset=4 * src_first, dst_offset=4 * first)
        else:
            self.cl.enqueue_fill_buffer(self.queue, dst, np.full(1, op.slot, np.uint8), 4 * first, 4 * elems)

    def run(self, spec: QueueSpec) -> list[dict[str, bytes]]:
        """Every buffer's bytes after each submit of ``spec`` (by ``QueueSpec.instances`` name): its dispatches and
        blits in the order drawn (across queues too: an order their waits allow, and with several queues rarely the
        one a GPU running each queue in commit order takes, so a wait the device ignores shows), one after the other
        (an in-order OpenCL queue), with each submit's values of the variables and its MTLBuffer behind each buffer
        variable."""
        from mtlir.runtime.sim.msl.simd import scratch_bytes
        cl, ctx, q = self.cl, self.ctx, self.queue
        mf = cl.mem_flags
        init = spec.initial()
        bufs = {name: cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.frombuffer(data, np.uint8).copy())
                for b, data in enumerate(init) for name in spec.instances(b)}
        fault = cl.Buffer(ctx, mf.READ_WRITE, 64)
        keep: list[Any] = []
        out = []
        order = [op for op in spec.ops if op.kind in COMMANDS]
        for k, values in enumerate(spec.submits):
            for op in order:
                if op.kind in ("copy", "fill"):
                    self._blit(spec, op, bufs, k)
                if op.kind != "exec":
                    continue
                assert op.out is not None
                kernel, info = self._kernel(op.kernel)
                n = n_value(op.n, values)
                views = [op.out, *op.ins]
                scalars = [n, op.ins[0].elems] if KERNELS[op.kernel].gathers else [n]
                args: list[Any] = []
                block = []
                for b in info.bindings:
                    if b.arg.kind == "buffer":
                        v = views[b.arg.index]
                        args.append(bufs[spec.bound(v.buffer, k)])
                        block += [4 * v.first, 0, 4 * spec.buffers[v.buffer]]
                    else:
                        s = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                      hostbuf=np.array([scalars[b.arg.index - len(views)]], np.int32))
                        keep.append(s)
                        args.append(s)
                        block += [0, 0, 4]
                argbuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.array(block, np.uint64))
                keep.append(argbuf)
                args += [argbuf, fault]
                if info.simd:
                    args.append(cl.LocalMemory(-(-scratch_bytes(GROUP) // 32) * 32))
                groups = -(-n // GROUP)
                kernel(q, (groups * GROUP,), (GROUP,), *args)
            snap = {}
            for name, buf in bufs.items():
                host = np.empty(buf.size, np.uint8)
                cl.enqueue_copy(q, host, buf)
                snap[name] = host.tobytes()
            out.append(snap)
            keep.clear()
        return out


def numpy_model(spec: QueueSpec, order: list[Op] | None = None) -> list[dict[str, bytes]]:
    """The same queue by the kernels' numpy meaning (``msl_library.LibKernel.numpy``): exact (int32 kernels). Its
    commands in ``order`` (default: as drawn; ``queue_spec.schedule`` gives another order the waits allow)."""
    arrays = {name: np.frombuffer(data, np.int32).copy() for b, data in enumerate(spec.initial())
              for name in spec.instances(b)}
    out = []
    if order is None:
        order = [op for op in spec.ops if op.kind in COMMANDS]
    for k, values in enumerate(spec.submits):
        for op in order:
            if op.kind in ("copy", "fill"):
                assert op.out is not None
                first, src_first, elems = op.blit(values)
                dst = arrays[spec.bound(op.out.buffer, k)][first:first + elems]
                if op.kind == "fill":
                    dst.view(np.uint8)[:] = op.slot
                else:
                    dst[:] = arrays[spec.bound(op.ins[0].buffer, k)][src_first:src_first + elems]
            if op.kind != "exec":
                continue
            assert op.out is not None
            lib = KERNELS[op.kernel]
            n = n_value(op.n, values)
            o = op.out
            ins = [arrays[spec.bound(v.buffer, k)][v.first:v.first + v.elems].copy() for v in op.ins]
            target = arrays[spec.bound(o.buffer, k)][o.first:o.first + o.elems]
            lib.numpy(target, ins, n, op.ins[0].elems)
        out.append({name: a.tobytes() for name, a in arrays.items()})
    return out
