"""Where the lanes of a SIMD group may part: SIMD-group exchanges the simulated device cannot run.

On Metal a SIMD-group function (``simd_sum``), a matrix multiply or a call of a helper that uses one may stand in
control flow that splits a SIMD group (``if (lane < 16)``, a loop whose trip count depends on the lane, after
``if (t >= n) return;``): the lanes that are not there are inactive. The simulator exchanges values through
threadgroup barriers (``simd``), and an OpenCL barrier reached by some work-items of a work-group and not others is
undefined: on PoCL it crashes the whole process. So before translating, ``check_simd_control_flow`` refuses
(``UnsupportedKernelError``) every such call whose lanes could part, naming the call and the condition.

A condition may hold an exchange when it is the same for every lane of a SIMD group: built from literals,
``constant`` parameters, buffer pointers, the threadgroup's and the grid's positions and sizes
(``threadgroup_position_in_grid``, ``threads_per_threadgroup``, ...), ``simdgroup_index_in_threadgroup`` and the
results of SIMD-group reductions and broadcasts, through variables assigned only from such values outside parting
control flow (worked out to a fixpoint over the function, in any order of its statements), and reads of
threadgroup or device memory at such addresses. The thread's and lane's positions, shuffles and scans, a helper
function's parameters and its results, thread arrays written from per-lane values: per lane. So ``if (sg == 0)
v = simd_sum(...)`` and a tinygrad loop ``for (int r = 0; r < 8; r++) wmma = __WMMA(...)`` run; ``if (lane == 0)
simd_sum(...)`` is refused. The check is conservative: a condition it cannot show uniform is taken as parting.
"""
from __future__ import annotations

from collections.abc import Iterable

from mtlir.runtime.sim.msl.cexpr import Node, Parser
from mtlir.runtime.sim.msl.lex import ID, PP, PUNCT, Token
from mtlir.runtime.sim.msl.names import (HELPER_BUILTINS, MATRIX_TYPES, RENAMED_BUILTINS, SAME_BUILTINS, SCALARS,
                                          VECTORS)
from mtlir.runtime.sim.msl.rewrite import at, group_end, refuse
from mtlir.runtime.sim.msl.simd import SIMD_FUNCTIONS, uses_scratch

__all__ = ["check_simd_control_flow"]

# Kernel parameter attributes whose value is the same for every lane of a SIMD group.
_UNIFORM_POSITIONS = frozenset({"threadgroup_position_in_grid", "threads_per_threadgroup", "threadgroups_per_grid",
                                "threads_per_grid", "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup",
                                "threads_per_simdgroup", "quadgroups_per_threadgroup"})
# SIMD-group functions whose result is the same for every lane (reductions, broadcasts, votes).
_UNIFORM_RESULTS = frozenset(f"simd_{op}" for op in ("sum", "product", "min", "max", "and", "or", "xor", "broadcast",
                                                     "broadcast_first", "ballot", "all", "any",
                                                     "active_threads_mask"))
_EXCHANGES = frozenset(SIMD_FUNCTIONS) | {"simdgroup_multiply", "simdgroup_multiply_accumulate"}
_ASSIGNMENTS = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="})


def check_simd_control_flow(ts: list[Token], items: list[tuple[str, int, int]], helpers: set[str],
                            struct_names: set[str]) -> None:
    """Refuse, with ``UnsupportedKernelError`` naming the call, a SIMD-group exchange (a SIMD-group function, a
    matrix multiply, a call of one of ``helpers``) in control flow that may split a SIMD group, in any kernel or
    function of the top-level ``items`` that makes one."""
    for kind, start, end in items:
        if kind in ("kernel", "function") and uses_scratch(ts, start, end, helpers):
            _Function(ts, start, end, kind == "kernel", helpers, struct_names).check()


