"""half and bfloat in software: MSL's 16-bit floats on an OpenCL device without them, with Metal's numerics.

OpenCL C has no ``bfloat`` and ``half`` arithmetic needs ``cl_khr_fp16`` (PoCL here lacks it). ``lower_soft_floats``
rewrites the MSL of a library that uses them into MSL without them, before the translation proper:

- a value (a variable, a parameter, a thread array's element, a SIMD-group matrix's element) is a ``float`` holding
  a number the 16-bit type can represent; in memory (``device``, ``constant`` and ``threadgroup`` buffers, arrays,
  program-scope constants) it is its 16 bits, a ``ushort`` (``names.storage_type``), so the bytes are Metal's;
- every operation whose MSL type is ``half`` (``bfloat``) is computed in float and rounded to half (bfloat) right
  after it, to nearest, ties to even: ``a * b + c`` becomes ``__mtl_rh(__mtl_rh(a * b) + c)``, so a chain of
  operations gives the bits of a real half ALU. Float's 24-bit significand is at least 2p + 2 bits for both
  types (p = 11 for half, 8 for bfloat), so rounding the float result again gives the correctly rounded result
  of +, -, *, / and sqrt (Figueroa, "When is double rounding innocuous?", 1995);
- conversions follow MSL's (C++'s) usual arithmetic conversions: ``half * float`` is a float, ``half * int``
  a half (the int rounded to half first), a conversion to half rounds (casts, constructors, initialisers,
  assignments, arguments of a function's half parameters, ``return``); a load from memory widens the bits
  (``__mtl_h2f``), a store narrows (``__mtl_f2h``); ``as_type`` reinterprets the bits;
- ``1.5h`` becomes the float literal of its half value.

The rewrite types every expression of the functions it touches (``cexpr`` parses them) from the declarations it
sees. What it cannot type where a 16-bit float is involved (a name it does not know, a macro, a struct member of
16-bit type, ``++`` on a half) it refuses with ``UnsupportedKernelError``: never a wrong answer. A library
without half, bfloat and ``h`` literals comes back unchanged. The OpenCL definitions of ``__mtl_rh`` and friends are
``SOFTFLOAT_PRELUDE``.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np

from mtlir.runtime.sim.msl.cexpr import TYPE_QUALIFIERS, Declaration, Node, Parser
from mtlir.runtime.sim.msl.lex import ID, NUM, PP, PUNCT, Token, tokenize
from mtlir.runtime.sim.msl.names import (MATRIX_TYPES, POSITIONS, POSITIONS_LINEAR, SCALARS, SOFT_FLOATS, VECTORS,
                                          is_soft)
from mtlir.runtime.sim.msl.rewrite import at, group_end, refuse

__all__ = ["lower_soft_floats", "Ty", "SOFTFLOAT_PRELUDE", "uses_soft_floats"]

_MEMORY = frozenset({"device", "constant", "threadgroup"})  # where a 16-bit float is its 16 bits
_SPACES = ("device", "constant", "threadgroup", "thread")
_INT_RANK = {"bool": 0, "char": 1, "uchar": 1, "short": 2, "ushort": 2, "int": 3, "uint": 3, "long": 4,
             "ulong": 4, "size_t": 4, "ptrdiff_t": 4}
_FLOATS = frozenset({"float", "half", "bfloat"})
_ASSIGNMENTS = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="})
_ROUND = {"half": "__mtl_rh", "bfloat": "__mtl_rb"}
_TO_BITS = {"half": "__mtl_f2h", "bfloat": "__mtl_f2b"}
_FROM_BITS = {"half": "__mtl_h2f", "bfloat": "__mtl_b2f"}
_CONSTANTS = {"INFINITY": "float", "NAN": "float", "FLT_MAX": "float", "FLT_MIN": "float", "FLT_EPSILON": "float",
              "M_PI_F": "float", "M_E_F": "float", "M_LN2_F": "float", "M_SQRT2_F": "float", "true": "bool",
              "false": "bool"}
# Builtins (MSL spec §6) by how their result type follows from the arguments'.
_SAME = frozenset("""acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh cospi exp exp2 exp10 fabs fdim
floor fma fmax fmin fmod hypot log log2 log10 logb nextafter pow powr rint round rsqrt sin sinh sinpi sqrt tan tanh
tanpi trunc min max clamp mix step smoothstep sign degrees radians normalize cross abs fract saturate
simd_sum simd_product simd_min simd_max simd_prefix_inclusive_sum simd_prefix_exclusive_sum
simd_prefix_inclusive_product simd_prefix_exclusive_product quad_sum quad_product quad_min quad_max
quad_prefix_inclusive_sum quad_prefix_exclusive_sum quad_prefix_inclusive_product
quad_prefix_exclusive_product""".split())
_SCALAR_RESULT = frozenset({"dot", "length", "distance"})
_BOOL_RESULT = frozenset({"isnan", "isinf", "isfinite", "isnormal", "signbit", "isordered", "isunordered"})
_MOVES = frozenset("""simd_shuffle simd_shuffle_down simd_shuffle_up simd_shuffle_xor simd_shuffle_rotate_down
simd_shuffle_rotate_up simd_broadcast simd_broadcast_first quad_shuffle quad_shuffle_down quad_shuffle_up
quad_shuffle_xor quad_shuffle_rotate_down quad_shuffle_rotate_up quad_broadcast quad_broadcast_first""".split())
_BOOL_FUNCTIONS = frozenset({"simd_all", "simd_any", "simd_is_first", "quad_all", "quad_any", "quad_is_first",
                             "all", "any"})


@dataclass(frozen=True)
class Ty:
    """An MSL type as the rewrite sees it: ``base`` a scalar name (``half``, ``int``), a struct or SIMD-group matrix
    type; ``n`` the vector width (1: scalar); ``space`` the address space and ``depth`` the ``*``/``[]`` levels of
    a pointer or array (``depth`` 0: a value)."""

    base: str
    n: int = 1
    space: str = ""
    depth: int = 0

    @property
    def soft(self) -> bool:
        """A half or bfloat value (scalar or vector)."""
        return self.depth == 0 and self.base in SOFT_FLOATS

    @property
    def arithmetic(self) -> bool:
        return self.depth == 0 and (self.base in _FLOATS or self.base in _INT_RANK)

    def element(self) -> Ty:
        """What one ``[]`` or ``*`` of a pointer or array reaches."""
        return Ty(self.base, self.n, self.space if self.depth > 1 else "", self.depth - 1)


@dataclass
class _Sym:
    ty: Ty
    bits: bool = False  # a program-scope constant 16-bit float: its name reads 16 bits


@dataclass
class _Sig:
    ret: Ty | None
    params: list[Ty | None]


@dataclass
class _Edits:
    """Token insertions and replacements, applied by ``render``: ``before[i]`` outermost first, ``after[i]``
    innermost first, ``text[i]`` a new text for token i (``""`` drops it)."""

    before: dict[int, list[list[Token]]] = field(default_factory=dict)
    after: dict[int, list[list[Token]]] = field(default_factory=dict)
    text: dict[int, str] = field(default_factory=dict)

    def wrap(self, start: int, end: int, head: str, tail: str = ")") -> None:
        self.before.setdefault(start, []).insert(0, _toks(head))
        self.after.setdefault(end - 1, []).append(_toks(tail))

    def insert_after(self, i: int, tokens: list[Token]) -> None:
        self.after.setdefault(i, []).append(tokens)

    def render(self, ts: list[Token]) -> list[Token]:
        out: list[Token] = []
        pending = ""  # the whitespace of dropped tokens, given to the next one
        for i, t in enumerate(ts):
            space: str | None = pending + t.space
            pending = ""
            for group in self.before.get(i, ()):
                for x in group:
                    out.append(x.with_space(space) if space is not None else x)
                    space = None
            own = "" if space is None else space
            if i in self.text and not self.text[i]:
                pending = own
            elif i in self.text:
                out.append(Token(t.kind, self.text[i], t.line, t.col, own))
            else:
                out.append(t if own == t.space else t.with_space(own))
            for group in self.after.get(i, ()):
                out.extend(group)
        return out


def _toks(text: str) -> list[Token]:
    """Generated MSL tokens (no place in the source)."""
    return [Token(t.kind, t.text, 0, 0, t.space) for t in tokenize(text)[:-1]]


def uses_soft_floats(ts: Iterable[Token]) -> bool:
    """True when the tokens name half, bfloat, their vectors or SIMD-group matrices, or hold a ``1.5h`` literal."""
    for t in ts:
        if t.kind == ID and (is_soft(t.text) or t.text in ("simdgroup_half8x8", "simdgroup_bfloat8x8")):
            return True
        if t.kind == NUM and _half_literal(t.text):
            return True
    return False


def _half_literal(text: str) -> bool:
    return text[-1:] in ("h", "H") and not text.lower().startswith("0x")


def lower_soft_floats(ts: list[Token], items: list[tuple[str, int, int]], struct_names: set[str]) -> list[Token]:
    """The MSL tokens ``ts`` (its top-level ``items`` as ``translate`` splits them, the names of its structs) with
    half and bfloat computed in software (module docstring). Returns ``ts`` itself when the library uses neither.
    Raises ``UnsupportedKernelError`` for a use of a 16-bit float the rewrite cannot type."""
    if not uses_soft_floats(ts):
        return ts
    return _Lowering(ts, items, struct_names).run()


class _Lowering:
    def __init__(self, ts: list[Token], items: list[tuple[str, int, int]], struct_names: set[str]) -> None:
        self.ts = ts
        self.items = items
        self.structs = set(struct_names)
        self.parser = Parser(ts, self._is_type)
        self.edits = _Edits()
        self.globals: dict[str, _Sym] = {}
        self.scopes: list[dict[str, _Sym]] = []
        self.sigs: dict[str, _Sig] = {}
        self.ret: Ty | None = None

    def _is_type(self, name: str) -> bool:
        return (name in SCALARS or name in VECTORS or name in self.structs or name in MATRIX_TYPES
                or name == "simdgroup_matrix")

    def run(self) -> list[Token]:
        for kind, start, end in self.items:
            if kind == "struct":
                self._struct(start, end)
        for kind, start, end in self.items:
            if kind in ("kernel", "function") or (kind == "decl" and self._is_prototype(start, end)):
                self._signature(kind, start, end)
            elif kind == "pp":
                self._define(start)
        for kind, start, end in self.items:
            if kind in ("decl", "init") and not self._is_prototype(start, end):
                self._program_scope(start, end)
            elif kind in ("kernel", "function"):
                self._function(kind, start, end)
        return self.edits.render(self.ts)

    # --- types ---

    def _type_of(self, decl: Declaration) -> tuple[str, int]:
        """(base, width) of a declaration's type name."""
        t = self.ts[decl.type_at]
        if t.text == "simdgroup_matrix":
            elem = self.ts[decl.type_at + 2].text
            return f"simdgroup_{elem}8x8", 1
        if t.text in VECTORS:
            return VECTORS[t.text]
        return t.text, 1

    def _space(self, decl: Declaration) -> str:
        words = [self.ts[q].text for q in decl.qualifiers]
        return next((w for w in words if w in _SPACES), "")

    def _replace_type(self, i: int, base: str, n: int, memory: bool) -> None:
        """Write the OpenCL representation of a 16-bit float type at token ``i``: ``ushort`` in memory, else
        ``float`` (with the width)."""
        if base in SOFT_FLOATS:
            self.edits.text[i] = ("ushort" if memory else "float") + (str(n) if n > 1 else "")

    def _declared(self, decl: Declaration, d_pointer: int, dims: int, space: str, base: str, n: int) -> Ty:
        if d_pointer:
            return Ty(base, n, space or "thread", d_pointer + dims)
        if dims:
            return Ty(base, n, space if space in _MEMORY else "thread", dims)
        return Ty(base, n)

    # --- top level ---

    def _struct(self, start: int, end: int) -> None:
        for k in range(start, end):
            if self.ts[k].kind == ID and is_soft(self.ts[k].text):
                refuse(self.ts[k], f"{self.ts[k].text} in a struct", "a struct member of a 16-bit float type: the "
                       "simulated device computes half and bfloat in software and cannot lay such a struct out")

    def _head(self, start: int, end: int) -> tuple[int, int, int] | None:
        """(name index, ``(`` index, ``)`` index) of a function item."""
        open_ = next((j for j in range(start, end) if self.ts[j].kind == PUNCT and self.ts[j].text == "("), None)
        if open_ is None or open_ == start or self.ts[open_ - 1].kind != ID:
            return None
        return open_ - 1, open_, group_end(self.ts, open_)

    def _is_prototype(self, start: int, end: int) -> bool:
        head = self._head(start, end)
        return head is not None and self.parser.declaration(start, end) is None

    def _return_type(self, start: int, name: int) -> tuple[Ty | None, int | None]:
        words = [k for k in range(start, name) if self.ts[k].kind == ID and self.ts[k].text not in
                 TYPE_QUALIFIERS | {"kernel", "METAL_FUNC", "struct", "extern"}]
        if len(words) != 1 or not self._is_type(self.ts[words[0]].text):
            return None, None
        text = self.ts[words[0]].text
        base, n = VECTORS.get(text, (text, 1))
        return (None if text == "void" else Ty(base, n)), words[0]

    def _params(self, open_: int, close: int) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        j = a = open_ + 1
        while j < close:
            if self.ts[j].kind == PUNCT and self.ts[j].text in ("(", "["):
                j = group_end(self.ts, j) + 1
                continue
            if self.ts[j].kind == PUNCT and self.ts[j].text == ",":
                spans.append((a, j))
                a = j + 1
            j += 1
        if close > open_ + 1:
            spans.append((a, close))
        return spans

    def _param(self, a: int, b: int) -> tuple[str, Ty | None, Declaration | None]:
        """A parameter's name, type and declaration (its ``[[attribute]]`` ignored)."""
        cut = next((k for k in range(a, b - 1) if self.ts[k].text == "[" and self.ts[k + 1].text == "["), b)
        attr = self.ts[cut + 2].text if cut < b else ""
        refs = [k for k in range(a, cut) if self.ts[k].text == "&"]
        names = [k for k in range(a, cut) if self.ts[k].kind == ID]
        if not names:
            return "", None, None
        name = self.ts[names[-1]].text
        if attr in POSITIONS or attr in POSITIONS_LINEAR or attr.startswith(("thread", "simdgroup", "quadgroup")):
            text = self.ts[names[0]].text if names[0] != names[-1] else "uint"
            base, n = VECTORS.get(text, (text, 1))
            return name, Ty(base, n), None
        decl = self._param_declaration(a, cut, refs)
        if decl is None:
            return name, None, None
        base, n = self._type_of(decl)
        d = decl.declarators[0]
        return name, self._declared(decl, d.pointer, len(d.dims), self._space(decl), base, n), decl

    def _param_declaration(self, a: int, cut: int, refs: list[int]) -> Declaration | None:
        if refs:  # `constant T& name`: a value of type T
            saved = self.ts[refs[0]]
            self.ts[refs[0]] = Token(ID, "const", saved.line, saved.col, saved.space)
            try:
                return self.parser.declaration(a, cut)
            finally:
                self.ts[refs[0]] = saved
        return self.parser.declaration(a, cut)

    def _signature(self, kind: str, start: int, end: int) -> None:
        head = self._head(start, end)
        if head is None:
            return
        name, open_, close = head
        ret, _ = self._return_type(start, name)
        params = [self._param(a, b)[1] for a, b in self._params(open_, close)]
        self.sigs[self.ts[name].text] = _Sig(ret, params)

    def _define(self, i: int) -> None:
        """``#define NAME 4`` (a number): a name of the literal's type (other macros stay unknown)."""
        words = self.ts[i].text[1:].split()
        if len(words) == 3 and words[0] == "define" and tokenize(words[2])[0].kind == NUM and "(" not in words[1]:
            if not _half_literal(words[2]):
                self.globals[words[1]] = _Sym(_literal_type(words[2]))

    def _program_scope(self, start: int, end: int) -> None:
        decl = self.parser.declaration(start, end)
        if decl is None:
            for k in range(start, end):
                if self.ts[k].kind == ID and is_soft(self.ts[k].text):
                    refuse(self.ts[k], self.ts[k].text, "a program-scope use of a 16-bit float type the simulated "
                           "device cannot rewrite (it computes half and bfloat in software)")
            return
        base, n = self._type_of(decl)
        for d in decl.declarators:
            ty = self._declared(decl, d.pointer, len(d.dims), self._space(decl) or "constant", base, n)
            name = self.ts[d.name].text
            if base in SOFT_FLOATS and not d.pointer:
                self._fold_constant(d.init, base, self.ts[d.name])
                self.globals[name] = _Sym(Ty(base, n, "constant", len(d.dims)) if d.dims else Ty(base, n),
                                          bits=not d.dims)
            else:
                self.globals[name] = _Sym(ty)
        if base in SOFT_FLOATS:
            self.edits.text[decl.type_at] = "ushort" + (str(n) if n > 1 else "")

    def _fold_constant(self, init: Node | None, base: str, where: Token) -> None:
        """A program-scope constant's initializer of literal numbers -> their 16 bits (OpenCL needs constant
        initializers: no function calls)."""
        if init is None:
            return
        if init.kind == "init":
            for kid in init.kids:
                self._fold_constant(kid, base, where)
            return
        node, sign = init, 1.0
        while node.kind in ("unary", "paren") and node.op in ("-", "+", ""):
            sign = -sign if node.op == "-" else sign
            node = node.kids[0]
        if node.kind != "num":
            refuse(where, self.ts[init.start].text, "a program-scope half or bfloat constant initialised by "
                   "something other than literal numbers (the simulated device computes their 16 bits itself)")
        bits = _bits(base, sign * float(self.ts[node.start].text.rstrip("hHfF")))
        self.edits.text[init.start] = f"0x{bits:04x}"
        for k in range(init.start + 1, init.end):
            self.edits.text[k] = ""

    def _function(self, kind: str, start: int, end: int) -> None:
        head = self._head(start, end)
        if head is None:
            return
        name, open_, close = head
        self.ret, ret_at = self._return_type(start, name)
        if ret_at is not None and self.ret is not None:
            self._replace_type(ret_at, self.ret.base, self.ret.n, memory=False)
        scope: dict[str, _Sym] = {}
        for a, b in self._params(open_, close):
            pname, ty, decl = self._param(a, b)
            if ty is not None:
                scope[pname] = _Sym(ty)
            if decl is not None and kind != "kernel":  # a kernel's buffers keep their MSL types (translate)
                base, n = self._type_of(decl)
                self._replace_type(decl.type_at, base, n, memory=ty is not None and ty.depth > 0
                                   and ty.space in _MEMORY)
        body = next(j for j in range(close, end) if self.ts[j].text == "{")
        self.scopes = [self.globals, scope]
        self._block(body + 1, group_end(self.ts, body))
        self.scopes = []

    # --- statements ---

    def _block(self, i: int, end: int) -> None:
        while i < end:
            i = self._statement(i, end)

    def _semicolon(self, i: int, end: int) -> int:
        j = i
        while j < end:
            t = self.ts[j]
            if t.kind == PUNCT and t.text in ("(", "[", "{"):
                j = group_end(self.ts, j) + 1
                continue
            if t.kind == PUNCT and t.text == ";":
                return j
            j += 1
        self.parser._fail(i, "expected `;`")

    def _statement(self, i: int, end: int) -> int:
        t = self.ts[i]
        text = t.text if t.kind in (ID, PUNCT) else ""
        if t.kind == PP or text == ";":
            return i + 1
        if text == "{":
            close = group_end(self.ts, i)
            self.scopes.append({})
            self._block(i + 1, close)
            self.scopes.pop()
            return close + 1
        if text in ("if", "while", "switch") and at(self.ts, i + 1).text == "(":
            close = group_end(self.ts, i + 1)
            self._value(self.parser.expression(i + 2, close))
            j = self._statement(close + 1, end)
            if text == "if" and j < end and self.ts[j].text == "else":
                j = self._statement(j + 1, end)
            return j
        if text == "for" and at(self.ts, i + 1).text == "(":
            return self._for(i, end)
        if text == "do":
            j = self._statement(i + 1, end)
            close = group_end(self.ts, j + 1)
            self._value(self.parser.expression(j + 2, close))
            return close + 2
        if text == "return":
            semi = self._semicolon(i, end)
            if semi > i + 1:
                node = self.parser.expression(i + 1, semi)
                self._convert(node, self._value(node), self.ret)
            return semi + 1
        if text in ("break", "continue", "goto"):
            return self._semicolon(i, end) + 1
        if text in ("case", "default"):
            j = i
            while not (self.ts[j].kind == PUNCT and self.ts[j].text == ":"):
                j += 1
            return j + 1
        decl = self.parser.declaration(i, end)
        if decl is not None:
            self._declaration(decl)
            return decl.end
        semi = self._semicolon(i, end)
        self._statement_expression(self.parser.expression(i, semi))
        return semi + 1

    def _for(self, i: int, end: int) -> int:
        close = group_end(self.ts, i + 1)
        semis = []
        j = i + 2
        while j < close:
            if self.ts[j].kind == PUNCT and self.ts[j].text in ("(", "[", "{"):
                j = group_end(self.ts, j) + 1
                continue
            if self.ts[j].kind == PUNCT and self.ts[j].text == ";":
                semis.append(j)
            j += 1
        if len(semis) != 2:
            self.parser._fail(i, "expected `for (init; condition; step)`")
        self.scopes.append({})
        decl = self.parser.declaration(i + 2, semis[0] + 1) if semis[0] > i + 2 else None
        if decl is not None:
            self._declaration(decl)
        elif semis[0] > i + 2:
            self._statement_expression(self.parser.expression(i + 2, semis[0]))
        if semis[1] > semis[0] + 1:
            self._value(self.parser.expression(semis[0] + 1, semis[1]))
        if close > semis[1] + 1:
            self._statement_expression(self.parser.expression(semis[1] + 1, close))
        j = self._statement(close + 1, end)
        self.scopes.pop()
        return j

    def _declaration(self, decl: Declaration) -> None:
        base, n = self._type_of(decl)
        space = self._space(decl)
        memory: set[bool] = set()
        for d in decl.declarators:
            ty = self._declared(decl, d.pointer, len(d.dims), space, base, n)
            memory.add(ty.depth > 0 and ty.space in _MEMORY)
            for a, b in d.dims:
                self._value(self.parser.expression(a, b))
            if d.init is not None:
                self._initialise(d.init, ty)
            self.scopes[-1][self.ts[d.name].text] = _Sym(ty)
        if base in SOFT_FLOATS:
            if len(memory) > 1:
                refuse(self.ts[decl.type_at], self.ts[decl.type_at].text, "one declaration of 16-bit float "
                       "variables both in memory and in registers: declare them separately")
            self._replace_type(decl.type_at, base, n, memory=memory.pop())

    def _initialise(self, init: Node, ty: Ty) -> None:
        if init.kind == "init":
            elem = ty.element() if ty.depth else ty
            for kid in init.kids:
                self._initialise(kid, elem)
            return
        self._convert(init, self._value(init), ty)

    # --- expressions ---

    def _lookup(self, name: str) -> _Sym | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def _statement_expression(self, node: Node) -> None:
        if node.kind == "comma":
            for kid in node.kids:
                self._statement_expression(kid)
        elif node.kind == "assign":
            self._assign(node, used=False)
        elif node.kind == "paren":
            self._statement_expression(node.kids[0])
        else:
            self._value(node)

    def _value(self, node: Node) -> Ty | None:
        """Type ``node`` as a value: a 16-bit float read from memory is widened (``__mtl_h2f``)."""
        ty, bits = self._expr(node)
        if bits and ty is not None:
            self.edits.wrap(node.start, node.end, f"{_FROM_BITS[ty.base]}(")
        return ty

    def _expr(self, node: Node) -> tuple[Ty | None, bool]:
        """The type of ``node`` and whether it is a 16-bit float lvalue in memory (its 16 bits), with the edits
        of everything inside it made."""
        k = node.kind
        if k == "num":
            return self._number(node), False
        if k == "name":
            sym = self._lookup(node.name)
            if sym is not None:
                return sym.ty, sym.bits
            return (Ty(_CONSTANTS[node.name]) if node.name in _CONSTANTS else None), False
        if k == "paren":
            return self._expr(node.kids[0])
        if k == "unary":
            return self._unary(node)
        if k == "postfix":
            return self._increment(node), False
        if k == "binary":
            return self._binary(node), False
        if k == "assign":
            return self._assign(node, used=True), False
        if k == "ternary":
            return self._ternary(node), False
        if k == "comma":
            self._value(node.kids[0])
            return self._value(node.kids[1]), False
        if k == "index":
            return self._index(node)
        if k == "member":
            return self._member(node)
        if k == "call":
            return self._call(node)
        if k == "cast":
            return self._cast(node), False
        if k == "typecall":
            return self._typecall(node), False
        if k == "template":
            return self._template(node), False
        if k == "sizeof":
            return self._sizeof(node), False
        if k == "init":
            for kid in node.kids:
                self._value(kid)
        return None, False

    def _number(self, node: Node) -> Ty:
        text = self.ts[node.start].text
        if _half_literal(text):
            self.edits.text[node.start] = _float_literal(float(np.float16(float(text[:-1]))))
            return Ty("half")
        return _literal_type(text)

    def _unary(self, node: Node) -> tuple[Ty | None, bool]:
        kid, op = node.kids[0], node.op
        if op in ("-", "+", "~"):
            ty = self._value(kid)
            return (_promote(ty) if ty is not None else None), False
        if op == "!":
            self._value(kid)
            return Ty("bool"), False
        if op == "*":
            ptr = self._value(kid)
            return self._element(ptr)
        if op == "&":
            ty, bits = self._expr(kid)
            if ty is None:
                return None, False
            return Ty(ty.base, ty.n, ty.space if ty.depth else ("device" if bits else "thread"), ty.depth + 1), False
        return self._increment(node), False

    def _element(self, ptr: Ty | None) -> tuple[Ty | None, bool]:
        if ptr is None or ptr.depth == 0:
            return None, False
        elem = ptr.element()
        return elem, elem.depth == 0 and elem.base in SOFT_FLOATS and ptr.space in _MEMORY

    def _increment(self, node: Node) -> Ty | None:
        ty, _ = self._expr(node.kids[0])
        if ty is not None and ty.soft:
            refuse(self.ts[node.start], f"{node.op} on {ty.base}", "increment and decrement of a 16-bit float are "
                   "not supported by the software half and bfloat of the simulated device (write x = x + 1)")
        return ty

    def _binary(self, node: Node) -> Ty | None:
        left, right = node.kids
        op = node.op
        lt, rt = self._value(left), self._value(right)
        if op in ("&&", "||"):
            return Ty("bool")
        if (lt is not None and lt.depth) or (rt is not None and rt.depth):
            return lt if lt is not None and lt.depth else rt  # pointer arithmetic
        soft = (lt is not None and lt.soft) or (rt is not None and rt.soft)
        if op in ("%", "&", "|", "^", "<<", ">>"):
            if soft:
                refuse(self.ts[node.start], op, f"`{op}` on a 16-bit float")
            return lt
        ot = _usual(lt, rt)
        if soft and ot is None:
            self._untyped(node, lt, rt)
        self._convert(left, lt, ot)
        self._convert(right, rt, ot)
        if op in ("<", ">", "<=", ">=", "==", "!="):
            return Ty("bool", ot.n if ot is not None else 1)
        if ot is not None and ot.soft:
            self.edits.wrap(node.start, node.end, f"{_ROUND[ot.base]}(")
        return ot

    def _untyped(self, node: Node, *tys: Ty | None) -> NoReturn:
        what = " and ".join(f"{t.base}{t.n if t.n > 1 else ''}" if t is not None else "an expression of unknown type"
                            for t in tys)
        refuse(self.ts[node.start], self.ts[node.start].text, f"the simulated device computes half and bfloat in "
               f"software and cannot tell the type of this operation on {what} (a name or function it does not "
               "know, a macro, mixed vector types)")

    def _ternary(self, node: Node) -> Ty | None:
        cond, a, b = node.kids
        self._value(cond)
        at_, bt = self._value(a), self._value(b)
        if at_ is not None and bt is not None and at_.arithmetic and bt.arithmetic:
            ot = _usual(at_, bt)
            if ot is None and (at_.soft or bt.soft):
                self._untyped(node, at_, bt)
            self._convert(a, at_, ot)
            self._convert(b, bt, ot)
            return ot
        if (at_ is None or bt is None) and ((at_ is not None and at_.soft) or (bt is not None and bt.soft)):
            self._untyped(node, at_, bt)
        return at_ if at_ is not None else bt

    def _assign(self, node: Node, used: bool) -> Ty | None:
        left, right = node.kids
        lt, bits = self._expr(left)
        rt = self._value(right)
        if node.op == "=":
            if bits and lt is not None:
                if used:
                    refuse(self.ts[node.start], "=", "the value of an assignment to a 16-bit float in memory")
                self._to_bits(right, rt, lt)
            else:
                if lt is None and rt is not None and rt.soft:
                    self._untyped(node, lt, rt)
                self._convert(right, rt, lt)
            return lt
        op = node.op[:-1]
        if op not in ("+", "-", "*", "/"):
            if (lt is not None and lt.soft) or (rt is not None and rt.soft):
                refuse(self.ts[node.start], node.op, f"`{node.op}` on a 16-bit float")
            return lt
        ot = _usual(lt, rt) if lt is None or lt.depth == 0 else lt
        soft = bits or (lt is not None and lt.soft) or (ot is not None and ot.soft)
        if not soft:
            return lt
        if ot is None or lt is None:
            self._untyped(node, lt, rt)
        if used:
            refuse(self.ts[node.start], node.op, f"the value of a compound assignment to a 16-bit float")
        self._pure(left)
        self._compound(node, lt, bits, ot, rt)
        return lt

    def _compound(self, node: Node, lt: Ty, bits: bool, ot: Ty, rt: Ty | None) -> None:
        """``L op= R`` -> ``L = conv(conv(L) op (R))``: the operation in MSL's type, then the conversion to L's."""
        left, right = node.kids
        op_at = left.end
        copy = [Token(t.kind, t.text, t.line, t.col, t.space if k else "")
                for k, t in enumerate(self.ts[left.start:left.end])]
        if bits:  # __mtl_f2h rounds the float of the operation once
            head = f"{_TO_BITS[lt.base]}("
        elif lt.soft or ot.soft:
            head = f"{_ROUND[lt.base if lt.soft else ot.base]}("
        else:
            head = ""
        tail = ")" if head else ""
        value = copy
        if bits:
            value = _toks(f"{_FROM_BITS[lt.base]}(") + copy + _toks(")")
        if ot.soft and not lt.soft:
            value = _toks(f"{_ROUND[ot.base]}(float{_width(lt)}(") + value + _toks("))")
        self._convert(right, rt, ot)
        self.edits.text[op_at] = "="
        inserted = _toks(head) + value + _toks(f" {node.op[:-1]} (")
        self.edits.insert_after(op_at, [inserted[0].with_space(" "), *inserted[1:]])
        self.edits.insert_after(right.end - 1, _toks(")" + tail))

    def _pure(self, node: Node) -> None:
        """Refuse an lvalue that may have side effects (it is evaluated twice in ``L = L op R``)."""
        for k in range(node.start, node.end):
            t = self.ts[k]
            before = self.ts[k - 1] if k > node.start else None
            call = (t.text == "(" and before is not None and before.kind == ID and not self._is_type(before.text)
                    and before.text not in TYPE_QUALIFIERS)
            if t.kind == PUNCT and (t.text in ("++", "--") or t.text in _ASSIGNMENTS or call):
                refuse(self.ts[node.start], self.ts[node.start].text, "a compound assignment to a 16-bit float "
                       "whose target has side effects (a call, ++, an assignment): write it as x = x op y")

    def _index(self, node: Node) -> tuple[Ty | None, bool]:
        base, index = node.kids
        ty, bits = self._expr(base)
        self._value(index)
        if ty is None:
            return None, False
        if ty.depth:
            return self._element(ty)
        if ty.n > 1:
            return Ty(ty.base), bits
        return None, False

    def _member(self, node: Node) -> tuple[Ty | None, bool]:
        obj = node.kids[0]
        if node.op == "->":
            self._value(obj)
            return None, False
        ty, bits = self._expr(obj)
        if ty is None or ty.depth:
            return None, False
        if ty.n > 1 or ty.arithmetic:
            comps = node.name
            if all(c in "xyzw" for c in comps) or all(c in "rgba" for c in comps):
                return Ty(ty.base, len(comps)), bits
        return None, False

    def _call(self, node: Node) -> tuple[Ty | None, bool]:
        callee, args = node.kids[0], node.kids[1:]
        if callee.kind == "member" and callee.name == "thread_elements" and callee.op == ".":
            ty, _ = self._expr(callee.kids[0])
            if ty is not None and ty.base in MATRIX_TYPES:
                return Ty(MATRIX_TYPES[ty.base], 2), False
            return None, False
        if callee.kind != "name":
            for a in args:
                self._value(a)
            return None, False
        name = callee.name
        if name in self.sigs:
            sig = self.sigs[name]
            for a, pt in zip(args, sig.params + [None] * len(args)):
                self._convert(a, self._value(a), pt)
            return sig.ret, False
        if name == "__builtin_convertvector" and len(args) == 2 and args[1].kind == "typename":
            self._value(args[0])
            target = args[1].name
            base, n = VECTORS.get(target, (target, 1))
            if base in SOFT_FLOATS:
                self._replace_type(args[1].start, base, n, memory=False)
                self.edits.wrap(node.start, node.end, f"{_ROUND[base]}(")
            return Ty(base, n), False
        types = [self._value(a) for a in args]
        return self._builtin(node, name, args, types), False

    def _builtin(self, node: Node, name: str, args: list[Node], types: list[Ty | None]) -> Ty | None:
        soft = any(t is not None and t.soft for t in types)
        if name in _MOVES:
            return types[0] if types else None
        if name in _BOOL_FUNCTIONS:
            return Ty("bool")
        if name in _BOOL_RESULT:
            return Ty("bool", types[0].n if types and types[0] is not None else 1)
        if name == "simd_ballot":
            return Ty("ulong")
        generic = name in _SAME or name in _SCALAR_RESULT or name == "ldexp" or name == "select"
        if not generic:
            return None
        operands = [(a, t) for k, (a, t) in enumerate(zip(args, types))
                    if not (name == "ldexp" and k == 1) and not (name == "select" and k == 2)]
        ot: Ty | None = operands[0][1] if operands else None
        for _, t in operands[1:]:
            ot = _usual(ot, t)
        if soft and ot is None:
            self._untyped(node, *types)
        if ot is None:
            return None
        for a, t in operands:
            self._convert(a, t, ot)
        result = Ty(ot.base) if name in _SCALAR_RESULT else ot
        if result.soft and name in ("min", "max"):  # MSL's are fmin/fmax: a NaN operand gives the other one
            self.edits.text[node.kids[0].end - 1] = "f" + name
        if result.soft and name not in ("select",):
            self.edits.wrap(node.start, node.end, f"{_ROUND[result.base]}(")
        return result

    def _cast(self, node: Node) -> Ty | None:
        a, b = node.type_span
        words = [k for k in range(a, b) if self.ts[k].kind == ID]
        names = [k for k in words if self._is_type(self.ts[k].text) and self.ts[k].text not in TYPE_QUALIFIERS]
        stars = sum(1 for k in range(a, b) if self.ts[k].text == "*")
        kid = node.kids[0]
        if not names:
            self._value(kid)
            return None
        text = self.ts[names[0]].text
        base, n = VECTORS.get(text, (text, 1))
        if stars:
            space = next((self.ts[k].text for k in words if self.ts[k].text in _SPACES), "thread")
            self._replace_type(names[0], base, n, memory=space in _MEMORY)
            self._value(kid)
            return Ty(base, n, space, stars)
        kt = self._value(kid)
        ty = Ty(base, n)
        if ty.soft:
            self._replace_type(names[0], base, n, memory=False)
            if kt is None or kt.base != base:
                self.edits.wrap(node.start, node.end, f"{_ROUND[base]}(")
        return ty

    def _typecall(self, node: Node) -> Ty | None:
        text = node.name
        if text in MATRIX_TYPES:
            for a in node.kids:
                self._convert(a, self._value(a), Ty(MATRIX_TYPES[text]))
            return Ty(text)
        base, n = VECTORS.get(text, (text, 1))
        types = [self._value(a) for a in node.kids]
        ty = Ty(base, n)
        if ty.soft:
            self._replace_type(node.start, base, n, memory=False)
            if node.kids and not all(t is not None and t.soft and t.base == base for t in types):
                self.edits.wrap(node.start, node.end, f"{_ROUND[base]}(")
        return ty

    def _template(self, node: Node) -> Ty | None:
        a, b = node.type_span
        text = self.ts[a].text if b == a + 1 else ""
        base, n = VECTORS.get(text, (text, 1))
        if node.name in ("make_filled_simdgroup_matrix", "simdgroup_matrix"):
            for kid in node.kids:
                self._convert(kid, self._value(kid), Ty(base))
            return Ty(f"simdgroup_{base}8x8")
        if len(node.kids) != 1 or not text:
            for kid in node.kids:
                self._value(kid)
            return Ty(base, n) if text else None
        kid = node.kids[0]
        kt = self._value(kid)
        ty = Ty(base, n)
        if node.name == "static_cast":
            if ty.soft:
                self._replace_type(a, base, n, memory=False)
                if kt is None or kt.base != base:
                    self.edits.wrap(node.start, node.end, f"{_ROUND[base]}(")
            return ty
        # as_type<T>(x): the same bits, read as T: a 16-bit float's bits are its storage (ushort)
        if kt is not None and kt.soft:
            self.edits.wrap(kid.start, kid.end, f"{_TO_BITS[kt.base]}(")
        if ty.soft:
            self.edits.text[a] = f"ushort{n if n > 1 else ''}"
            self.edits.wrap(node.start, node.end, f"{_FROM_BITS[base]}(")
        return ty

    def _sizeof(self, node: Node) -> Ty:
        a, b = node.type_span
        if node.kids:
            ty = self._value(node.kids[0])
            if ty is not None and ty.soft:
                refuse(self.ts[node.start], "sizeof", "sizeof of a 16-bit float expression")
        else:
            for k in range(a, b):
                if self.ts[k].kind == ID and is_soft(self.ts[k].text):
                    base, n = VECTORS.get(self.ts[k].text, (self.ts[k].text, 1))
                    if b != a + 1:
                        refuse(self.ts[k], "sizeof", "sizeof of a type built on a 16-bit float")
                    self.edits.text[k] = f"ushort{n if n > 1 else ''}"
        return Ty("ulong")

    # --- conversions ---

    def _convert(self, node: Node, frm: Ty | None, to: Ty | None) -> None:
        """Make ``node`` (of type ``frm``) a value of type ``to`` where that conversion rounds: to half or bfloat
        from any other type. Conversions from a 16-bit float are exact (to float) or the same as from its float
        (to an integer) and need nothing."""
        if to is None or not to.soft:
            return
        if frm is not None and (frm.depth or not frm.arithmetic):
            return
        if frm is not None and frm.base == to.base:
            return
        n = frm.n if frm is not None else to.n
        if frm is not None and frm.base in _FLOATS:
            self.edits.wrap(node.start, node.end, f"{_ROUND[to.base]}(")
        else:
            self.edits.wrap(node.start, node.end, f"{_ROUND[to.base]}(float{n if n > 1 else ''}(", "))")

    def _to_bits(self, node: Node, frm: Ty | None, to: Ty) -> None:
        """A value stored to 16-bit float memory: its float (an integer converted first), narrowed to the 16 bits
        (``__mtl_f2h`` rounds)."""
        if frm is not None and frm.depth:
            return
        if frm is None or frm.base not in _FLOATS:
            n = frm.n if frm is not None else to.n
            self.edits.wrap(node.start, node.end, f"{_TO_BITS[to.base]}(float{n if n > 1 else ''}(", "))")
        else:
            self.edits.wrap(node.start, node.end, f"{_TO_BITS[to.base]}(")


