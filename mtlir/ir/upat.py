"""UPat and PatternMatcher: rules as tables of (pattern, function).

A UPat matches a UOp on its op (one op or a set), dtype, sources, raw arg and name captures. A PatternMatcher
looks rules up by op, so matching cost does not grow with the size of the table. A rule function receives the
named captures as keyword arguments (and ``ctx`` when it declares that parameter) and returns a new UOp, or
None for "no match"; every rule remembers its file and line from the function's code object (so rules written
in a REPL or fed to ``python -`` have a location too).

Each pattern is compiled once into a closure that checks, cheapest first: the op, the dtype, the arg, the number
of sources and the ops of the direct sources, and only then matches the sources recursively.
"""
from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mtlir.ir.dtypes import DType
from mtlir.errors import MtlirError
from mtlir.ir.ops import GroupOp, Ops
from mtlir.ir.interning import argkey
from mtlir.ir.uop import UOp

__all__ = ["UPat", "PatternMatcher", "PatternRule", "RuleError"]

_NO_ARG: Any = object()
Store = dict[str, UOp]
MatchFn = Callable[[UOp, Store], list[Store]]
_NONE: list[Store] = []  # the shared "no match" answer (never mutated)


class RuleError(MtlirError, TypeError):
    """A rule whose function cannot take the pattern's captures, or that returned something other than a UOp."""


class UPat:
    """A pattern over UOps.

    ``op``: an Ops, a set/tuple of Ops, or None (any). ``dtype``: a DType, a set of DTypes, or None.
    ``src``: a tuple (sources in order; binary commutative ops also match swapped), a list (any order), a
    single UPat (every source matches it), or None (any sources). ``arg``: matched by type and value (``1`` does
    not match ``True``, ``0.0`` does not match ``-0.0``); leave it out to match any. ``name``: capture the node
    under this keyword (a name used twice must capture the same node). ``allow_any_len``: a tuple ``src`` matches
    a prefix of the sources.
    """

    __slots__ = ("ops", "dtypes", "src", "arg_key", "arg", "name", "allow_any_len", "alternatives", "src_mode",
                 "_fn")

    def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
                 src: UPat | Sequence[UPat] | None = None, arg: Any = _NO_ARG, name: str | None = None,
                 allow_any_len: bool = False) -> None:
        self.ops: frozenset[Ops] | None = (None if op is None else frozenset((op,)) if isinstance(op, Ops)
                                           else frozenset(op))
        if self.ops is not None and not all(isinstance(o, Ops) for o in self.ops):
            raise TypeError(f"UPat: op must be an Ops or a set of Ops, got {op!r}")
        self.dtypes: frozenset[DType] | None = (None if dtype is None else frozenset((dtype,))
                                                if isinstance(dtype, DType) else frozenset(dtype))
        if self.dtypes is not None and not all(isinstance(d, DType) for d in self.dtypes):
            raise TypeError(f"UPat: dtype must be a DType or a set of DTypes, got {dtype!r}")
        self.src_mode = "any" if src is None else "each" if isinstance(src, UPat) else \
            "perm" if isinstance(src, list) else "seq"
        self.src: Any = src if src is None or isinstance(src, UPat) else tuple(src)
        if isinstance(self.src, tuple) and not all(isinstance(p, UPat) for p in self.src):
            raise TypeError(f"UPat: src must hold UPats, got {src!r}")
        self.arg = arg
        self.arg_key = _NO_ARG if arg is _NO_ARG else argkey(arg)
        self.name = name
        self.allow_any_len = allow_any_len
        self.alternatives: tuple[UPat, ...] = ()
        self._fn: MatchFn | None = None

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
        """Any one of ``pats`` (tried in order; each match is offered to the rule in turn)."""
        if not pats or not all(isinstance(p, UPat) for p in pats):
            raise TypeError("UPat.any takes one or more UPats")
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
        if self.dtypes is not None:
            parts.append("dtype=" + ("{" + ", ".join(sorted(map(repr, self.dtypes))) + "}" if len(self.dtypes) > 1
                                     else repr(next(iter(self.dtypes)))))
        if self.src is not None:
            parts.append(f"src={self.src!r}")
        if self.arg is not _NO_ARG:
            parts.append(f"arg={self.arg!r}")
        if self.name:
            parts.append(f"name={self.name!r}")
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

    def only_ops(self) -> bool:
        """Whether this pattern matches every node of its ops (no dtype, source or arg test, no alternatives), so
        a table of checks may call its function on the node without matching."""
        return self.dtypes is None and self.src_mode == "any" and self.arg_key is _NO_ARG and not self.alternatives

    def capture_names(self) -> frozenset[str]:
        """Every name this pattern (or any alternative, at any depth) can capture."""
        names: set[str] = set()
        stack: list[UPat] = [self]
        while stack:
            p = stack.pop()
            stack.extend(p.alternatives)
            if p.name is not None:
                names.add(p.name)
            if isinstance(p.src, UPat):
                stack.append(p.src)
            elif isinstance(p.src, tuple):
                stack.extend(p.src)
        return frozenset(names)

    def match(self, uop: UOp, store: Store | None = None) -> list[Store]:
        """Every consistent capture dict extending ``store`` under which ``uop`` matches (empty: no match)."""
        fn = self._fn
        if fn is None:
            fn = self._fn = _compile(self)
        return fn(uop, {} if store is None else store)


