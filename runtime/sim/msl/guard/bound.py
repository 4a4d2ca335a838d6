"""The bounds of the translator's bounds checks (``guard``): what a tracked pointer may reach (``Bound``), the
tracked pointers and arrays of the function being translated (``Guard``), and the names and sizes the translated
kernel and the runner share (the argument block and fault record parameters, the fault record's words, the scratch
area's bytes).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mtlir.runtime.sim.msl.lex import Token

__all__ = ["Bound", "Guard", "ARGS_PARAM", "FAULT_PARAM", "FAULT_WORDS", "SCRATCH_BYTES"]

ARGS_PARAM = "__mtl_args"  # the kernel's argument block: per binding its offset, bytes before its base, length
FAULT_PARAM = "__mtl_fault"  # the kernel's last OpenCL parameter: the fault record, then scratch
FAULT_WORDS = 16  # uint words of the fault record before the scratch area (64 bytes: scratch is 64-byte aligned)
SCRATCH_BYTES = 1 << 16  # where a skipped access lands: at least any access a kernel makes (a struct, a float4)

_SPACES = frozenset({"device", "constant"})
_HOW = ("supported: p[i], *(p + i), *((device T*)(p + i)), p->f, &p[i], and device/constant pointer variables "
        "initialised or assigned from one buffer pointer")


@dataclass(frozen=True)
class Bound:
    """Where a tracked pointer may reach, as OpenCL C expressions: ``start`` (ulong, the address of the first byte
    of its MTLBuffer), ``length`` (ulong, the buffer's bytes) and ``code``: the kernel parameter's position among
    its bindings, recorded in the fault buffer (a number for a kernel's own parameter, the name of a uint parameter
    in a helper)."""

    start: str
    length: str
    code: str
    space: str = "global"  # "global" (a buffer), "local" (a threadgroup array), "private" (a thread array)


@dataclass
class Guard:
    """The tracked pointers of the function being translated: MSL name -> ``Bound`` (None: a pointer variable not
    yet assigned from a buffer), the tokens of tracked names that may stand as plain pointer values because an
    enclosing rule accounted for them (``allowed``: id -> token, the token kept alive so its id stays unique), and
    a counter for the names of the generated temporaries; ``fault``: the function has the fault record parameter
    (a kernel, a helper taking buffer pointers). A kernel's fixed-size threadgroup and thread arrays are tracked
    too (``arrays``, in declaration order: their fault codes follow the bindings', from ``first_array_code``);
    ``scratch`` says which spaces' scratch areas their checks need; ``vectors``, which tracked pointers point to
    vectors (their accesses are ``vloadN``/``vstoreN``: ``scan._pointee_vector``), and ``spaces`` the memory of
    the threadgroup and thread pointers to vectors it types without tracking them (``local``, ``private``: their
    accesses are not checked, but are ``vloadN``/``vstoreN`` too). ``checked``: False in a translation without
    bounds checks, where the same rules type the vector accesses and emit no check (``vector.checked``)."""

    ptrs: dict[str, Bound | None] = field(default_factory=dict)
    allowed: dict[int, Token] = field(default_factory=dict)
    counter: int = 0
    fault: bool = True
    arrays: list[tuple[str, str, str]] = field(default_factory=list)  # (MSL name, space, element type)
    counts: dict[str, int] = field(default_factory=dict)  # array name -> its element count, when a literal
    first_array_code: int = 0  # fault codes of arrays follow the kernel's bindings
    scratch: set[str] = field(default_factory=set)  # spaces whose scratch area the kernel must declare
    vectors: dict[str, str] = field(default_factory=dict)  # pointer name -> the OpenCL vector type it points to
    spaces: dict[str, str] = field(default_factory=dict)  # untracked vector pointer name -> "local" / "private"
    checked: bool = True

    def allow(self, tokens: list[Token]) -> None:
        """Let these tracked-name tokens pass as plain pointer values."""
        for t in tokens:
            self.allowed[id(t)] = t
