"""The simulated Metal device (docs/simulator.md): ``SimDevice`` is a Bridge that models Metal's objects and the
rules of METAL.md §3 in strict or faithful mode, and runs the kernels through OpenCL (``kernels``, ``msl``)."""
from mtlir.runtime.sim.device import SimDevice
from mtlir.runtime.sim.faults import GPUFault
from mtlir.runtime.sim.kernels.pyrunner import PyKernel, PyKernelArg, PyKernelRunner
from mtlir.runtime.sim.rules.rule import Rule

__all__ = ["SimDevice", "GPUFault", "PyKernel", "PyKernelArg", "PyKernelRunner", "Rule"]