def _bind(st: Store, name: str, u: UOp) -> Store | None:
    """``st`` with ``name`` bound to ``u``; None when ``name`` is already bound to another node."""
    prev = st.get(name)
    if prev is None:
        return {**st, name: u}
    return st if prev is u else None


def _compile(pat: UPat) -> MatchFn:
    """A closure matching ``pat``: cheap checks of the root and its direct sources first, recursion last."""
    if pat.alternatives:
        alts = tuple(_compile(a) for a in pat.alternatives)

        def match_any(u: UOp, st: Store) -> list[Store]:
            out: list[Store] = []
            for f in alts:
                out += f(u, st)
            return out
        return match_any
    ops, dts, akey, name, mode = pat.ops, pat.dtypes, pat.arg_key, pat.name, pat.src_mode
    no_arg = akey is _NO_ARG
    if mode == "any":
        sub: Any = None
    elif mode == "each":
        sub = _compile(pat.src)
    else:
        sub = tuple(_compile(p) for p in pat.src)
    npat = 0 if mode in ("any", "each") else len(pat.src)
    any_len = pat.allow_any_len
    # what the direct sources must be (their ops and args), checked before any recursion; None: anything
    quick: tuple[tuple[frozenset[Ops] | None, Any], ...] = tuple(
        (p.op_keys(), _NO_ARG if p.alternatives else p.arg_key) for p in pat.src) if mode == "seq" else ()
    pre = any(k is not None or a is not _NO_ARG for k, a in quick)
    swappable = mode == "seq" and npat == 2 and (ops is None or bool(ops & GroupOp.Commutative))
    (k0, a0), (k1, a1) = quick if swappable else ((None, _NO_ARG), (None, _NO_ARG))

    def match(u: UOp, st: Store) -> list[Store]:
        if ops is not None and u.op not in ops:
            return _NONE
        if dts is not None and u.dtype not in dts:
            return _NONE
        if not no_arg and u._key[3] != akey:
            return _NONE
        src = u.src
        if mode == "each":
            if name is not None:
                bound = _bind(st, name, u)
                if bound is None:
                    return _NONE
                st = bound
            stores = [st]
            for s in src:
                stores = [m for x in stores for m in sub(s, x)]
                if not stores:
                    return _NONE
            return stores
        if sub is not None and len(src) != npat and not (any_len and len(src) >= npat):
            return _NONE
        if mode == "perm":
            orders: Iterable[Sequence[int]] = itertools.permutations(range(npat))
        elif swappable and u.op in GroupOp.Commutative:
            s0, s1 = src[0], src[1]
            straight = ((k0 is None or s0.op in k0) and (a0 is _NO_ARG or s0._key[3] == a0)
                        and (k1 is None or s1.op in k1) and (a1 is _NO_ARG or s1._key[3] == a1))
            swapped = ((k0 is None or s1.op in k0) and (a0 is _NO_ARG or s1._key[3] == a0)
                       and (k1 is None or s0.op in k1) and (a1 is _NO_ARG or s0._key[3] == a1))
            if not (straight or swapped):
                return _NONE
            orders = ((0, 1),) * straight + ((1, 0),) * swapped
        elif sub is not None:
            if pre:
                for (k, a), s in zip(quick, src):
                    if (k is not None and s.op not in k) or (a is not _NO_ARG and s._key[3] != a):
                        return _NONE
            orders = (range(npat),)
        if name is not None:
            bound = _bind(st, name, u)
            if bound is None:
                return _NONE
            st = bound
        if sub is None:
            return [st]
        out: list[Store] = []
        for order in orders:
            stores = [st]
            for i, s in zip(order, src):
                stores = [m for x in stores for m in sub[i](s, x)]
                if not stores:
                    break
            out += stores
        return out
    return match


