"""Text forms of a graph: ``render``/``parse`` (canonical, valid Python) and ``listing`` (compact, for reading).

``render(g)`` prints one assignment per node in toposort order, the graph last::

    x0 = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ('n', 1, 32))
    x1 = UOp(Ops.CONST, dtypes.int32, (), 1)
    x2 = UOp(Ops.ADD, dtypes.int32, (x0, x1))

The text is valid Python: evaluated with the names of ``namespace()`` it builds the graph. ``parse(text)`` does
exactly that without ``eval``: it checks every statement with the ``ast`` module and evaluates only assignments of
known constructors over literals, so ``parse(render(g)) is g`` and a text holding anything else is refused. It also
checks each node against ``mtlir.ir.spec`` (an ADD of two dtypes, a CONST<int32> 1.5, a DEFINE_VAR with min > max
are refused, naming the line); ``parse(text, verify=False)`` reads back the text of any graph.

Arg types: None, bool, int, float (``nan``, ``inf`` and ``-0.0`` exact), str, bytes, tuples and frozensets of
args, ``Ops``, dtypes (pointers, structs) and the frozen dataclasses and enums registered with
``register_arg_type`` (those of ``mtlir.metal`` are registered here; ``mtlir.passes`` registers its own).
"""
from __future__ import annotations

import ast
import dataclasses
import enum
import keyword
import math
import re
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from mtlir import metal
from mtlir.errors import InputError
from mtlir.ir.dtypes import DType, PtrDType, StructDType, dtypes
from mtlir.ir.ops import Ops
from mtlir.ir.spec import value_problem
from mtlir.ir.uop import UOp

__all__ = ["render", "parse", "listing", "register_arg_type", "namespace", "arg_text", "short_arg", "ParseError"]

T = TypeVar("T")


class ParseError(InputError, ValueError):
    """Text that is not the text form of a graph; the message names the line and what is wrong."""


# ---- the constructors the text may call

_BASE: dict[str, Any] = {"UOp": UOp, "Ops": Ops, "dtypes": dtypes, "DType": DType, "PtrDType": PtrDType,
                         "StructDType": StructDType}
_ARG_TYPES: dict[str, type] = {}


def register_arg_type(cls: type[T]) -> type[T]:
    """Allow ``cls`` as an arg in the text form (usable as a class decorator): a frozen dataclass prints as
    ``Name(field=value, ...)`` over its init fields, a NamedTuple as ``Name(field=value, ...)``, another tuple
    subclass as ``Name((item, ...))`` (its constructor takes one iterable), an Enum as ``Name.MEMBER``.
    Registering the same class again is a no-op. Raises ``TypeError`` for another kind of class and
    ``ValueError`` when a different class of the same name is already registered."""
    if not isinstance(cls, type):
        raise TypeError(f"register_arg_type: {cls!r} is not a class")
    is_frozen_dc = dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    if not (is_frozen_dc or issubclass(cls, (enum.Enum, tuple))):
        raise TypeError(f"register_arg_type: {cls.__qualname__} is not a frozen dataclass, an Enum, a NamedTuple "
                        "or a tuple subclass")
    name = cls.__name__
    have = _ARG_TYPES.get(name) or _BASE.get(name)
    if have is not None and have is not cls:
        raise ValueError(f"register_arg_type: another class named {name!r} is already registered ({have!r})")
    _ARG_TYPES[name] = cls
    return cls


for _cls in (metal.DeviceSpec, metal.Kernel, metal.KernelParam, metal.Obj, metal.Prototype, metal.Signature):
    register_arg_type(_cls)


def namespace() -> dict[str, Any]:
    """The names the text form uses: ``UOp``, ``Ops``, ``dtypes``, the DType classes and every registered arg type
    (with these, ``exec(render(g), namespace())`` builds the graph too)."""
    return {**_BASE, **_ARG_TYPES}


# ---- render

