"""What the core reads of Metal Shading Language: the signature of a kernel function, and the check of a Kernel's
declared parameters against it.

``kernel_signature(msl, function)`` finds ``kernel void function(...)`` (or ``[[kernel]] void function(...)``) in
the source, comments, string literals and preprocessor lines skipped, and returns the parameters Metal binds
through the buffer argument table, in declaration order, as ``MslParam`` records:

- ``device T* p`` / ``constant T* p`` (any of ``const``, ``volatile``, ``restrict`` around them): a buffer;
- ``constant T& p`` (or ``device T& p``): a value read from the buffer bound at its index (mtlir's variables);
- the index is that of ``[[buffer(n)]]`` (attributes may come in any order and several to a ``[[...]]``), else
  the parameter's position among those parameters (how tinygrad's kernels are bound, METAL.md §1). A kernel that
  gives ``[[buffer(n)]]`` to some of them only is refused: Metal then assigns the others the first free indices,
  which the simulated device does not model.

Parameters with another attribute (thread positions, ``[[threadgroup(n)]]``, ``[[texture(n)]]``), textures,
samplers and ``threadgroup`` pointers use other argument tables and are left out. Element types are read as MSL
spells them (MSL spec §2.1-2.2): ``float``, ``half``, ``int``, ``uchar``, ``unsigned char``, ``int8_t``,
``size_t``, vectors (``float4``, ``packed_half2``: their element) and ``atomic_int`` & co; ``double`` and types
mtlir has no dtype for (``bfloat``, structs) are refused.

``check_kernel_params(key, function, msl, params)`` is what ``mtlir.metal.Kernel`` runs when it is built: every
``KernelParam`` must name a parameter of the MSL at its index, of the same kind (a ``var`` for a ``constant T&``,
a buffer for a pointer) and element type, the buffer parameters and the variables each listed in the MSL's order,
and no parameter of the MSL may be left without a ``KernelParam``. This module imports only the IR's dtypes and
the errors, so the front end and link can both use it (docs/lowering.md, "Kernel signatures").
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtlir.errors import ArgumentError, InputError
from mtlir.ir.dtypes import DType, dtypes

if TYPE_CHECKING:
    from mtlir.metal import KernelParam

__all__ = ["MslParam", "KernelSignatureError", "kernel_signature", "msl_dtype", "check_kernel_params"]


class KernelSignatureError(InputError, ValueError):
    """A kernel's MSL signature that cannot be read, or declared parameters that disagree with it. ``param``: the
    position of the ``KernelParam`` at fault in the Kernel's ``params`` (None when the fault is the MSL's)."""

    def __init__(self, message: str, param: int | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class MslParam:
    """One kernel parameter bound through the buffer argument table, as the MSL declares it: ``name``, Metal buffer
    ``index``, address ``space`` (``device`` or ``constant``), ``reference`` (True: ``T&``, a value; False: ``T*``,
    a buffer), ``type`` (the element type as written, ``unsigned char``, ``float4``), ``dtype`` (the element dtype:
    ``float4`` -> ``dtypes.float32``), ``width`` (a vector's element count, 1 for a scalar) and ``text`` (the
    declaration, for messages)."""

    name: str
    index: int
    space: str
    reference: bool
    type: str
    dtype: DType
    width: int
    text: str

    @property
    def kind(self) -> str:
        """``"buffer"`` for a pointer, ``"variable"`` for a reference (mtlir's words for the two)."""
        return "variable" if self.reference else "buffer"


# MSL scalar types (MSL spec §2.1) -> mtlir dtypes; the <stdint.h> spellings and size_t / ptrdiff_t (64-bit in MSL)
_SCALARS: dict[str, DType] = {
    "bool": dtypes.bool, "char": dtypes.int8, "uchar": dtypes.uint8, "short": dtypes.int16,
    "ushort": dtypes.uint16, "int": dtypes.int32, "uint": dtypes.uint32, "long": dtypes.int64,
    "ulong": dtypes.uint64, "half": dtypes.float16, "bfloat": dtypes.bfloat16, "float": dtypes.float32,
    "int8_t": dtypes.int8, "uint8_t": dtypes.uint8, "int16_t": dtypes.int16, "uint16_t": dtypes.uint16,
    "int32_t": dtypes.int32, "uint32_t": dtypes.uint32, "int64_t": dtypes.int64, "uint64_t": dtypes.uint64,
    "size_t": dtypes.uint64, "ptrdiff_t": dtypes.int64,
}
# C's two-word spellings (MSL keeps C++'s): "unsigned char" is uchar, a bare "unsigned" is uint
_UNSIGNED = {"char": "uchar", "short": "ushort", "int": "uint", "long": "ulong"}
_VECTOR = re.compile(r"(?:packed_)?(bool|char|uchar|short|ushort|int|uint|long|ulong|half|bfloat|float)([234])")
_ATOMIC = re.compile(r"atomic_(bool|int|uint|ulong|float)")
_SPACES = ("device", "constant", "threadgroup", "thread", "threadgroup_imageblock", "ray_data", "object_data")
_QUALIFIERS = frozenset({"const", "volatile", "restrict", "__restrict", "__restrict__", "struct", *_SPACES})

_TOKEN = re.compile(r"""
    (?P<pp>^[ \t]*\#(?:\\\n|[^\n])*)                # a preprocessor line, with its continuations
  | (?P<space>[ \t\r\f\v]+|\n)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<str>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<id>[A-Za-z_]\w*)
  | (?P<num>\.?\d(?:[\w.]|[eEpP][+-])*)
  | (?P<punct>.)
""", re.X | re.M | re.S)


def _tokens(msl: str) -> list[str]:
    """The tokens of ``msl`` that matter to a signature: identifiers, numbers and punctuation (comments, string
    literals and preprocessor lines left out)."""
    return [m.group() for m in _TOKEN.finditer(msl) if m.lastgroup in ("id", "num", "punct")]


def msl_dtype(type_name: str) -> tuple[DType, int]:
    """The element dtype and vector width of an MSL type name: ``float`` -> (float32, 1), ``unsigned char`` ->
    (uint8, 1), ``half4`` -> (float16, 4), ``packed_float3`` -> (float32, 3), ``atomic_int`` -> (int32, 1).

    Raises ``ValueError`` for ``double`` (Metal has no 64-bit float, MSL spec §2.1) and for a type mtlir has no
    dtype for (a struct, a texture)."""
    words = type_name.split()
    if words[:1] == ["signed"]:
        words = words[1:] or ["int"]
    elif words[:1] == ["unsigned"]:
        words = [_UNSIGNED.get(words[1], words[1]) if len(words) > 1 else "uint", *words[2:]]
    name = " ".join(words)
    if name in _SCALARS:
        return _SCALARS[name], 1
    if (m := _VECTOR.fullmatch(name)) is not None:
        return _SCALARS[m.group(1)], int(m.group(2))
    if (m := _ATOMIC.fullmatch(name)) is not None:
        return _SCALARS[m.group(1)], 1
    if re.fullmatch(r"double[234]?", name):
        raise ArgumentError(f"{type_name} does not exist in Metal (MSL has no 64-bit float type, MSL spec §2.1)")
    raise ArgumentError(f"{type_name or '(no type)'} has no mtlir dtype (kernel parameters take bool, integer or float "
                        "elements: float, half, bfloat, int, uchar, ... or their vectors)")


@dataclass
class _Decl:
    """One parameter of the list as read: its type tokens, name, attributes (name -> argument text) and text."""

    type_tokens: list[str]
    name: str
    attributes: dict[str, str]
    text: str


def kernel_signature(msl: str, function: str) -> tuple[MslParam, ...]:
    """The parameters of kernel ``function`` in ``msl`` that Metal binds through the buffer argument table, in
    declaration order (the module docstring lists the forms read).

    Raises ``KernelSignatureError`` when the source defines no kernel ``function``, for a ``[[buffer(n)]]`` whose
    ``n`` is not an integer literal, for two parameters at one index, for a kernel that gives ``[[buffer(n)]]`` to
    only some of its parameters, and for an element type without an mtlir dtype (``msl_dtype``)."""
    toks = _tokens(msl)
    open_ = _find_kernel(toks, function)
    if open_ is None:
        raise KernelSignatureError(f"the MSL defines no kernel function {function!r} (`kernel void {function}(...)`)")
    decls = [_decl(p, function) for p in _split(toks, open_)]
    bound = [d for d in decls if _is_bound(d)]
    explicit = [d for d in bound if "buffer" in d.attributes]
    if explicit and len(explicit) != len(bound):
        implicit = next(d for d in bound if "buffer" not in d.attributes)
        raise KernelSignatureError(f"kernel {function!r}: `{implicit.text}` has no [[buffer(n)]] while "
                                   f"`{explicit[0].text}` has one: give every buffer parameter its index, or none "
                                   "(then they are bound in order)")
    out: list[MslParam] = []
    seen: dict[int, str] = {}
    for position, d in enumerate(bound):
        index = _index(d, function) if explicit else position
        if index in seen:
            raise KernelSignatureError(f"kernel {function!r}: `{seen[index]}` and `{d.text}` both take "
                                       f"[[buffer({index})]]")
        seen[index] = d.text
        words = [t for t in d.type_tokens if t not in _QUALIFIERS and t not in ("*", "&", "metal", ":")]
        type_name = " ".join(words)
        try:
            dt, width = msl_dtype(type_name)
        except ValueError as e:
            raise KernelSignatureError(f"kernel {function!r}: `{d.text}`: {e}") from None
        space = next((t for t in d.type_tokens if t in _SPACES), "")
        out.append(MslParam(d.name, index, space, "&" in d.type_tokens, type_name, dt, width, d.text))
    return tuple(out)


def _find_kernel(toks: list[str], function: str) -> int | None:
    """The position of the ``(`` that opens the parameters of ``kernel void function`` (None: not found)."""
    for i in range(2, len(toks) - 1):
        if toks[i] == function and toks[i + 1] == "(" and toks[i - 1] == "void":
            if toks[i - 2] == "kernel" or (i >= 6 and toks[i - 6:i - 1] == ["[", "[", "kernel", "]", "]"]):
                return i + 1
    return None


def _split(toks: list[str], open_: int) -> list[list[str]]:
    """The token lists of the parameters whose list opens at ``open_``, split at the commas outside brackets
    (``()``, ``[]``, and a template's ``<>``)."""
    params: list[list[str]] = []
    cur: list[str] = []
    depth = angle = 0
    for t in toks[open_ + 1:]:
        if t in ("(", "["):
            depth += 1
        elif t in (")", "]"):
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and t in ("<", ">"):
            angle += 1 if t == "<" else -1
        elif depth == 0 and angle == 0 and t == ",":
            params.append(cur)
            cur = []
            continue
        cur.append(t)
    if cur:
        params.append(cur)
    return params


def _decl(tokens: list[str], function: str) -> _Decl:
    """Split one parameter into its type tokens, name and ``[[attributes]]`` (wherever they stand in it)."""
    rest: list[str] = []
    attributes: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        if tokens[i:i + 2] == ["[", "["]:
            j, depth = i + 2, 0
            group: list[str] = []
            while j < len(tokens) and not (depth == 0 and tokens[j:j + 2] == ["]", "]"]):
                depth += {"(": 1, ")": -1}.get(tokens[j], 0)
                group.append(tokens[j])
                j += 1
            _attributes(group, attributes)
            i = j + 2
            continue
        rest.append(tokens[i])
        i += 1
    if not rest or not re.fullmatch(r"[A-Za-z_]\w*", rest[-1]):
        raise KernelSignatureError(f"kernel {function!r}: a parameter has no name: `{' '.join(tokens)}`")
    text = " ".join(tokens).replace(" *", "*").replace(" &", "&").replace("[ [ ", "[[").replace(" ] ]", "]]")
    text = re.sub(r" ?([()]) ?", r"\1", text)
    return _Decl(rest[:-1], rest[-1], attributes, text)


def _attributes(group: list[str], into: dict[str, str]) -> None:
    """The attributes of one ``[[...]]``: ``buffer(0), raster_order_group(0)`` -> {"buffer": "0", ...}."""
    depth, start = 0, 0
    for j, t in enumerate([*group, ","]):
        depth += {"(": 1, ")": -1}.get(t, 0)
        if t == "," and depth == 0:
            attr = group[start:j]
            start = j + 1
            if attr:
                arg = "".join(attr[2:-1]) if len(attr) > 1 and attr[1] == "(" else ""
                into[attr[0]] = arg


def _is_bound(d: _Decl) -> bool:
    """Whether Metal binds the parameter through the buffer argument table: a ``[[buffer(n)]]``, or no attribute
    and a ``device`` / ``constant`` pointer or reference."""
    if d.attributes:
        return "buffer" in d.attributes
    return any(t in ("device", "constant") for t in d.type_tokens) and any(t in ("*", "&") for t in d.type_tokens)


def _index(d: _Decl, function: str) -> int:
    """The ``n`` of the parameter's ``[[buffer(n)]]``: an integer literal (``3``, ``3u``, ``0x3``)."""
    arg = d.attributes["buffer"]
    try:
        return int(arg.rstrip("uU"), 0)
    except ValueError:
        raise KernelSignatureError(f"kernel {function!r}: `{d.text}`: [[buffer({arg})]] is not an integer literal "
                                   "(mtlir reads the index from the source)") from None


def check_kernel_params(key: str, function: str, msl: str, params: Sequence[KernelParam]) -> None:
    """Check a kernel's declared ``params`` against the signature of ``function`` in ``msl``: each names a
    parameter of the MSL at its index (``[[buffer(n)]]``), of its kind (a buffer ``KernelParam``, ``var`` None, for
    a pointer; a variable for a ``constant T&``) and element type (``half`` for ``device half*``; a vector's
    element for ``device float4*``); buffers and variables each in the MSL's order (``Queue.exec`` takes them in
    that order); every parameter of the MSL declared.

    Raises ``KernelSignatureError`` naming the kernel, the parameter and both types (or the MSL's problem, as
    ``kernel_signature``)."""
    where = f"Kernel {key!r}" + (f" (function {function!r})" if function != key else "")
    try:
        sig = kernel_signature(msl, function)
    except KernelSignatureError as e:
        text = str(e)   # kernel_signature's own "kernel 'f': " prefix: ``where`` names the kernel once
        raise KernelSignatureError(f"{where}: {text.removeprefix(f'kernel {function!r}: ')}") from None
    by_index = {m.index: m for m in sig}
    listing = ", ".join(f"`{m.text}`" for m in sig) or "none"

    def what(j: int, p: KernelParam) -> str:
        return f"{where}: parameter {j} ({_kind(p)}{'' if p.var is None else ' ' + repr(p.var)} at index {p.index})"

    for j, p in enumerate(params):
        m = by_index.get(p.index)
        if m is None:
            raise KernelSignatureError(f"{what(j, p)}, declared {p.element.name}: the MSL has no parameter at "
                                       f"[[buffer({p.index})]] (its buffer parameters: {listing})", j)
        if m.kind != _kind(p):
            have = "a value (a `constant T&` variable)" if m.reference else "a pointer (a buffer)"
            raise KernelSignatureError(f"{what(j, p)}, declared {p.element.name}, is a {_kind(p)}, but the MSL's "
                                       f"`{m.text}` at [[buffer({m.index})]] is {have}: declare it {_declaration(m)}",
                                       j)
        if p.element is not m.dtype:
            elem = f"{m.type}, whose element is {m.dtype.name}" if m.width > 1 else f"{m.type} ({m.dtype.name})"
            raise KernelSignatureError(f"{what(j, p)} is declared {p.element.name}, but the MSL's `{m.text}` takes "
                                       f"{elem}", j)
    declared = {p.index for p in params}
    missing = [m for m in sig if m.index not in declared]
    if missing:
        m = missing[0]
        raise KernelSignatureError(f"{where}: the MSL's `{m.text}` at [[buffer({m.index})]] has no KernelParam: "
                                   f"nothing would be bound there (declare {_declaration(m)})")
    # every parameter of each side has its match: the order of each kind is what is left to disagree
    for kind in ("buffer", "variable"):
        listed = [(j, p) for j, p in enumerate(params) if _kind(p) == kind]
        msl_order = [m.index for m in sig if m.kind == kind]
        for position, ((j, p), index) in enumerate(zip(listed, msl_order)):
            if p.index != index:
                raise KernelSignatureError(
                    f"{what(j, p)}: listed as {kind} {position}, but the MSL's {kind} {position} is "
                    f"`{by_index[index].text}`: list the {kind} parameters in the MSL's order (indices "
                    f"{', '.join(map(str, msl_order))}), each at its [[buffer(n)]], and pass the {kind}s to "
                    "Queue.exec in that order", j)


def _kind(p: KernelParam) -> str:
    """``"buffer"`` for a buffer ``KernelParam`` (``var`` None), else ``"variable"``."""
    return "buffer" if p.var is None else "variable"


def _declaration(m: MslParam) -> str:
    """The ``KernelParam`` that declares ``m``: ``KernelParam(None, 0, 'float32')``, ``KernelParam('n', 3, ...)``."""
    return f"KernelParam({'None' if m.kind == 'buffer' else repr(m.name)}, {m.index}, {m.dtype.name!r})"