@dataclass(frozen=True)
class PatternRule:
    """One rule of a PatternMatcher: the pattern, the function, and where the function is defined."""

    pat: UPat
    fn: Callable[..., UOp | None]
    wants_ctx: bool
    location: str

    @property
    def name(self) -> str:
        """The function's name (``<lambda>`` for a lambda)."""
        fn = self.fn.func if isinstance(self.fn, functools.partial) else self.fn
        return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__

    def __repr__(self) -> str:
        return f"<rule {self.name} at {self.location}>"


def _code_of(fn: Callable[..., Any]) -> Any:
    """The code object behind ``fn`` (a function, a partial, a bound method, a callable object), or None."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    if code is None:
        code = getattr(getattr(type(fn), "__call__", None), "__code__", None)
    return code


def _location(fn: Callable[..., Any]) -> str:
    """``file:line`` of the function's definition, from its code object (no source file needed)."""
    code = _code_of(fn)
    if code is None:
        return f"<{type(fn).__name__}>"
    return f"{code.co_filename}:{code.co_firstlineno}"


def _check_rule(pat: UPat, fn: Callable[..., Any], location: str) -> bool:
    """Check that ``fn`` can take the captures of ``pat``; return whether it declares ``ctx``.

    Raises ``RuleError`` naming the rule's location when a capture has no parameter or a parameter no capture."""
    if not callable(fn):
        raise RuleError(f"rule for {pat!r}: {fn!r} is not callable")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: accept and hope
        return False
    kinds = {p.kind for p in params.values()}
    names = pat.capture_names()
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        missing = sorted(n for n in names if n not in params or params[n].kind is inspect.Parameter.POSITIONAL_ONLY)
        if missing:
            raise RuleError(f"rule at {location}: the pattern captures {missing} but the function does not take "
                            f"them as keywords ({pat!r})")
    required = sorted(n for n, p in params.items() if p.default is inspect.Parameter.empty and n != "ctx"
                      and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                      and n not in names)
    if required:
        raise RuleError(f"rule at {location}: parameter(s) {required} are never captured by the pattern {pat!r}")
    return "ctx" in params or inspect.Parameter.VAR_KEYWORD in kinds


class PatternMatcher:
    """An ordered table of rules, looked up by the op of the node being rewritten.

    ``PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(dtypes.int32, 0))), lambda x: x)])``.
    Matchers add up: ``pm1 + pm2`` tries pm1's rules first. Raises ``RuleError`` when a function cannot take the
    captures of its pattern (checked here, once, not when the rule first fires)."""

    def __init__(self, rules: Iterable[tuple[UPat, Callable[..., UOp | None]]]) -> None:
        self.rules: list[PatternRule] = []
        for item in rules:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], UPat)):
                raise RuleError(f"PatternMatcher: each rule is a (UPat, function) pair, got {item!r:.120}")
            pat, fn = item
            loc = _location(fn)
            self.rules.append(PatternRule(pat, fn, _check_rule(pat, fn, loc), loc))
        self._by_op: dict[Ops, list[tuple[MatchFn, PatternRule]]] = {}
        self._pre: dict[Ops, Callable[[UOp], bool]] = {}  # per op: can any rule match? (absent: maybe, always)
        self._dispatch: dict[Ops, tuple[list[tuple[MatchFn, PatternRule]], Callable[[UOp], bool] | None]] = {}
        for op in Ops:
            lst = [(_compiled(r.pat), r) for r in self.rules if (k := r.pat.op_keys()) is None or op in k]
            if lst:
                self._by_op[op] = lst
                pre = _precheck([r.pat for _, r in lst])
                if pre is not None:
                    self._pre[op] = pre
                self._dispatch[op] = (lst, pre)

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher([(r.pat, r.fn) for r in self.rules + other.rules])

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        return f"<PatternMatcher of {len(self.rules)} rules>"

    def rules_for(self, op: Ops) -> list[PatternRule]:
        """The rules that can match a node of ``op``, in table order."""
        return [r for _, r in self._by_op.get(op, ())]

    def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
        """The result of the first rule that matches ``uop`` and returns a node, or None."""
        got = self.rewrite_with_rule(uop, ctx)
        return None if got is None else got[0]

    def rewrite_with_rule(self, uop: UOp, ctx: Any = None) -> tuple[UOp, PatternRule] | None:
        """Like ``rewrite``, also naming the rule that fired. A rule returning ``uop`` itself counts as no match.

        Raises ``RuleError`` when a rule returns something other than a UOp or None."""
        rules = self._by_op.get(uop.op)
        if rules is None:
            return None
        pre = self._pre.get(uop.op)
        if pre is not None and not pre(uop):
            return None
        return self._rewrite_unchecked(uop, ctx, rules)

    def _rewrite_unchecked(self, uop: UOp, ctx: Any,
                           rules: list[tuple[MatchFn, PatternRule]]) -> tuple[UOp, PatternRule] | None:
        """``rewrite_with_rule`` once the precheck said a rule may match: every rule for the op, in order.

        An exception a rule raises goes on unchanged (same type, for the caller's ``except``) with a note naming
        the rule (file:line) and the node it was matching; the try costs nothing when nothing raises."""
        rule: PatternRule | None = None
        try:
            for match, rule in rules:
                for captures in match(uop, {}):
                    ret = rule.fn(ctx=ctx, **captures) if rule.wants_ctx else rule.fn(**captures)
                    if ret is not None and ret is not uop:
                        if type(ret) is not UOp:
                            raise RuleError(f"rule {rule.name} at {rule.location} returned a {type(ret).__name__}, "
                                            "not a UOp or None")
                        return ret, rule
        except Exception as e:
            where = f"rule {rule.name} at {rule.location}" if rule is not None else "a rule"
            e.add_note(f"in {where}, matching {_brief(uop)}")
            raise
        return None


