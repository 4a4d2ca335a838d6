"""The table of the translator's token rewrite rules: which ``TokenRule``s ``rewrite`` tries on a token, in order.

A key is a token's text, or ``"<kind>"`` for every token of that kind (``<id>``, ``<num>``, ``<pp>``); ``rewrite``
tries the rules of the text, then those of the kind, and the first that matches wins. The bounds checks' rules
(``guard``) come first on their tokens: ``pointer_declaration`` ahead of the address-space rules (it records a
pointer variable, then declines), ``deref`` on ``*``, ``prefix_increment`` on ``++``/``--``, ``device_cast`` on
``(``, ``loop_guard`` on ``for`` and ``while``; they decline outside a function. The SIMD-group rules (``simd``)
run on their names, and ``simd_helper_call`` before ``call`` on every identifier. The translator passes the table in its ``Ctx``.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from mtlir.runtime.sim.msl.guard.access import deref, device_cast, pointer_declaration, prefix_increment
from mtlir.runtime.sim.msl.guard.bound import _SPACES
from mtlir.runtime.sim.msl.guard.loops import loop_guard
from mtlir.runtime.sim.msl.guard.pointers import pointer_group
from mtlir.runtime.sim.msl.lex import ID, NUM, PP
from mtlir.runtime.sim.msl.names import MATRIX_TYPES, OPENCL_ONLY_KEYWORDS, SCALARS, VECTORS
from mtlir.runtime.sim.msl.simd import (MATRIX_FUNCTIONS, SIMD_FUNCTIONS, matrix_function, matrix_type, simd_function,
                                        simd_helper_call, thread_elements)
from mtlir.runtime.sim.msl.rewrite import (TokenRule, as_type, attribute_brackets, call, constant_space, constexpr,
                                           device_space, directive, drop_namespace, gnu_attribute, half_literal,
                                           mem_flags, metal_func, opencl_keyword, scalar_type, scope_operator,
                                           static_cast, thread_space, threadgroup_barrier, threadgroup_space,
                                           using_namespace, vector_type)

__all__ = ["TOKEN_RULES"]

# (rule, the keys it is tried on), in the order the rules of one key are tried
_ENTRIES: tuple[tuple[TokenRule, tuple[str, ...]], ...] = (
    (deref, ("*",)),
    (device_cast, ("(",)),
    (pointer_group, ("(",)),
    (loop_guard, ("for", "while")),
    (prefix_increment, ("++", "--")),
    (pointer_declaration, (*sorted(_SPACES), "threadgroup", "thread")),
    (drop_namespace, ("metal", "precise", "fast")),
    (scope_operator, ("::",)),
    (threadgroup_barrier, ("threadgroup_barrier", "simdgroup_barrier")),
    (mem_flags, ("mem_flags",)),
    (device_space, ("device",)),
    (constant_space, ("constant",)),
    (threadgroup_space, ("threadgroup",)),
    (thread_space, ("thread",)),
    (vector_type, tuple(VECTORS)),
    (scalar_type, tuple(SCALARS)),
    (as_type, ("as_type",)),
    (static_cast, ("static_cast",)),
    (constexpr, ("constexpr",)),
    (using_namespace, ("using",)),
    (attribute_brackets, ("[",)),
    (gnu_attribute, ("__attribute__",)),
    (metal_func, ("METAL_FUNC",)),
    (opencl_keyword, tuple(OPENCL_ONLY_KEYWORDS)),
    (simd_function, tuple(SIMD_FUNCTIONS) + ("simd_is_first", "quad_is_first", "simd_active_threads_mask",
                                            "quad_active_threads_mask")),
    (matrix_type, (*MATRIX_TYPES, "simdgroup_matrix")),
    (matrix_function, tuple(MATRIX_FUNCTIONS)),
    (thread_elements, ("thread_elements",)),
    (simd_helper_call, ("<" + ID + ">",)),
    (call, ("<" + ID + ">",)),
    (half_literal, ("<" + NUM + ">",)),
    (directive, ("<" + PP + ">",)),
)


def _table() -> dict[str, tuple[TokenRule, ...]]:
    table: dict[str, list[TokenRule]] = {}
    for rule, keys in _ENTRIES:
        for key in keys:
            table.setdefault(key, []).append(rule)
    return {key: tuple(rules) for key, rules in table.items()}


TOKEN_RULES: Mapping[str, tuple[TokenRule, ...]] = MappingProxyType(_table())
