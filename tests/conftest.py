"""Shared test helpers: hypothesis strategies for args and random graphs of every op (import with
``from conftest import graphs``)."""
from __future__ import annotations

import os
import sys
from typing import Any

# The repository root must not be on sys.path: its bare mtlir/ folder would hide the installed package, which maps
# passes/ and runtime/ into mtlir (`python -m pytest` puts the root first). The tests' own subprocesses (the CLI run
# as a program) inherit PYTHONSAFEPATH, so they keep it off too.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONSAFEPATH"] = "1"
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]
_early = sys.modules.get("mtlir")
if _early is not None and os.path.dirname(os.path.abspath(_early.__file__ or "")) == os.path.join(_ROOT, "mtlir"):
    for _name in [m for m in sys.modules if m == "mtlir" or m.startswith("mtlir.")]:
        del sys.modules[_name]

from hypothesis import strategies as st  # noqa: E402

from mtlir.ir.dtypes import DType, StructDType, dtypes  # noqa: E402
from mtlir.metal import DeviceSpec, Kernel, KernelParam, Obj, Prototype, Signature  # noqa: E402
from mtlir.ir.ops import Ops  # noqa: E402
from mtlir.ir.uop import UOp  # noqa: E402

ALL_DTYPES: list[DType] = [*dtypes.all, dtypes.voidptr, dtypes.float32.ptr(), dtypes.MTLSize.ptr(),
                           dtypes.int8.ptr().ptr(), StructDType("Pair", ("first", "second")),
                           DType("odd", 3, "3s", "uint")]

dtype_strategy = st.sampled_from(ALL_DTYPES)

# every float: nan, +-inf, -0.0, subnormals
float_strategy = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True) | st.sampled_from(
    [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 5e-324, 1e308])
text_strategy = st.text(max_size=12) | st.sampled_from(['"', "'", "\\", "\\\\\"", "a\nb", "\x00", "setBarrier",
                                                        "setKernelBuffer:offset:atIndex:", "node", "<b>", "{|}"])
atom_strategy = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70) | float_strategy
                 | text_strategy | st.binary(max_size=8) | st.sampled_from(list(Ops)) | dtype_strategy)


def _dataclasses(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    name = text_strategy.filter(bool)  # KernelParam and Kernel refuse empty names
    param = st.builds(KernelParam, st.none() | name, st.integers(0, 31), st.sampled_from(["float32", "int32"]),
                      st.none() | st.integers(1, 1 << 20))
    # the MSL declares what the parameters say (Kernel checks it), then any text
    kernel = st.builds(lambda key, params, text: Kernel(key, "k", _msl(params) + text, params), name,
                       st.tuples(param) | st.just(()), text_strategy)
    return st.one_of(
        st.builds(Obj, st.sampled_from(["buffer", "queue", "icb"]), text_strategy, st.tuples(children) | st.just(())),
        param, kernel,
        st.builds(Prototype, dtype_strategy, st.lists(dtype_strategy, max_size=3).map(tuple)),
        st.builds(Signature, dtype_strategy, st.lists(dtype_strategy, max_size=3).map(tuple)),
        st.builds(DeviceSpec, st.sampled_from(["Apple7", "apple9", "MAC2"]), st.booleans(), st.booleans()))


def _msl(params: tuple[KernelParam, ...]) -> str:
    """A kernel ``k`` whose MSL signature declares ``params`` (each at its ``[[buffer(n)]]``)."""
    msl_type = {"float32": "float", "int32": "int"}
    decls = [f"device {msl_type[p.element.name]}* p{p.index} [[buffer({p.index})]]" if p.var is None
             else f"constant {msl_type[p.element.name]}& p{p.index} [[buffer({p.index})]]" for p in params]
    return f"kernel void k({', '.join(decls)}) {{}}\n"


def _compound(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    hashable_atoms = st.none() | st.booleans() | st.integers() | text_strategy | float_strategy
    return (st.lists(children, max_size=3).map(tuple) | st.frozensets(hashable_atoms, max_size=3)
            | _dataclasses(children))


arg_strategy: st.SearchStrategy[Any] = st.recursive(atom_strategy, _compound, max_leaves=6)


@st.composite
def graphs(draw: st.DrawFn, max_nodes: int = 10, ops: list[Ops] | None = None) -> UOp:
    """A random graph: up to ``max_nodes`` nodes of any op (or of ``ops``), dtype, arg and tag, each using up to
    three earlier nodes (repeats allowed), gathered under a SINK."""
    nodes: list[UOp] = []
    for _ in range(draw(st.integers(1, max_nodes))):
        src = tuple(draw(st.lists(st.sampled_from(nodes), max_size=3))) if nodes else ()
        op = draw(st.sampled_from(ops if ops is not None else list(Ops)))
        tag = draw(st.none() | st.none() | arg_strategy)
        nodes.append(UOp(op, draw(dtype_strategy), src, draw(arg_strategy), tag))
    roots = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=4))
    return UOp.sink(*roots)


@st.composite
def dags(draw: st.DrawFn, max_nodes: int = 30) -> UOp:
    """A random DAG of ADD/NEG/SINK nodes over distinct leaves (every node distinct by construction)."""
    nodes: list[UOp] = []
    for i in range(draw(st.integers(1, max_nodes))):
        if not nodes or draw(st.integers(0, 4)) == 0:
            nodes.append(UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"v{i}", 0, 9)))
            continue
        src = tuple(draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=4)))
        nodes.append(UOp(Ops.SINK, dtypes.void, src, i))
    return UOp.sink(*nodes[-draw(st.integers(1, len(nodes))):])


