"""mtlir: GPU queue operations as a graph of immutable, hash-consed UOps, lowered by pattern-matching passes to the
exact Objective-C message sequence of Apple Metal.

The public surface, each name imported from the module it lives in when it is first used (``import mtlir``
imports none of them, nor graphviz, networkx, numpy, pyopencl, the passes or the runtime):

- the IR core: ``UOp`` (nodes), ``Ops``/``GroupOp`` (what a node is), ``dtypes``/``DType``/``PtrDType``/
  ``StructDType`` (value types), ``UPat``/``PatternMatcher``/``PatternRule`` (rules), ``graph_rewrite`` (passes),
  ``render``/``parse``/``listing``/``register_arg_type`` (text), ``describe`` (any stage's text with its messages
  and ICB commands spelled out, the Program included; ``mtlir.program.tables``), ``to_dot``/``to_networkx``/
  ``write_picture`` (pictures of any stage; ``mtlir.viz``);
- Metal's facts: ``DeviceSpec``, ``Kernel``, ``KernelParam`` (``mtlir.metal``);
- the front end: ``Queue`` (a queue by hand), ``queues`` and ``shared_event`` (several queues, their events),
  ``load_trace`` (a recorded queue); the lowering: ``lower``,
  ``default_pipeline`` (``mtlir.passes``);
- running: ``link``, ``Session`` (``mtlir.runtime``), ``SimDevice`` (the simulated Metal device);
- the errors: ``MtlirError`` and its family (``mtlir.errors``), with the IR core's ``ParseError``, ``RuleError``,
  ``RewriteLoopError`` and ``GraphvizNotFoundError``;
- ``__version__``: the installed distribution's version, read from its metadata (``importlib.metadata``) when first
  asked; ``mtlir --version`` prints the same.
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mtlir.errors import (ArgumentError, BridgeError, DeviceError, GPUExecutionError, InputError, InvalidMslError,
                              KernelAccessError, KernelBuildError, KernelCompileError, LinkError, LoweringError,
                              MetalValidationError, MtlirError, NoDeviceError, StateError, UnsupportedError,
                              UnsupportedKernelError, WaitTimeoutError)
    from mtlir.frontend.nodes import shared_event
    from mtlir.frontend.queue import Queue, queues
    from mtlir.frontend.trace import load_trace
    from mtlir.ir.dtypes import DType, PtrDType, StructDType, dtypes
    from mtlir.ir.ops import GroupOp, Ops
    from mtlir.ir.render import ParseError, listing, parse, register_arg_type, render
    from mtlir.ir.rewrite import RewriteLoopError, RewriteStep, RewriteTrace, graph_rewrite
    from mtlir.ir.uop import UOp
    from mtlir.ir.upat import PatternMatcher, PatternRule, RuleError, UPat
    from mtlir.metal import DeviceSpec, Kernel, KernelParam
    from mtlir.passes import default_pipeline, lower
    from mtlir.program.tables import describe
    from mtlir.runtime.link.link import link
    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    from mtlir.viz import GraphvizNotFoundError, to_dot, to_networkx, write_picture

__all__ = ["UOp", "Ops", "GroupOp", "dtypes", "DType", "PtrDType", "StructDType", "UPat", "PatternMatcher",
           "PatternRule", "RuleError", "graph_rewrite", "RewriteLoopError", "RewriteTrace", "RewriteStep", "render",
           "parse", "ParseError", "listing", "register_arg_type", "describe", "to_dot", "to_networkx", "write_picture",
           "GraphvizNotFoundError", "DeviceSpec", "Kernel", "KernelParam", "Queue", "queues", "shared_event",
           "load_trace", "lower",
           "default_pipeline", "link", "Session", "SimDevice", "MtlirError", "InputError", "ArgumentError",
           "StateError", "LoweringError", "LinkError", "BridgeError", "NoDeviceError", "DeviceError",
           "GPUExecutionError", "MetalValidationError", "KernelAccessError", "WaitTimeoutError", "UnsupportedError",
           "UnsupportedKernelError", "KernelCompileError", "InvalidMslError", "KernelBuildError"]

# the module each public name lives in (the imports above, for the type checker, say the same)
_MODULES: dict[str, tuple[str, ...]] = {
    "mtlir.ir.uop": ("UOp",),
    "mtlir.ir.ops": ("Ops", "GroupOp"),
    "mtlir.ir.dtypes": ("dtypes", "DType", "PtrDType", "StructDType"),
    "mtlir.ir.upat": ("UPat", "PatternMatcher", "PatternRule", "RuleError"),
    "mtlir.ir.rewrite": ("graph_rewrite", "RewriteLoopError", "RewriteTrace", "RewriteStep"),
    "mtlir.ir.render": ("render", "parse", "ParseError", "listing", "register_arg_type"),
    "mtlir.program.tables": ("describe",),
    "mtlir.viz": ("to_dot", "to_networkx", "write_picture", "GraphvizNotFoundError"),
    "mtlir.metal": ("DeviceSpec", "Kernel", "KernelParam"),
    "mtlir.frontend.queue": ("Queue", "queues"),
    "mtlir.frontend.nodes": ("shared_event",),
    "mtlir.frontend.trace": ("load_trace",),
    "mtlir.passes": ("lower", "default_pipeline"),
    "mtlir.runtime.link.link": ("link",),
    "mtlir.runtime.session": ("Session",),
    "mtlir.runtime.sim.device": ("SimDevice",),
    "mtlir.errors": ("MtlirError", "InputError", "ArgumentError", "StateError", "LoweringError", "LinkError",
                     "BridgeError", "NoDeviceError", "DeviceError", "GPUExecutionError", "MetalValidationError",
                     "KernelAccessError", "WaitTimeoutError", "UnsupportedError", "UnsupportedKernelError",
                     "KernelCompileError", "InvalidMslError", "KernelBuildError"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}


# Imported from the repository's own mtlir/ folder (the repository root first on sys.path: a script, a REPL or
# `python -m mtlir` started there), the package finds mtlir.passes, mtlir.runtime and mtlir.tinygrad where the
# install maps them from (pyproject.toml's package-dir): the sibling folders passes/ and runtime/, and
# clients/tinygrad/. Without this they could not be imported from the root (a newcomer's ModuleNotFoundError).
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
if not os.path.isdir(os.path.join(_HERE, "passes")) and os.path.isfile(os.path.join(_ROOT, "passes", "__init__.py")):
    __path__ += [_ROOT, os.path.join(_ROOT, "clients")]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (and kept, so the next use is a plain lookup);
    ``__version__`` from the package metadata."""
    if name == "__version__":
        from importlib.metadata import version
        globals()[name] = value = version("mtlir")
        return value
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'mtlir' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names and the module's own dunders (not the helpers this module imports)."""
    return sorted({*__all__, "__version__", *(n for n in globals() if n.startswith("__") and n.endswith("__"))})
