"""mtlir as a tinygrad device (issue 11, docs/tinygrad.md): ``import mtlir.tinygrad`` makes tinygrad's METAL device
run on mtlir (the simulated Metal device by default), on any machine. The device module is loaded as
``tinygrad.runtime.ops_metal``, so the device keeps the name METAL and tinygrad's own MetalRenderer writes the MSL.

    import mtlir.tinygrad
    from tinygrad import Tensor
    print((Tensor([1, 2, 3]) + 1).tolist())      # [2, 3, 4], through mtlir's lowering and the simulated Metal

``configure(family=..., target=..., strict=...)`` before the first tensor; ``record(script, args, output)``
records a script's kernel queue as a trace (``mtlir record``)."""
from __future__ import annotations

import sys

from mtlir.tinygrad.settings import SETTINGS, Settings, configure

__all__ = ["register", "configure", "SETTINGS", "Settings", "record", "RecordError"]


def register() -> None:
    """Install mtlir's device as ``tinygrad.runtime.ops_metal`` (idempotent). Raises ``RuntimeError`` when
    tinygrad's own Metal module was imported first (a device opened before ``import mtlir.tinygrad``)."""
    from mtlir.tinygrad import device
    current = sys.modules.get("tinygrad.runtime.ops_metal")
    if current is device:
        return
    if current is not None:
        raise RuntimeError("tinygrad's own ops_metal is already imported: import mtlir.tinygrad before opening "
                           "the METAL device")
    sys.modules["tinygrad.runtime.ops_metal"] = device
    import tinygrad.runtime
    from tinygrad.helpers import PARALLEL
    setattr(tinygrad.runtime, "ops_metal", device)
    # tinygrad compiles in a pool of spawned processes, which would import tinygrad's own ops_metal (and wait
    # forever for a Mac's Metal compiler): compile in this process
    PARALLEL.value = 0


register()

# ``mtlir.tinygrad.record(script, args, output)``: the function (it shadows its module's name in this package;
# ``from mtlir.tinygrad.record import RecordError`` still reads the module): docs/tinygrad.md, "Recording"
from mtlir.tinygrad.record import RecordError, record  # noqa: E402