def _dtype_text(dt: DType) -> str:
    if isinstance(dt, PtrDType):
        return f"{_dtype_text(dt.base)}.ptr()"
    if getattr(dtypes, dt.name, None) is dt:
        return f"dtypes.{dt.name}"
    if isinstance(dt, StructDType):
        return f"StructDType({dt.name!r}, {dt.fields!r})"
    return f"DType({dt.name!r}, {dt.itemsize!r}, {dt.fmt!r}, {dt.kind!r})"


def _float_text(v: float) -> str:
    if v != v:
        return "float('nan')"
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    return repr(v)


def arg_text(v: Any) -> str:
    """``v`` as a Python expression that ``parse`` turns back into an equal value (same type, same bits).

    Raises ``TypeError`` for a type the text form does not know (register it with ``register_arg_type``)."""
    t = type(v)
    if v is None or t in (bool, int, str, bytes):
        return repr(v)
    if t is float:
        return _float_text(v)
    if t is tuple:
        return "(" + ", ".join(map(arg_text, v)) + ("," if len(v) == 1 else "") + ")"
    if t is frozenset:
        return "frozenset({" + ", ".join(sorted(map(arg_text, v))) + "})" if v else "frozenset()"
    if t is Ops:
        return f"Ops.{v.name}"
    if isinstance(v, DType):
        return _dtype_text(v)
    if _ARG_TYPES.get(t.__name__) is t:
        if isinstance(v, enum.Enum):
            return f"{t.__name__}.{v.name}"
        if isinstance(v, tuple):
            if hasattr(t, "_fields"):
                # by name, not by position: a tuple type may store its fields otherwise (IcbCommand)
                return f"{t.__name__}({', '.join(f'{f}={arg_text(getattr(v, f))}' for f in t._fields)})"
            return f"{t.__name__}({arg_text(tuple(v))})"
        fields = ", ".join(f"{f.name}={arg_text(getattr(v, f.name))}" for f in dataclasses.fields(v) if f.init)
        return f"{t.__name__}({fields})"
    raise TypeError(f"the text form has no way to print a {t.__qualname__} ({v!r:.60}): register its class with "
                    "mtlir.ir.render.register_arg_type (frozen dataclasses, NamedTuples, tuple subclasses, Enums)")


def _node_text(u: UOp, names: dict[UOp, str]) -> str:
    srcs = "(" + ", ".join(names[s] for s in u.src) + ("," if len(u.src) == 1 else "") + ")"
    parts = [f"Ops.{u.op.name}", _dtype_text(u.dtype), srcs]
    if u.arg is not None or u.tag is not None:
        parts.append(arg_text(u.arg))
    if u.tag is not None:
        parts.append(f"tag={arg_text(u.tag)}")
    return f"UOp({', '.join(parts)})"


def render(graph: UOp) -> str:
    """The canonical text form of ``graph``: one line ``xI = UOp(...)`` per node, ``I`` its toposort position,
    sources by name (so a shared node is printed once), the graph itself on the last line.

    Deterministic (the same text in every run). Raises ``TypeError`` for an arg of an unknown type, naming
    the node."""
    if not isinstance(graph, UOp):
        raise TypeError(f"render: {type(graph).__name__} is not a UOp")
    names: dict[UOp, str] = {}
    lines = []
    for i, u in enumerate(graph.toposort()):
        names[u] = name = f"x{i}"
        try:
            lines.append(f"{name} = {_node_text(u, names)}")
        except TypeError as e:
            raise TypeError(f"render: node {name} ({u.op!r}): {e}") from None
    return "\n".join(lines) + "\n"


# ---- parse

_FLOAT_WORDS = frozenset({"nan", "inf", "-inf", "+inf", "infinity", "-infinity"})