class _Function:
    def __init__(self, ts: list[Token], start: int, end: int, kernel: bool, helpers: set[str],
                 struct_names: set[str]) -> None:
        self.ts = ts
        self.helpers = helpers
        self.parser = Parser(ts, lambda name: (name in SCALARS or name in VECTORS or name in struct_names
                                               or name in MATRIX_TYPES or name == "simdgroup_matrix"))
        open_ = next(j for j in range(start, end) if ts[j].kind == PUNCT and ts[j].text == "(")
        close = group_end(ts, open_)
        self.body = next(j for j in range(close, end) if ts[j].text == "{")
        self.uniform: set[str] = set()  # names whose value is the same across a SIMD group
        self.varying: set[str] = set()  # names assigned per-lane values (or under parting control flow)
        self.checking = False
        for a, b in _spans(ts, open_, close):
            self._parameter(ts[a:b], kernel)

    def _parameter(self, p: list[Token], kernel: bool) -> None:
        cut = next((k for k in range(len(p) - 1) if p[k].text == "[" and p[k + 1].text == "["), len(p))
        names = [t for t in p[:cut] if t.kind == ID]
        if not names:
            return
        attr = p[cut + 2].text if cut < len(p) - 2 else ""
        words = {t.text for t in p[:cut]}
        if attr in _UNIFORM_POSITIONS or (kernel and not attr and words & {"device", "constant"}):
            self.uniform.add(names[-1].text)
        else:  # the thread's positions, a helper's parameters (their callers are not followed)
            self.varying.add(names[-1].text)

    def check(self) -> None:
        """Work out which names vary per lane (to a fixpoint), then refuse the exchanges under parting control."""
        end = group_end(self.ts, self.body)
        while True:
            before = len(self.varying)
            self._block(self.body + 1, end, None)
            if len(self.varying) == before:
                break
        self.checking = True
        self._block(self.body + 1, end, None)

    # --- statements: ``parted`` is the token of the condition that may split the SIMD group (None when nothing
    # does); each returns the conditions under which some lanes left early: by ``return`` (the rest of the function
    # is parted) and by ``break``/``continue`` (the rest of the loop is)

    def _block(self, i: int, end: int, parted: Token | None) -> tuple[Token | None, Token | None]:
        returned = left = None
        while i < end:
            i, r, brk = self._statement(i, end, parted)
            returned, left = returned or r, left or brk
            parted = parted or r or brk  # after an early exit some lanes took, the rest runs without them
        return returned, left

    def _statement(self, i: int, end: int, parted: Token | None) -> tuple[int, Token | None, Token | None]:
        ts = self.ts
        t = ts[i]
        text = t.text if t.kind in (ID, PUNCT) else ""
        if t.kind == PP or text == ";":
            return i + 1, None, None
        if text == "{":
            close = group_end(ts, i)
            return (close + 1, *self._block(i + 1, close, parted))
        if text == "if" and at(ts, i + 1).text == "(":
            close = group_end(ts, i + 1)
            inner = self._condition(i + 2, close, parted)
            j, r, brk = self._statement(close + 1, end, inner)
            if j < end and ts[j].text == "else":
                j, r2, brk2 = self._statement(j + 1, end, inner)
                r, brk = r or r2, brk or brk2
            return j, r, brk
        if text in ("while", "switch") and at(ts, i + 1).text == "(":
            close = group_end(ts, i + 1)
            inner = self._condition(i + 2, close, parted)
            j, r, brk = self._statement(close + 1, end, inner)
            if brk is not None and text == "while":  # some lanes left early: later iterations run without them
                self._statement(close + 1, end, brk)
            return j, r, None
        if text == "for" and at(ts, i + 1).text == "(":
            return self._for(i, end, parted)
        if text == "do":
            j, r, brk = self._statement(i + 1, end, parted)
            close = group_end(ts, j + 1)
            cond = self._condition(j + 2, close, parted)
            if cond is not parted or brk is not None:  # the body ran a number of times that may differ per lane
                self._statement(i + 1, end, cond or brk)
            return close + 2, r, None
        if text in ("return", "break", "continue", "goto"):
            semi = _semicolon(ts, i, end)
            if semi > i + 1 and text == "return":
                self._expression(self.parser.expression(i + 1, semi), parted)
            leaves_function = text in ("return", "goto")
            return semi + 1, (parted if leaves_function else None), (None if leaves_function else parted)
        if text in ("case", "default"):
            j = i
            while not (ts[j].kind == PUNCT and ts[j].text == ":"):
                j += 1
            return j + 1, None, None
        decl = self.parser.declaration(i, end)
        if decl is not None:
            for d in decl.declarators:
                for a, b in d.dims:
                    self._expression(self.parser.expression(a, b), parted)
                if d.init is not None:
                    self._assigned(ts[d.name].text, self._expression(d.init, parted), parted)
            return decl.end, None, None
        semi = _semicolon(ts, i, end)
        self._expression(self.parser.expression(i, semi), parted)
        return semi + 1, None, None

    def _for(self, i: int, end: int, parted: Token | None) -> tuple[int, Token | None, Token | None]:
        ts = self.ts
        close = group_end(ts, i + 1)
        semis = [j for j in _top_level(ts, i + 2, close) if ts[j].text == ";"]
        if len(semis) != 2:
            self.parser._fail(i, "expected `for (init; condition; step)`")
        first, second = semis
        if first > i + 2:
            self._statement(i + 2, first + 1, parted)
        inner = parted
        for _ in range(2):  # the step's assignments may make the condition per lane: twice reaches the fixpoint
            inner = self._condition(first + 1, second, parted) if second > first + 1 else parted
            if close > second + 1:
                self._expression(self.parser.expression(second + 1, close), inner)
        j, r, brk = self._statement(close + 1, end, inner)
        if brk is not None:  # some lanes left early: later iterations run without them
            self._statement(close + 1, end, brk)
            if close > second + 1:
                self._expression(self.parser.expression(second + 1, close), brk)
        return j, r, None

    def _condition(self, a: int, b: int, parted: Token | None) -> Token | None:
        """The control a condition gives the statements it guards: ``parted``, or the condition's first token when
        it may differ between the lanes of a SIMD group."""
        node = self.parser.expression(a, b)
        varying = self._expression(node, parted)
        return parted if parted is not None or not varying else self.ts[a]

    # --- expressions: each returns whether its value may differ between the lanes of a SIMD group

    def _expression(self, node: Node, parted: Token | None) -> bool:
        k = node.kind
        kids = node.kids
        if k == "name":
            return node.name in self.varying or (node.name not in self.uniform and not _constant_name(node.name))
        if k in ("num", "str", "typename", "sizeof"):
            return False
        if k == "ternary":
            cond = self._expression(kids[0], parted)
            inner = parted if parted is not None or not cond else self.ts[kids[0].start]
            return self._expression(kids[1], inner) | self._expression(kids[2], inner) | cond
        if k == "binary" and node.op in ("&&", "||"):
            left = self._expression(kids[0], parted)
            inner = parted if parted is not None or not left else self.ts[kids[0].start]
            return self._expression(kids[1], inner) | left
        if k == "assign":
            value = self._expression(kids[1], parted)
            target = _target(kids[0])
            if target is not None:
                self._assigned(target, value or (node.op != "=" and self._expression(kids[0], parted)), parted)
            self._expression(kids[0], parted)
            return value
        if k in ("unary", "postfix") and node.op in ("++", "--"):
            target = _target(kids[0])
            if target is not None:
                self._assigned(target, self._expression(kids[0], parted), parted)
            return self._expression(kids[0], parted)
        if k == "call":
            return self._call(node, parted)
        if k == "member":
            return self._expression(kids[0], parted)
        if k == "index" or (k == "unary" and node.op == "*"):
            return any([self._expression(x, parted) for x in kids])
        return any([self._expression(x, parted) for x in kids])

    def _call(self, node: Node, parted: Token | None) -> bool:
        callee, args = node.kids[0], node.kids[1:]
        varying_args = any([self._expression(a, parted) for a in args])
        if callee.kind == "member":  # m.thread_elements(): the lane's own elements
            self._expression(callee, parted)
            return True
        name = callee.name if callee.kind == "name" else ""
        if self.checking and parted is not None and (name in _EXCHANGES or name in self.helpers):
            t = self.ts[callee.start]
            refuse(t, name, f"a SIMD-group exchange where the lanes of a SIMD group may part (the condition at "
                   f"{parted.where()} may differ between them): on Metal the lanes that are not there are inactive; "
                   "the simulated device exchanges lanes' values through threadgroup barriers, which every thread "
                   "of the threadgroup must reach, so it cannot run this (make the condition the same for a whole "
                   "SIMD group, or call it outside the branch)")
        if name in _UNIFORM_RESULTS:
            return False
        if name in SAME_BUILTINS or name in RENAMED_BUILTINS or name in HELPER_BUILTINS:
            return varying_args
        return True  # a helper, a shuffle, a scan, a matrix function, anything unknown: per lane

    def _assigned(self, name: str, varying: bool, parted: Token | None) -> None:
        if varying or parted is not None:
            self.varying.add(name)
            self.uniform.discard(name)
        elif name not in self.varying:
            self.uniform.add(name)