def _literal_type(text: str) -> Ty:
    """The type of a number literal: float (a ``.``, an exponent or ``f``; hex floats with ``p``), else int,
    uint, long or ulong by its suffix."""
    low = text.lower()
    hexa = low.startswith("0x")
    if ("p" in low) if hexa else ("." in low or "e" in low or low.endswith("f")):
        return Ty("float")
    suffix = low[len(low.rstrip("ul")):]
    return Ty(("u" if "u" in suffix else "") + ("long" if "l" in suffix else "int"))


def _width(ty: Ty) -> str:
    return str(ty.n) if ty.n > 1 else ""


def _promote(ty: Ty) -> Ty:
    """C's integer promotion (char and short to int); other types as they are."""
    return Ty("int", ty.n) if ty.depth == 0 and ty.n == 1 and _INT_RANK.get(ty.base, 9) < 3 else ty


def _usual(a: Ty | None, b: Ty | None) -> Ty | None:
    """MSL's (C++'s) usual arithmetic conversions of two operands: the type an operation computes in; None when
    either is unknown or not arithmetic, or for two vectors of different types. A scalar meeting a vector becomes
    the vector's element type (Clang's vector rules, which Metal's compiler follows)."""
    if a is None or b is None or not a.arithmetic or not b.arithmetic:
        return None
    if a.n != b.n:
        if a.n > 1 and b.n > 1:
            return None
        vec = a if a.n > 1 else b
        return Ty(vec.base, vec.n)
    if a.n > 1:
        return Ty(a.base, a.n) if a.base == b.base else None
    fa, fb = a.base in _FLOATS, b.base in _FLOATS
    if fa or fb:
        if fa and fb and a.base != b.base:
            return Ty("float") if "float" in (a.base, b.base) else None
        return Ty(a.base if fa else b.base)
    pa, pb = _promote(a), _promote(b)
    ra, rb = _INT_RANK[pa.base], _INT_RANK[pb.base]
    if ra != rb:
        return pa if ra > rb else pb
    return pa if pa.base.startswith("u") else pb