class _Evaluator:
    """Evaluates the restricted expression language of the text form over an AST, refusing anything else."""

    def __init__(self) -> None:
        self.env: dict[str, UOp] = {}
        self.names = namespace()
        self.offset = 0  # lines of the text above the piece being evaluated (its ast counts from 1)

    def fail(self, node: ast.AST, what: str) -> ParseError:
        line = getattr(node, "lineno", None)
        return ParseError(f"line {'?' if line is None else line + self.offset}, column "
                          f"{getattr(node, 'col_offset', -1) + 1}: {what}")

    def expr(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            if type(node.value) in (int, float, str, bytes, bool) or node.value is None:
                return node.value
            raise self.fail(node, f"a {type(node.value).__name__} literal is not an arg")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.expr(node.operand)
            if type(v) not in (int, float):
                raise self.fail(node, "a sign applies to a number only")
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Tuple):
            return tuple(self.expr(e) for e in node.elts)
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            raise self.fail(node, f"{node.id!r} is not a node defined on an earlier line")
        if isinstance(node, ast.Attribute):
            return self.attribute(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise self.fail(node, f"{type(node).__name__} is not allowed in the text form (only UOp(...) of literals)")

    def attribute(self, node: ast.Attribute) -> Any:
        if not isinstance(node.value, ast.Name) or node.attr.startswith("_"):
            raise self.fail(node, "only Ops.NAME, dtypes.NAME and RegisteredEnum.NAME are allowed")
        base, attr = node.value.id, node.attr
        if base == "Ops":
            if attr in Ops.__members__:
                return Ops[attr]
            raise self.fail(node, f"Ops has no member {attr!r}")
        if base == "dtypes":
            dt = getattr(dtypes, attr, None)
            if isinstance(dt, DType):
                return dt
            raise self.fail(node, f"dtypes has no dtype {attr!r}")
        cls = _ARG_TYPES.get(base)
        if cls is not None and issubclass(cls, enum.Enum):
            if attr in cls.__members__:
                return cls[attr]
            raise self.fail(node, f"{base} has no member {attr!r}")
        raise self.fail(node, f"{base}.{attr} is not a known name")

    def call(self, node: ast.Call) -> Any:
        func = node.func
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise self.fail(node, "*args and **kwargs are not allowed")
        if isinstance(func, ast.Attribute) and func.attr == "ptr":  # dtype.ptr()
            if node.args or node.keywords:
                raise self.fail(node, "ptr() takes no arguments")
            base = self.expr(func.value)
            if not isinstance(base, DType):
                raise self.fail(node, "ptr() applies to a dtype")
            return base.ptr()
        if not isinstance(func, ast.Name):
            raise self.fail(node, "only calls of known constructors are allowed")
        if func.id == "float":
            arg = node.args[0] if len(node.args) == 1 and not node.keywords else None
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                    and arg.value.strip().lower() in _FLOAT_WORDS):
                raise self.fail(node, "float(...) takes one of 'nan', 'inf', '-inf'")
            return float(arg.value)
        if func.id == "frozenset":
            if node.keywords or len(node.args) > 1:
                raise self.fail(node, "frozenset takes one set literal")
            if not node.args:
                return frozenset()
            if not isinstance(node.args[0], ast.Set):
                raise self.fail(node, "frozenset takes a set literal {...}")
            return frozenset(self.expr(e) for e in node.args[0].elts)
        ctor = self.names.get(func.id)
        if ctor is None or func.id == "Ops" or func.id == "dtypes" or (isinstance(ctor, type)
                                                                      and issubclass(ctor, enum.Enum)):
            raise self.fail(node, f"{func.id!r} is not a constructor of the text form")
        args = [self.expr(a) for a in node.args]
        kwargs = {k.arg: self.expr(k.value) for k in node.keywords if k.arg is not None}
        try:
            return ctor(*args, **kwargs)
        except (TypeError, ValueError) as e:
            raise self.fail(node, f"{func.id}(...): {e}") from None


