"""UPat and PatternMatcher: rules as tables of (pattern, function).

A UPat matches a UOp on its op (one op or a set), dtype, sources, raw arg and name captures. A PatternMatcher
looks rules up by op, so matching cost does not grow with the size of the table. A rule function receives the
named captures as keyword arguments (and ``ctx`` when it declares that parameter) and returns a new UOp, or
None for "no match"; every rule remembers its file and line from the function's code object.
"""
from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mtlir.dtypes import DType
from mtlir.ops import GroupOp, Ops
from mtlir.uop import UOp, argkey

__all__ = ["UPat", "PatternMatcher", "Rule"]

_NO_ARG = object()


class UPat:
    """A pattern over UOps.

    ``op``: an Ops, a set/tuple of Ops, or None (any). ``dtype``: a DType, a set of DTypes, or None.
    ``src``: a tuple (sources in order; binary commutative ops also match swapped), a list (any order), a
    single UPat (every source matches it), or None (any sources). ``arg``: matched by type and value (``1`` does
    not match ``True``); leave it out to match any. ``name``: capture the node under this keyword.
    ``allow_any_len``: a tuple ``src`` matches a prefix of the sources.
    """

    __slots__ = ("ops", "dtypes", "src", "arg_key", "arg", "name", "allow_any_len", "alternatives", "src_mode")

    def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
                 src: UPat | Sequence[UPat] | None = None, arg: Any = _NO_ARG, name: str | None = None,
                 allow_any_len: bool = False) -> None:
        self.ops: frozenset[Ops] | None = (None if op is None else frozenset((op,)) if isinstance(op, Ops)
                                           else frozenset(op))
        self.dtypes: frozenset[DType] | None = (None if dtype is None else frozenset((dtype,))
                                                if isinstance(dtype, DType) else frozenset(dtype))
        self.src_mode = "any" if src is None else "each" if isinstance(src, UPat) else \
            "perm" if isinstance(src, list) else "seq"
        self.src: Any = src if src is None or isinstance(src, UPat) else tuple(src)
        self.arg = arg
        self.arg_key = _NO_ARG if arg is _NO_ARG else argkey(arg)
        self.name = name
        self.allow_any_len = allow_any_len
        self.alternatives: tuple[UPat, ...] = ()

    # ---- constructors

    @staticmethod
    def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        """Any node, captured as ``name``."""
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        """Any CONST, captured as ``name``."""
        return UPat(Ops.CONST, dtype, name=name)

    @staticmethod
    def const(dtype: DType | Iterable[DType] | None, value: Any) -> UPat:
        """The CONST with exactly this value (compared by type and value)."""
        return UPat(Ops.CONST, dtype, arg=value)

    @staticmethod
    def any(*pats: UPat) -> UPat:
        """Any one of ``pats`` (tried in order)."""
        p = UPat()
        p.alternatives = tuple(pats)
        return p

    def __or__(self, other: UPat) -> UPat:
        return UPat.any(*(self.alternatives or (self,)), *(other.alternatives or (other,)))

    def __repr__(self) -> str:
        if self.alternatives:
            return " | ".join(map(repr, self.alternatives))
        parts = []
        if self.ops is not None:
            parts.append("{" + ", ".join(sorted(repr(o) for o in self.ops)) + "}" if len(self.ops) > 1
                         else repr(next(iter(self.ops))))
        if self.name:
            parts.append(f"name={self.name!r}")
        if self.arg is not _NO_ARG:
            parts.append(f"arg={self.arg!r}")
        return f"UPat({', '.join(parts)})"

    # ---- matching

    def op_keys(self) -> frozenset[Ops] | None:
        """The ops this pattern can match at its root (None: any op)."""
        if self.alternatives:
            keys: set[Ops] = set()
            for a in self.alternatives:
                k = a.op_keys()
                if k is None:
                    return None
                keys |= k
            return frozenset(keys)
        return self.ops

    def match(self, uop: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
        """Every consistent capture dict extending ``store`` under which ``uop`` matches (empty: no match)."""
        if self.alternatives:
            out: list[dict[str, UOp]] = []
            for a in self.alternatives:
                out.extend(a.match(uop, store))
            return out
        if self.ops is not None and uop.op not in self.ops:
            return []
        if self.dtypes is not None and uop.dtype not in self.dtypes:
            return []
        if self.arg_key is not _NO_ARG and argkey(uop.arg) != self.arg_key:
            return []
        if self.name is not None:
            if (prev := store.get(self.name)) is not None:
                if prev is not uop:
                    return []
            else:
                store = {**store, self.name: uop}
        mode = self.src_mode
        if mode == "any":
            return [store]
        if mode == "each":
            stores = [store]
            for s in uop.src:
                stores = [m for st in stores for m in self.src.match(s, st)]
                if not stores:
                    return []
            return stores
        pats: tuple[UPat, ...] = self.src
        srcs = uop.src
        if len(srcs) != len(pats) and not (self.allow_any_len and len(srcs) >= len(pats)):
            return []
        if mode == "perm":
            orders: Iterable[Sequence[UPat]] = itertools.permutations(pats)
        elif len(pats) == 2 and uop.op in GroupOp.Commutative:
            orders = (pats, (pats[1], pats[0]))
        else:
            orders = (pats,)
        out = []
        for order in orders:
            stores = [store]
            for p, s in zip(order, srcs):
                stores = [m for st in stores for m in p.match(s, st)]
                if not stores:
                    break
            out.extend(stores)
        return out


@dataclass(frozen=True)
class Rule:
    """One rule of a PatternMatcher: the pattern, the function, and where the function is defined."""

    pat: UPat
    fn: Callable[..., UOp | None]
    wants_ctx: bool
    location: str

    def __repr__(self) -> str:
        return f"<rule {getattr(self.fn, '__name__', '?')} at {self.location}>"


def _location(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        return f"<{type(fn).__name__}>"
    return f"{code.co_filename}:{code.co_firstlineno}"


def _wants_ctx(fn: Callable[..., Any]) -> bool:
    try:
        return "ctx" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class PatternMatcher:
    """An ordered table of rules, looked up by the op of the node being rewritten.

    ``PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(dtypes.int32, 0))), lambda x: x)])``.
    Matchers add up: ``pm1 + pm2`` tries pm1's rules first."""

    def __init__(self, rules: Iterable[tuple[UPat, Callable[..., UOp | None]]]) -> None:
        self.rules: list[Rule] = [Rule(p, fn, _wants_ctx(fn), _location(fn)) for p, fn in rules]
        self._by_op: dict[Ops, list[Rule]] = {}
        self._wild: list[Rule] = []
        for r in self.rules:
            keys = r.pat.op_keys()
            if keys is None:
                self._wild.append(r)
        for op in Ops:
            lst = [r for r in self.rules if (k := r.pat.op_keys()) is None or op in k]
            if lst:
                self._by_op[op] = lst

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher([(r.pat, r.fn) for r in self.rules + other.rules])

    def __len__(self) -> int:
        return len(self.rules)

    def rules_for(self, op: Ops) -> list[Rule]:
        """The rules that can match a node of ``op``, in table order."""
        return self._by_op.get(op, [])

    def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
        """The result of the first rule that matches ``uop`` and returns a node, or None."""
        got = self.rewrite_with_rule(uop, ctx)
        return None if got is None else got[0]

    def rewrite_with_rule(self, uop: UOp, ctx: Any = None) -> tuple[UOp, Rule] | None:
        """Like ``rewrite``, also naming the rule that fired."""
        rules = self._by_op.get(uop.op)
        if rules is None:
            return None
        for rule in rules:
            for captures in rule.pat.match(uop, {}):
                ret = rule.fn(ctx=ctx, **captures) if rule.wants_ctx else rule.fn(**captures)
                if ret is not None and ret is not uop:
                    if type(ret) is not UOp:
                        raise TypeError(f"rule at {rule.location} returned {type(ret).__name__}, not a UOp")
                    return ret, rule
        return None
