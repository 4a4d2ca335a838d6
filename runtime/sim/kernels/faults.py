"""Reading back a fault (``kernels``): the ``KernelAccessError`` for the fault record a run left, naming the kernel,
the parameter or array, read or write, and where the access fell.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mtlir.errors import KernelAccessError
from mtlir.runtime.sim.msl.kernel import ParamBinding

if TYPE_CHECKING:
    from mtlir.runtime.sim.kernels.compiled import CompiledKernel, View


def _access_error(ck: CompiledKernel, views: tuple[View, ...], bindings: dict[int, tuple[np.ndarray, int]],
                  words: np.ndarray) -> KernelAccessError:
    """The ``KernelAccessError`` for the fault record ``words`` a run left (``msl.prelude``'s ``__mtl_chk``: code
    = 2 * binding position + 1 (+1 for a write), access size, byte offset in the MTLBuffer as two words)."""
    code, size = int(words[0]), int(words[1])
    position, write = (code - 1) // 2, (code - 1) % 2 == 1
    offset_in_buffer = int(words[2]) | int(words[3]) << 32
    if offset_in_buffer >= 1 << 63:
        offset_in_buffer -= 1 << 64
    verb = "wrote" if write else "read"
    if position >= len(ck.info.bindings):  # one of the kernel's threadgroup or thread arrays
        array = ck.info.arrays[position - len(ck.info.bindings)]
        element = offset_in_buffer // array.elem if array.elem else None
        at = (f"element {element} (byte offset {offset_in_buffer})" if element is not None
              else f"byte offset {offset_in_buffer}")
        message = (f"kernel {ck.function!r} {verb} {size} bytes out of bounds of its {array.memory} array "
                   f"{array.name!r} at {at}: the simulated device skipped the access (on Metal: undefined, "
                   f"another thread's or threadgroup's memory, or a GPU fault)")
        return KernelAccessError(message, function=ck.function, param=array.name, index=-1, write=write,
                                 offset=offset_in_buffer, element=element, size=size, buffer_bytes=0,
                                 view_offset=0, memory=array.memory)
    b: ParamBinding = ck.info.bindings[position]
    view = views[position]
    storage = bindings[b.arg.index][0]
    offset = offset_in_buffer - view.offset
    element = offset // b.elem if b.elem else None
    at = f"element {element} (byte offset {offset})" if element is not None else f"byte offset {offset}"
    message = (f"kernel {ck.function!r} {verb} {size} bytes out of bounds through parameter "
               f"{b.arg.name!r} (buffer index {b.arg.index}) at {at} of its view at offset {view.offset} of a "
               f"{storage.nbytes}-byte buffer: the simulated device skipped the access (on Metal: a GPU address "
               "fault, or a silent access within the allocation's pages)")
    return KernelAccessError(message, function=ck.function, param=b.arg.name, index=b.arg.index, write=write,
                             offset=offset, element=element, size=size, buffer_bytes=storage.nbytes,
                             view_offset=view.offset)