def parse(text: str, *, verify: bool = True) -> UOp:
    """The graph whose text form is ``text`` (the node of the last assignment); ``parse(render(g)) is g``.

    Only assignments ``name = UOp(...)`` are allowed, whose args are literals, tuples, ``Ops.X``, dtypes and
    registered constructors; sources name nodes of earlier lines, each name assigned once. Each node must keep
    ``mtlir.ir.spec``'s rules (an ALU node's sources and dtypes, a CONST's value, a DEFINE_VAR's bounds) unless
    ``verify`` is False (to read back the text of any graph, e.g. one a verifier refused). Raises
    ``ParseError`` naming the line for anything else (a syntax error, an unknown name, a call of something that is
    not a constructor, a name assigned twice, a node that breaks those rules).

    Read line by line, building each node as its line is read (no syntax tree of the whole text is kept): a line
    of ``render``'s plain shape (``x3 = UOp(Ops.ADD, dtypes.int32, (x1, x2))``, an int, simple str, bool or None
    arg) is read by one regular expression; any other line through ``ast``, alone; from the first line that is not
    a statement alone (one spanning lines) the rest of the text is parsed at once."""
    if not isinstance(text, str):
        raise TypeError(f"parse: expected a str, got {type(text).__name__}")
    ev = _Evaluator()
    last: UOp | None = None
    env, fast = ev.env, _fast_line
    pos, lineno, n = 0, 0, len(text)
    try:
        with warnings.catch_warnings():  # an invalid escape in a string is the text's problem, not a warning
            warnings.simplefilter("ignore")
            while pos < n:
                end = text.find("\n", pos)
                end = n if end < 0 else end
                line, lineno, after = text[pos:end], lineno + 1, end + 1
                got = fast(ev, line, verify)
                if got is not None:
                    env[got[0]] = last = got[1]
                    pos = after
                    continue
                stmts = _statements(line, lineno, alone=True)
                if stmts is None:  # a statement that goes on past this line: the rest at once
                    stmts, after = _statements(text[pos:], lineno, alone=False) or [], n
                ev.offset = lineno - 1
                for stmt in stmts:
                    last = _assign(ev, stmt, verify, text)
                pos = after
    except RecursionError:
        raise ParseError("the text nests too deeply") from None
    if last is None:
        raise ParseError("the text holds no assignment: nothing to parse")
    return last


# render's plain line: a name, an op, a named dtype, sources by name, no arg or a simple literal one, no tag
_PLAIN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*) = UOp\(Ops\.([A-Z][A-Z0-9_]*), dtypes\.([A-Za-z][A-Za-z0-9_]*), "
                    r"\(((?:[A-Za-z_][A-Za-z0-9_]*, )+[A-Za-z_][A-Za-z0-9_]*,?|[A-Za-z_][A-Za-z0-9_]*,)?\)"
                    r"(?:, (-?(?:0|[1-9][0-9]*)|'[^'\\\r\n\x00]*'|None|True|False))?\)\r?")
_LITERALS = {"None": None, "True": True, "False": False}


def _fast_line(ev: _Evaluator, line: str, verify: bool) -> tuple[str, UOp] | None:
    """(name, node) of a line of render's plain shape (``_PLAIN``) that builds a well-formed node; None for any
    other line, or one with anything to refuse (``ast`` then reads it again and says what, with the column)."""
    m = _PLAIN.fullmatch(line)
    if m is None:
        return None
    target, op, dt, srcs, arg = m.groups()
    op_ = Ops.__members__.get(op)
    dtype = getattr(dtypes, dt, None)
    env = ev.env
    if (op_ is None or not isinstance(dtype, DType) or target in env or target in ev.names
            or target in ("float", "frozenset") or keyword.iskeyword(target)):
        return None
    names = srcs.rstrip(",").split(", ") if srcs else []  # "(x1,)": one source; "(x1)" is no tuple: not plain
    if not all(s in env for s in names):
        return None
    value: Any = None
    if arg is not None:
        value = arg[1:-1] if arg[0] == "'" else _LITERALS[arg] if arg in _LITERALS else int(arg)
    try:
        node = UOp(op_, dtype, tuple(env[s] for s in names), value)
    except (TypeError, ValueError):
        return None
    if verify and value_problem(node) is not None:
        return None
    return target, node


def _statements(text: str, lineno: int, *, alone: bool) -> list[ast.stmt] | None:
    """The statements of ``text``, which starts at line ``lineno``. ``alone`` (one line): None when the line is not
    a statement by itself (the caller then parses the rest at once); else raises ``ParseError`` naming the line."""
    try:
        return ast.parse(text, mode="exec").body
    except SyntaxError as e:
        if alone:
            return None
        raise ParseError(f"line {(e.lineno or 1) + lineno - 1}: not valid Python: {e.msg}") from None
    except (MemoryError, RecursionError, ValueError) as e:  # the parser's stack overflowed (a long run of signs), ...
        if alone:
            return None
        raise ParseError(f"not valid Python: {e or type(e).__name__}") from None


