"""Typing MSL expressions for the soft-float rewrite: the type of every expression of a function body (``cexpr``
parses them) from the declarations seen, each operation whose type is half or bfloat rounded right after it, each
conversion to one rounded, each 16-bit float read from memory widened and each store narrowed (``softfloat``'s
docstring). ``ExpressionTyper`` holds what the typing needs; ``lowering`` walks declarations and statements over it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from mtlir.runtime.sim.msl.cexpr import TYPE_QUALIFIERS, Node, Parser
from mtlir.runtime.sim.msl.lex import ID, PUNCT, Token
from mtlir.runtime.sim.msl.names import MATRIX_TYPES, SCALARS, SOFT_FLOATS, VECTORS, is_soft
from mtlir.runtime.sim.msl.rewrite import refuse
from mtlir.runtime.sim.msl.softfloat.edits import Edits, toks
from mtlir.runtime.sim.msl.softfloat.rounding import FROM_BITS, ROUND, TO_BITS, float_literal
from mtlir.runtime.sim.msl.softfloat.types import (FLOATS, MEMORY, SPACES, Ty, half_literal, literal_type, promote,
                                                   usual, width)

__all__ = ["ExpressionTyper", "Sym", "Sig"]

_ASSIGNMENTS = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="})
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


@dataclass
class Sym:
    """A name in scope: its type, and whether it reads the 16 bits of a 16-bit float."""

    ty: Ty
    bits: bool = False  # a program-scope constant 16-bit float: its name reads 16 bits


@dataclass
class Sig:
    """A function's signature: its return type (None: void or unknown) and its parameters' types."""

    ret: Ty | None
    params: list[Ty | None]


class ExpressionTyper:
    """The types of the expressions of one library's functions, with the edits that compute their half and bfloat
    operations in float and round them: ``scopes`` the names in scope (innermost last), ``sigs`` the functions'
    signatures, ``edits`` the rewrite made so far."""

    def __init__(self, ts: list[Token], struct_names: set[str]) -> None:
        self.ts = ts
        self.structs = set(struct_names)
        self.parser = Parser(ts, self._is_type)
        self.edits = Edits()
        self.scopes: list[dict[str, Sym]] = []
        self.sigs: dict[str, Sig] = {}

    def _is_type(self, name: str) -> bool:
        return (name in SCALARS or name in VECTORS or name in self.structs or name in MATRIX_TYPES
                or name == "simdgroup_matrix")

    def _replace_type(self, i: int, base: str, n: int, memory: bool) -> None:
        """Write the OpenCL representation of a 16-bit float type at token ``i``: ``ushort`` in memory, else
        ``float`` (with the width)."""
        if base in SOFT_FLOATS:
            self.edits.text[i] = ("ushort" if memory else "float") + (str(n) if n > 1 else "")


    def _lookup(self, name: str) -> Sym | None:
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
            self.edits.wrap(node.start, node.end, f"{FROM_BITS[ty.base]}(")
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
        if half_literal(text):
            self.edits.text[node.start] = float_literal(float(np.float16(float(text[:-1]))))
            return Ty("half")
        return literal_type(text)

    def _unary(self, node: Node) -> tuple[Ty | None, bool]:
        kid, op = node.kids[0], node.op
        if op in ("-", "+", "~"):
            ty = self._value(kid)
            return (promote(ty) if ty is not None else None), False
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
        return elem, elem.depth == 0 and elem.base in SOFT_FLOATS and ptr.space in MEMORY

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
        ot = usual(lt, rt)
        if soft and ot is None:
            self._untyped(node, lt, rt)
        self._convert(left, lt, ot)
        self._convert(right, rt, ot)
        if op in ("<", ">", "<=", ">=", "==", "!="):
            return Ty("bool", ot.n if ot is not None else 1)
        if ot is not None and ot.soft:
            self.edits.wrap(node.start, node.end, f"{ROUND[ot.base]}(")
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
            ot = usual(at_, bt)
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
        ot = usual(lt, rt) if lt is None or lt.depth == 0 else lt
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
            head = f"{TO_BITS[lt.base]}("
        elif lt.soft or ot.soft:
            head = f"{ROUND[lt.base if lt.soft else ot.base]}("
        else:
            head = ""
        tail = ")" if head else ""
        value = copy
        if bits:
            value = toks(f"{FROM_BITS[lt.base]}(") + copy + toks(")")
        if ot.soft and not lt.soft:
            value = toks(f"{ROUND[ot.base]}(float{width(lt)}(") + value + toks("))")
        self._convert(right, rt, ot)
        self.edits.text[op_at] = "="
        inserted = toks(head) + value + toks(f" {node.op[:-1]} (")
        self.edits.insert_after(op_at, [inserted[0].with_space(" "), *inserted[1:]])
        self.edits.insert_after(right.end - 1, toks(")" + tail))

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
        if node.op == "->":  # p->x is (*p).x: a vector pointer's component, else a struct member (untyped)
            ty, bits = self._element(self._value(obj))
        else:
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
                self.edits.wrap(node.start, node.end, f"{ROUND[base]}(")
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
            ot = usual(ot, t)
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
            self.edits.wrap(node.start, node.end, f"{ROUND[result.base]}(")
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
            space = next((self.ts[k].text for k in words if self.ts[k].text in SPACES), "thread")
            self._replace_type(names[0], base, n, memory=space in MEMORY)
            self._value(kid)
            return Ty(base, n, space, stars)
        kt = self._value(kid)
        ty = Ty(base, n)
        if ty.soft:
            self._replace_type(names[0], base, n, memory=False)
            if kt is None or kt.base != base:
                self.edits.wrap(node.start, node.end, f"{ROUND[base]}(")
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
                self.edits.wrap(node.start, node.end, f"{ROUND[base]}(")
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
                    self.edits.wrap(node.start, node.end, f"{ROUND[base]}(")
            return ty
        # as_type<T>(x): the same bits, read as T: a 16-bit float's bits are its storage (ushort)
        if kt is not None and kt.soft:
            self.edits.wrap(kid.start, kid.end, f"{TO_BITS[kt.base]}(")
        if ty.soft:
            self.edits.text[a] = f"ushort{n if n > 1 else ''}"
            self.edits.wrap(node.start, node.end, f"{FROM_BITS[base]}(")
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
        if frm is not None and frm.base in FLOATS:
            self.edits.wrap(node.start, node.end, f"{ROUND[to.base]}(")
        else:
            self.edits.wrap(node.start, node.end, f"{ROUND[to.base]}(float{n if n > 1 else ''}(", "))")

    def _to_bits(self, node: Node, frm: Ty | None, to: Ty) -> None:
        """A value stored to 16-bit float memory: its float (an integer converted first), narrowed to the 16 bits
        (``__mtl_f2h`` rounds)."""
        if frm is not None and frm.depth:
            return
        if frm is None or frm.base not in FLOATS:
            n = frm.n if frm is not None else to.n
            self.edits.wrap(node.start, node.end, f"{TO_BITS[to.base]}(float{n if n > 1 else ''}(", "))")
        else:
            self.edits.wrap(node.start, node.end, f"{TO_BITS[to.base]}(")

