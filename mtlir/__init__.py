"""mtlir: GPU queue operations as a graph of immutable, hash-consed UOps, lowered by pattern-matching passes to the
exact Objective-C message sequence of Apple Metal.

The IR core lives here: ``UOp`` (nodes), ``Ops``/``GroupOp`` (what a node is), ``dtypes`` (value types), ``UPat`` and
``PatternMatcher`` (rules), ``graph_rewrite`` (passes), ``render``/``parse``/``listing`` (text) and ``to_dot``/
``to_networkx``/``write_picture`` (pictures). The passes are in ``mtlir.passes``, the devices in ``mtlir.runtime``.
"""
from mtlir.ir.dtypes import DType, PtrDType, StructDType, dtypes
from mtlir.ir.ops import GroupOp, Ops
from mtlir.ir.render import ParseError, listing, parse, register_arg_type, render
from mtlir.ir.rewrite import RewriteLoopError, RewriteStep, RewriteTrace, graph_rewrite
from mtlir.ir.uop import UOp
from mtlir.ir.upat import PatternMatcher, PatternRule, RuleError, UPat
from mtlir.viz import GraphvizNotFoundError, to_dot, to_networkx, write_picture

__all__ = ["UOp", "Ops", "GroupOp", "dtypes", "DType", "PtrDType", "StructDType", "UPat", "PatternMatcher",
           "PatternRule", "RuleError", "graph_rewrite", "RewriteLoopError", "RewriteTrace", "RewriteStep", "render", "parse",
           "ParseError", "listing", "register_arg_type", "to_dot", "to_networkx", "write_picture",
           "GraphvizNotFoundError"]