def _brief(uop: UOp) -> str:
    """A one-line description of a node for an error note: op, dtype, arg, how many sources."""
    arg = "" if uop.arg is None else f", arg={uop.arg!r:.80}"
    n = len(uop.src)
    return f"UOp({uop.op!r}, {uop.dtype!r}{arg}, {n} source{'' if n == 1 else 's'})"


def _compiled(pat: UPat) -> MatchFn:
    """The pattern's compiled match function (compiled on first use, then kept on the pattern)."""
    if pat._fn is None:
        pat._fn = _compile(pat)
    return pat._fn


# ---- the precheck: per op, one generated function that tells cheaply whether any rule for that op can match

def _quick_terms(pat: UPat, var: str, consts: dict[str, Any]) -> list[str] | None:
    """Conditions (Python expressions over ``var``) every node ``pat`` matches satisfies at its root: op, dtype,
    arg. None when ``pat`` has alternatives (any of them may match)."""
    if pat.alternatives:
        return None

    def const(v: Any) -> str:
        name = f"K{len(consts)}"
        consts[name] = v
        return name
    terms = []  # the most selective first: an arg (a constant's value), then the op, then the dtype
    if pat.arg_key is not _NO_ARG:
        terms.append(f"{var}._key[3] == {const(pat.arg_key)}")
    if pat.ops is not None:
        terms.append(f"{var}.op in {const(pat.ops)}")
    if pat.dtypes is not None:
        terms.append(f"{var}.dtype in {const(pat.dtypes)}")
    return terms


def _rule_condition(pat: UPat, consts: dict[str, Any]) -> str | None:
    """A Python expression over ``u`` (the node) and ``s`` (its sources) that is True for every node ``pat`` can
    match (the root's dtype and arg, the number of sources, the op, dtype and arg of each direct source, in either
    order for a binary commutative op); None when nothing cheap can be said."""
    root = _quick_terms(pat, "u", consts)
    if root is None:
        return None
    root = [t for t in root if not t.startswith("u.op")]  # the op is known: the precheck is per op
    if pat.src_mode == "seq":
        n = len(pat.src)
        root.append(f"len(s) {'>=' if pat.allow_any_len else '=='} {n}")
        per_src = [_quick_terms(p, f"s[{i}]", consts) or [] for i, p in enumerate(pat.src)]
        straight = [t for terms in per_src for t in terms]
        if n == 2 and (pat.ops is None or pat.ops & GroupOp.Commutative) and straight:
            swapped = [t.replace("s[0]", "s[@]").replace("s[1]", "s[0]").replace("s[@]", "s[1]") for t in straight]
            root.append(f"(({' and '.join(straight)}) or ({' and '.join(swapped)}))")
        else:
            root += straight
    elif pat.src_mode == "perm":
        root.append(f"len(s) == {len(pat.src)}")
    return " and ".join(root) if root else None


def _precheck(pats: list[UPat]) -> Callable[[UOp], bool] | None:
    """One function for the rules of one op: False when no rule can match the node (module docstring of the
    matcher: a pre-filter, never wrong the other way), or None when some rule may match any node of the op."""
    consts: dict[str, Any] = {}
    conds = []
    for p in pats:
        cond = _rule_condition(p, consts)
        if cond is None:
            return None
        conds.append(f"({cond})")
    code = "def pre(u):\n    s = u.src\n    return " + " or ".join(conds) + "\n"
    namespace: dict[str, Any] = dict(consts)
    exec(compile(code, "<mtlir.ir.upat precheck>", "exec"), namespace)  # noqa: S102 (built from our own patterns)
    pre: Callable[[UOp], bool] = namespace["pre"]
    pre.__doc__ = code
    return pre

