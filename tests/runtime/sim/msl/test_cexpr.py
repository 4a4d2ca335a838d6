"""The C expression parser of msl.cexpr: C's precedence and associativity, casts and constructors, templates,
declarations; its trees span the tokens they came from."""
from __future__ import annotations

import pytest

from mtlir.runtime.sim.msl.cexpr import Node, Parser
from mtlir.runtime.sim.msl.lex import MslSyntaxError, Token, tokenize
from mtlir.runtime.sim.msl.names import is_type_name


def parse(src: str) -> tuple[Node, list[Token]]:
    ts = tokenize(src)
    return Parser(ts, is_type_name).expression(0, len(ts) - 1), ts


def shape(node: Node, ts: list[Token]) -> str:
    """The tree as a fully parenthesised string."""
    k = node.kind
    if k in ("name", "num", "typename"):
        return ts[node.start].text if k != "name" else node.name
    kids = [shape(x, ts) for x in node.kids]
    if k == "binary" or k == "assign" or k == "comma":
        return f"({kids[0]} {node.op} {kids[1]})"
    if k == "unary":
        return f"({node.op}{kids[0]})"
    if k == "postfix":
        return f"({kids[0]}{node.op})"
    if k == "ternary":
        return f"({kids[0]} ? {kids[1]} : {kids[2]})"
    if k == "paren":
        return kids[0]
    if k == "call":
        return f"{kids[0]}[{', '.join(kids[1:])}]"
    if k == "index":
        return f"{kids[0]}@{kids[1]}"
    if k == "member":
        return f"{kids[0]}{node.op}{node.name}"
    if k == "cast":
        return f"cast<{''.join(t.text for t in ts[node.type_span[0]:node.type_span[1]])}>{kids[0]}"
    if k in ("typecall", "template"):
        return f"{node.name}<{','.join(node.targs)}>[{', '.join(kids)}]"
    return k


@pytest.mark.parametrize("src, tree", [
    ("a + b * c - d", "((a + (b * c)) - d)"),
    ("a = b += c ? d : e", "(a = (b += (c ? d : e)))"),
    ("x << 1 < y && !z || w", "((((x << 1) < y) && (!z)) || w)"),
    ("*(p + 1) = -q[i].x++", "((*(p + 1)) = (-(q@i.x++)))"),
    ("(half)(x) * 2.0h", "(cast<half>x * 2.0h)"),
    ("(device half4*)((p + i))", "cast<devicehalf4*>(p + i)"),
    ("float4(a, b) + half(c)", "(float4<>[a, b] + half<>[c])"),
    ("as_type<uint>(f) & static_cast<int>(g)", "(as_type<>[f] & static_cast<>[g])"),
    ("make_filled_simdgroup_matrix<float, 8, 8>(0.0f)", "make_filled_simdgroup_matrix<8,8>[0.0f]"),
    ("metal::exp2(x), precise::sqrt(y)", "(exp2[x] , sqrt[y])"),
    ("m.thread_elements()[0]", "m.thread_elements[]@0"),
])
def test_precedence_and_forms(src: str, tree: str) -> None:
    node, ts = parse(src)
    assert shape(node, ts) == tree
    assert (node.start, node.end) == (0, len(ts) - 1)


def test_declarations() -> None:
    ts = tokenize("threadgroup half t[64], *p = t; half4 v = half4(1.0h); x = 1;")
    parser = Parser(ts, is_type_name)
    d = parser.declaration(0, len(ts) - 1)
    assert d is not None and ts[d.type_at].text == "half" and [ts[q].text for q in d.qualifiers] == ["threadgroup"]
    assert [(ts[x.name].text, x.pointer, len(x.dims), x.init is not None) for x in d.declarators] == [
        ("t", 0, 1, False), ("p", 1, 0, True)]
    d2 = parser.declaration(d.end, len(ts) - 1)
    assert d2 is not None and ts[d2.declarators[0].name].text == "v"
    assert parser.declaration(d2.end, len(ts) - 1) is None  # an expression statement
    assert parser.declaration(0, 0) is None


def test_syntax_errors_name_the_place() -> None:
    with pytest.raises(MslSyntaxError, match="line 1, column 5"):
        parse("a + ;")
