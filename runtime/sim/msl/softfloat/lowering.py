"""The soft-float rewrite of a library (``lower_soft_floats``): the pass over its top-level items (structs,
signatures, ``#define`` numbers, program-scope constants, functions) and the statements of each function body, whose
expressions ``expressions`` types and rounds."""
from __future__ import annotations

from collections.abc import Iterable

from mtlir.runtime.sim.msl.cexpr import TYPE_QUALIFIERS, Declaration, Node
from mtlir.runtime.sim.msl.lex import ID, NUM, PP, PUNCT, Token, tokenize
from mtlir.runtime.sim.msl.names import POSITIONS, POSITIONS_LINEAR, SOFT_FLOATS, VECTORS, is_soft
from mtlir.runtime.sim.msl.rewrite import at, group_end, refuse
from mtlir.runtime.sim.msl.softfloat.expressions import ExpressionTyper, Sig, Sym
from mtlir.runtime.sim.msl.softfloat.rounding import bits_of
from mtlir.runtime.sim.msl.softfloat.types import MEMORY, SPACES, Ty, half_literal, literal_type

__all__ = ["lower_soft_floats", "uses_soft_floats"]


def uses_soft_floats(ts: Iterable[Token]) -> bool:
    """True when the tokens name half, bfloat, their vectors or SIMD-group matrices, or hold a ``1.5h`` literal."""
    for t in ts:
        if t.kind == ID and (is_soft(t.text) or t.text in ("simdgroup_half8x8", "simdgroup_bfloat8x8")):
            return True
        if t.kind == NUM and half_literal(t.text):
            return True
    return False



def lower_soft_floats(ts: list[Token], items: list[tuple[str, int, int]], struct_names: set[str]) -> list[Token]:
    """The MSL tokens ``ts`` (its top-level ``items`` as ``translate`` splits them, the names of its structs) with
    half and bfloat computed in software (module docstring). Returns ``ts`` itself when the library uses neither.
    Raises ``UnsupportedKernelError`` for a use of a 16-bit float the rewrite cannot type."""
    if not uses_soft_floats(ts):
        return ts
    return _Lowering(ts, items, struct_names).run()


class _Lowering(ExpressionTyper):
    def __init__(self, ts: list[Token], items: list[tuple[str, int, int]], struct_names: set[str]) -> None:
        super().__init__(ts, struct_names)
        self.items = items
        self.globals: dict[str, Sym] = {}
        self.ret: Ty | None = None

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
        return next((w for w in words if w in SPACES), "")

    def _declared(self, decl: Declaration, d_pointer: int, dims: int, space: str, base: str, n: int) -> Ty:
        if d_pointer:
            return Ty(base, n, space or "thread", d_pointer + dims)
        if dims:
            return Ty(base, n, space if space in MEMORY else "thread", dims)
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
        self.sigs[self.ts[name].text] = Sig(ret, params)

    def _define(self, i: int) -> None:
        """``#define NAME 4`` (a number): a name of the literal's type (other macros stay unknown)."""
        words = self.ts[i].text[1:].split()
        if len(words) == 3 and words[0] == "define" and tokenize(words[2])[0].kind == NUM and "(" not in words[1]:
            if not half_literal(words[2]):
                self.globals[words[1]] = Sym(literal_type(words[2]))

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
                self.globals[name] = Sym(Ty(base, n, "constant", len(d.dims)) if d.dims else Ty(base, n),
                                          bits=not d.dims)
            else:
                self.globals[name] = Sym(ty)
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
        bits = bits_of(base, sign * float(self.ts[node.start].text.rstrip("hHfF")))
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
        scope: dict[str, Sym] = {}
        for a, b in self._params(open_, close):
            pname, ty, decl = self._param(a, b)
            if ty is not None:
                scope[pname] = Sym(ty)
            if decl is not None and kind != "kernel":  # a kernel's buffers keep their MSL types (translate)
                base, n = self._type_of(decl)
                self._replace_type(decl.type_at, base, n, memory=ty is not None and ty.depth > 0
                                   and ty.space in MEMORY)
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
            memory.add(ty.depth > 0 and ty.space in MEMORY)
            for a, b in d.dims:
                self._value(self.parser.expression(a, b))
            if d.init is not None:
                self._initialise(d.init, ty)
            self.scopes[-1][self.ts[d.name].text] = Sym(ty)
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