def _target(node: Node) -> str | None:
    """The variable an assignment writes: ``x``, ``x.y``, ``x[i]`` (a thread array), ``*(x + i)``."""
    while node.kind in ("member", "index", "paren") or (node.kind == "unary" and node.op == "*"):
        node = node.kids[0]
        while node.kind == "binary" and node.op in ("+", "-"):
            node = node.kids[0]
    return node.name if node.kind == "name" else None


def _constant_name(name: str) -> bool:
    """Names of MSL constants and enumerators (the same in every lane)."""
    return name in ("true", "false", "INFINITY", "NAN", "FLT_MAX", "FLT_MIN", "M_PI_F") or "::" in name


def _semicolon(ts: list[Token], i: int, end: int) -> int:
    for j in _top_level(ts, i, end):
        if ts[j].text == ";":
            return j
    return end


def _top_level(ts: list[Token], i: int, end: int) -> Iterable[int]:
    """Indices of the punctuators of ``ts[i:end]`` outside brackets."""
    j = i
    while j < end:
        if ts[j].kind == PUNCT and ts[j].text in ("(", "[", "{"):
            j = group_end(ts, j) + 1
            continue
        if ts[j].kind == PUNCT:
            yield j
        j += 1


def _spans(ts: list[Token], open_: int, close: int) -> list[tuple[int, int]]:
    """The parameter spans between the brackets at ``open_`` and ``close``."""
    commas = [j for j in _top_level(ts, open_ + 1, close) if ts[j].text == ","]
    bounds = [open_, *commas, close]
    return [(bounds[k] + 1, bounds[k + 1]) for k in range(len(bounds) - 1) if bounds[k + 1] > bounds[k] + 1]