def _bits(base: str, value: float) -> int:
    """The 16 bits of ``value`` rounded to half or bfloat (to nearest, ties to even)."""
    if base == "half":
        return int(np.float16(value).view(np.uint16))
    f = int(np.float32(value).view(np.uint32))
    if (f & 0x7FFFFFFF) > 0x7F800000:
        return (f >> 16) | 0x40
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16) & 0xFFFF


def _float_literal(value: float) -> str:
    """An OpenCL C single-precision literal of exactly ``value`` (a half value: exact in float)."""
    if value != value:
        return "NAN"
    if value == float("inf"):
        return "INFINITY"  # a literal is never negative: its minus is an operator
    return f"{value!r}f" if "e" in repr(value) or "." in repr(value) else f"{value!r}.0f"


def _vector_overloads(ret: str, arg: str, body: str) -> list[str]:
    """``static inline`` overloads of one conversion for the scalar and 2-, 3-, 4-vectors (``{r}``, ``{a}``: the
    return and argument types at each width, ``{n}``: the width's suffix)."""
    out = []
    for n in ("", "2", "3", "4"):
        out.append("static inline __attribute__((overloadable)) " + body.format(r=ret + n, a=arg + n, n=n))
    return out


def _softfloat_prelude() -> str:
    lines = [
        "// half and bfloat in software (softfloat): bits <-> float, rounding to nearest, ties to even",
        "static inline __attribute__((overloadable)) ushort __mtl_f2h(float f) {",
        "  uint x = as_uint(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;",
        "  if (a > 0x7f800000u) return (ushort)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  /* NaN stays a quiet NaN */",
        "  if (a >= 0x477ff000u) return (ushort)(sign | 0x7c00u);  /* 65520 and above round to infinity */",
        "  if (a >= 0x38800000u) {  /* a normal half: rebias the exponent, round the 13 bits dropped */",
        "    uint r = a - 0x38000000u;",
        "    return (ushort)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));",
        "  }",
        "  return (ushort)(sign | (uint)rint(as_float(a) * 16777216.0f));  /* subnormal: multiples of 2^-24 */",
        "}",
        "static inline __attribute__((overloadable)) float __mtl_h2f(ushort h) {",
        "  uint sign = (uint)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;",
        "  if (e == 31u) return as_float(sign | 0x7f800000u | (m << 13));",
        "  if (e == 0u) return as_float(sign | as_uint((float)m * 5.9604644775390625e-8f));",
        "  return as_float(sign | ((e + 112u) << 23) | (m << 13));",
        "}",
        "static inline __attribute__((overloadable)) ushort __mtl_f2b(float f) {",
        "  uint x = as_uint(f);",
        "  if ((x & 0x7fffffffu) > 0x7f800000u) return (ushort)((x >> 16) | 0x40u);  /* NaN stays a quiet NaN */",
        "  return (ushort)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);",
        "}",
        "static inline __attribute__((overloadable)) float __mtl_b2f(ushort b) { return as_float((uint)b << 16); }",
    ]
    for name, conv in (("__mtl_f2h", "ushort"), ("__mtl_f2b", "ushort")):
        for n in ("2", "3", "4"):
            parts = ", ".join(f"{name}(x.s{k})" for k in range(int(n)))
            lines.append(f"static inline __attribute__((overloadable)) {conv}{n} {name}(float{n} x) "
                         f"{{ return ({conv}{n})({parts}); }}")
    for name in ("__mtl_h2f", "__mtl_b2f"):
        for n in ("2", "3", "4"):
            parts = ", ".join(f"{name}(x.s{k})" for k in range(int(n)))
            lines.append(f"static inline __attribute__((overloadable)) float{n} {name}(ushort{n} x) "
                         f"{{ return (float{n})({parts}); }}")
    lines += _vector_overloads("float", "float", "{r} __mtl_rh({a} x) {{ return __mtl_h2f(__mtl_f2h(x)); }}")
    lines += _vector_overloads("float", "float", "{r} __mtl_rb({a} x) {{ return __mtl_b2f(__mtl_f2b(x)); }}")
    return "\n".join(lines)


# The OpenCL C definitions of the conversions the rewrite calls (``prelude`` adds them when the library uses 16-bit
# floats): ``__mtl_f2h``/``__mtl_f2b`` (float -> 16 bits, rounding), ``__mtl_h2f``/``__mtl_b2f`` (16 bits -> float,
# exact), ``__mtl_rh``/``__mtl_rb`` (a float rounded to the nearest half / bfloat), for scalars and 2-4 vectors.
SOFTFLOAT_PRELUDE = _softfloat_prelude()