def _assign(ev: _Evaluator, stmt: ast.stmt, verify: bool, text: str) -> UOp:
    """Evaluate one statement ``name = UOp(...)`` into ``ev.env``; the node. Raises ``ParseError`` naming the line
    (``ev.offset`` added) for anything else."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        raise ev.fail(stmt, f"only assignments 'name = UOp(...)' are allowed, not {type(stmt).__name__}")
    target = stmt.targets[0].id
    if target in ev.names or target in ("float", "frozenset"):
        raise ev.fail(stmt, f"{target!r} is a constructor name and cannot be assigned")
    if target in ev.env:
        first = re.search(rf"^[ \t]*{re.escape(target)}[ \t]*=", text, re.M)
        on = f"line {text.count(chr(10), 0, first.start()) + 1}" if first else "an earlier line"
        raise ev.fail(stmt, f"{target!r} is assigned twice (first on {on}): each name is one node")
    value = stmt.value
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "UOp"):
        raise ev.fail(stmt, f"the value assigned to {target!r} must be UOp(...)")
    node: UOp = ev.expr(value)
    problem = value_problem(node) if verify else None  # mtlir/ir/spec.py: what UOp(...) does not check
    if problem is not None:
        raise ev.fail(stmt, f"{target}: {problem}")
    ev.env[target] = node
    return node


# ---- listing

def short_arg(v: Any, width: int = 48) -> str:
    """A short one-line text of an arg for listings and pictures, at most ``width`` characters: a string is cut
    with ``…`` (its closing quote kept), fields inside tuples and dataclasses get half the width each, and a
    dataclass shows its fields by name (those its ``repr`` shows)."""
    text = _short(v, width, width)
    return text if len(text) <= width else text[:max(width - 1, 1)] + "…"


def _short(v: Any, width: int, limit: int) -> str:
    inner = max(width // 2, 12)
    if type(v) in (str, bytes):
        text = repr(v)
        return text if len(text) <= limit else text[:limit - 2] + "…" + text[-1]
    if type(v) is tuple:
        return "(" + ", ".join(_short(x, width, inner) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, tuple) and hasattr(type(v), "_fields"):
        fields = ((f, getattr(v, f)) for f in getattr(type(v), "_fields"))  # by name (IcbCommand stores others)
        return f"{type(v).__name__}({', '.join(f'{f}={_short(x, width, inner)}' for f, x in fields)})"
    if isinstance(v, tuple):  # a tuple subclass holding a payload: its own (short) repr
        return repr(v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        shown = [f"{f.name}={_short(getattr(v, f.name), width, inner)}" for f in dataclasses.fields(v) if f.repr]
        return f"{type(v).__name__}({', '.join(shown)})"
    try:
        return arg_text(v)
    except TypeError:
        return repr(v)


def listing(graph: UOp, width: int = 80, names: Callable[[UOp], str | None] | None = None) -> str:
    """A compact listing, one node per line in toposort order: ``%12 = ADD int32 %3, %7`` then the arg (cut to
    ``width`` characters) and the tag. ``names`` may give a node a readable name shown as a comment."""
    ids: dict[UOp, int] = {}
    lines = []
    for i, u in enumerate(graph.toposort()):
        ids[u] = i
        text = f"%{i} = {u.op.name} {u.dtype.name}"
        if u.src:
            text += " " + ", ".join(f"%{ids[s]}" for s in u.src)
        if u.arg is not None:
            text += f"  {short_arg(u.arg, width)}"
        if u.tag is not None:
            text += f"  tag={short_arg(u.tag, width)}"
        if names is not None and (n := names(u)):
            text += f"  # {n}"
        lines.append(text)
    return "\n".join(lines) + "\n"
