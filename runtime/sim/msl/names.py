"""The names the MSL -> OpenCL C translator knows: types, thread-position attributes, builtins, refused constructs.

Sources: Apple's *Metal Shading Language Specification* (version 3.x: §2 data types, §4 address spaces, §5.2
function attributes, §6 standard library) and the Khronos *OpenCL C 1.2 Specification* (§6.1 types, §6.12 builtin
functions). Each table says which MSL names carry over to OpenCL C unchanged, which are renamed, which need a
helper from ``prelude`` and which are refused (``REFUSED``), so nothing MSL-specific passes through by accident.
"""
from __future__ import annotations

from mtlir.runtime.sim.msl.lex import ID, Token

__all__ = ["canonical_type_spellings", "SOFT_FLOATS", "MATRIX_TYPES", "is_soft", "storage_type", "SCALARS", "VECTORS",
           "VECTOR_ELEMENTS", "dtype_name", "scalar_size", "POSITIONS", "SAME_BUILTINS",
           "RENAMED_BUILTINS", "HELPER_BUILTINS", "KEYWORDS", "TEMPLATES", "POSITIONS_LINEAR", "refused_construct",
           "is_type_name", "OPENCL_ONLY_KEYWORDS", "cl_name"]

# MSL scalar type -> OpenCL C scalar type (MSL spec §2.1; OpenCL C §6.1.1). half and bfloat are computed in
# software (``softfloat``): in memory they are their 16 bits, a ushort (``storage_type``).
SCALARS: dict[str, str] = {
    "bool": "bool", "char": "char", "uchar": "uchar", "short": "short", "ushort": "ushort", "int": "int",
    "uint": "uint", "long": "long", "ulong": "ulong", "half": "ushort", "bfloat": "ushort", "float": "float",
    "size_t": "size_t",
    "ptrdiff_t": "ptrdiff_t", "void": "void",
    "int8_t": "char", "uint8_t": "uchar", "int16_t": "short", "uint16_t": "ushort", "int32_t": "int",
    "uint32_t": "uint", "int64_t": "long", "uint64_t": "ulong",
    "unsigned": "unsigned", "signed": "signed",
}
# Element types that have vector forms in both languages (bool vectors exist only in MSL: refused).
VECTOR_ELEMENTS = ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half", "float")
# MSL's 16-bit floating types (MSL spec §2.1; bfloat since Metal 3.1), which OpenCL C lacks (half needs
# cl_khr_fp16, bfloat has no type): the translator computes them in float, rounded after every operation
# (``softfloat``), and keeps their 16 bits in memory.
SOFT_FLOATS = ("half", "bfloat")
# SIMD-group matrix types -> their element type (MSL spec, SIMD-group matrix data types: simdgroup_matrix<T, 8, 8>,
# bfloat since Metal 3.1); the simulator emulates them (``simd``).
MATRIX_TYPES = {"simdgroup_float8x8": "float", "simdgroup_half8x8": "half", "simdgroup_bfloat8x8": "bfloat"}
# "float4" -> ("float", 4): MSL vectors of 2, 3, 4 elements; a 3-vector has the size of a 4-vector in both.
VECTORS: dict[str, tuple[str, int]] = {f"{e}{n}": (e, n) for e in VECTOR_ELEMENTS + ("bfloat",) for n in (2, 3, 4)}

_DTYPES = {"bool": "bool", "char": "int8", "uchar": "uint8", "short": "int16", "ushort": "uint16", "int": "int32",
           "uint": "uint32", "long": "int64", "ulong": "uint64", "half": "float16", "bfloat": "bfloat16",
           "float": "float32", "size_t": "uint64", "ptrdiff_t": "int64"}
_SIZES = {"bool": 1, "char": 1, "uchar": 1, "short": 2, "ushort": 2, "int": 4, "uint": 4, "long": 8, "ulong": 8,
          "half": 2, "bfloat": 2, "float": 4, "size_t": 8, "ptrdiff_t": 8}


# The words of C's multi-word integer type names (MSL spec §2.1 allows C's spellings: ``unsigned char``,
# ``signed char``, ``unsigned short``, ``unsigned int``, ``unsigned long``, ``unsigned`` alone, ``short int``, ...).
_INTEGER_WORDS = frozenset({"signed", "unsigned", "char", "short", "int", "long"})
_UNSIGNED_NAMES = {"char": "uchar", "short": "ushort", "int": "uint", "long": "ulong"}


def canonical_type_spellings(tokens: list[Token]) -> list[Token]:
    """The tokens with every multi-word integer type name made one token of its one-word MSL name: ``unsigned
    char`` -> ``uchar``, ``signed char`` -> ``char``, ``unsigned short`` -> ``ushort``, ``unsigned int`` and a lone
    ``unsigned`` -> ``uint``, ``unsigned long`` -> ``ulong``, ``signed``/``signed int`` -> ``int``, ``short int`` ->
    ``short``, ``long int`` -> ``long`` (the same types, MSL spec §2.1), so parameters, casts, ``as_type<...>`` and
    ``static_cast<...>`` see one type name. The new token keeps the first word's place and whitespace. A list
    without such a spelling comes back as it is (the same object); ``long long`` (not an MSL type) is left alone."""
    out: list[Token] | None = None
    i, n = 0, len(tokens)
    while i < n:
        j = i
        while j < n and tokens[j].kind == ID and tokens[j].text in _INTEGER_WORDS:
            j += 1
        words = [t.text for t in tokens[i:j]]
        name = _one_word(words) if j > i else None
        if name is None or (len(words) == 1 and name == words[0]):
            if out is not None:
                out.extend(tokens[i:max(j, i + 1)])
            i = max(j, i + 1)
            continue
        if out is None:
            out = list(tokens[:i])
        first = tokens[i]
        out.append(Token(ID, name, first.line, first.col, first.space))
        i = j
    return _vector_templates(tokens if out is None else out)


def _vector_templates(tokens: list[Token]) -> list[Token]:
    """``vec<T, N>`` (MSL spec §2.2: the template form of the vector types) as the one token ``TN`` for an element
    type with vector forms in both languages (``VECTOR_ELEMENTS``, after the multi-word names were merged: ``vec<
    unsigned char, 4>`` -> ``uchar4``) and N in 2, 3, 4; a ``>>`` that closes it and an enclosing template keeps its
    second ``>``. Any other ``vec<...>`` is left, for the translator to refuse. The same list when none is found."""
    out: list[Token] | None = None
    i, n = 0, len(tokens)
    while i < n:
        t = tokens[i]
        if not (t.kind == ID and t.text == "vec" and i + 5 < n and tokens[i + 1].text == "<"
                and tokens[i + 2].kind == ID and tokens[i + 2].text in VECTOR_ELEMENTS and tokens[i + 3].text == ","
                and tokens[i + 4].text in ("2", "3", "4") and tokens[i + 5].text in (">", ">>")):
            if out is not None:
                out.append(t)
            i += 1
            continue
        if out is None:
            out = list(tokens[:i])
        out.append(Token(ID, tokens[i + 2].text + tokens[i + 4].text, t.line, t.col, t.space))
        close = tokens[i + 5]
        if close.text == ">>":
            out.append(Token(close.kind, ">", close.line, close.col + 1, ""))
        i += 6
    return tokens if out is None else out


def _one_word(words: list[str]) -> str | None:
    """The one-word name of a run of integer type words, or None when the run is not one type name."""
    sign = [w for w in words if w in ("signed", "unsigned")]
    base = [w for w in words if w not in ("signed", "unsigned")]
    if len(sign) > 1 or len(base) > 2 or (len(base) == 2 and (base[1] != "int" or base[0] not in ("short", "long"))):
        return None
    word = base[0] if base else "int"
    return _UNSIGNED_NAMES[word] if sign == ["unsigned"] else word


def is_soft(msl_type: str) -> bool:
    """True for ``half``, ``bfloat`` and their vectors (``SOFT_FLOATS``): types the translator computes in
    software."""
    return (VECTORS[msl_type][0] if msl_type in VECTORS else msl_type) in SOFT_FLOATS


def storage_type(msl_type: str) -> str:
    """The OpenCL C type holding an MSL type in memory: ``half``/``bfloat`` -> ``ushort`` (their 16 bits),
    ``half4`` -> ``ushort4``; other scalars as ``SCALARS`` maps them; vectors and structs as they are."""
    if msl_type in VECTORS:
        elem, n = VECTORS[msl_type]
        return f"ushort{n}" if elem in SOFT_FLOATS else msl_type
    return SCALARS.get(msl_type, msl_type)


def is_type_name(name: str) -> bool:
    """True for an MSL scalar or vector type name (``float``, ``uint8_t``, ``half4``)."""
    return name in SCALARS or name in VECTORS


def dtype_name(msl_type: str) -> str:
    """The mtlir dtype name of an MSL type: ``float`` -> ``float32``, ``uint8_t`` -> ``uint8``, a vector
    ``float4`` -> ``float32x4``; any other name (a struct) is returned as it is."""
    if msl_type in VECTORS:
        elem, n = VECTORS[msl_type]
        return f"{_DTYPES[elem]}x{n}"
    return _DTYPES.get(msl_type) or _DTYPES.get(SCALARS.get(msl_type, msl_type), msl_type)


def scalar_size(msl_type: str) -> int:
    """Bytes of one scalar of the MSL type (for a vector: of its element; 1 for a struct or unknown name), the
    alignment Metal requires of a buffer offset for that type (METAL.md §1)."""
    elem = VECTORS[msl_type][0] if msl_type in VECTORS else SCALARS.get(msl_type, msl_type)
    return _SIZES.get(elem, 1)


# Thread-position attributes of kernel parameters (MSL spec §5.2.3.6) -> the OpenCL work-item function giving
# axis ``d`` of that position (OpenCL C §6.12.1). Metal's threadgroup is OpenCL's work-group.
POSITIONS: dict[str, str] = {
    "thread_position_in_grid": "get_global_id({d})",
    "threadgroup_position_in_grid": "get_group_id({d})",
    "thread_position_in_threadgroup": "get_local_id({d})",
    "threads_per_threadgroup": "get_local_size({d})",
    "threadgroups_per_grid": "get_num_groups({d})",
    "threads_per_grid": "get_global_size({d})",
}
# Flattened index of the thread in its threadgroup (MSL spec §5.2.3.6): x + y * width + z * width * height.
POSITIONS_LINEAR = {
    "thread_index_in_threadgroup":
        "(get_local_id(2) * get_local_size(1) + get_local_id(1)) * get_local_size(0) + get_local_id(0)",
}

# MSL functions with the same name, arguments and meaning in OpenCL C (MSL spec §6.3-6.5; OpenCL C §6.12.2-5).
# abs, fract, saturate differ (HELPER_BUILTINS); frexp, modf, sincos take references in MSL (refused as unknown).
SAME_BUILTINS = frozenset("""
acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh cospi exp exp2 exp10 fabs fdim floor fma fmax
fmin fmod hypot ilogb ldexp log log2 log10 logb nextafter pow powr rint round rsqrt sin sinh sinpi sqrt
tan tanh tanpi trunc isnan isinf isfinite isnormal isordered isunordered signbit
min max clamp mix step smoothstep sign degrees radians dot cross length distance normalize
clz popcount any all select
""".split())
# MSL name -> OpenCL C name, same arguments and meaning.
RENAMED_BUILTINS: dict[str, str] = {"mulhi": "mul_hi", "absdiff": "abs_diff"}
# MSL functions whose OpenCL namesake means something else: abs of a float (OpenCL's abs is integer only and
# returns an unsigned type), fract(x) (OpenCL's takes a second pointer argument), saturate (none in OpenCL).
# The prelude defines a ``__mtl_<name>`` overload set for each.
HELPER_BUILTINS = frozenset({"abs", "fract", "saturate"})

# OpenCL C built-in functions (OpenCL C §6.12-6.15) a kernel may not be named after: OpenCL's built-ins are overloaded,
# so `__kernel void step(...)` builds but its kernel cannot be created (clCreateKernel: INVALID_KERNEL_NAME), where
# MSL allows a kernel named `step` (metal::step is in another namespace). Such a kernel is named
# ``__mtl_kernel_<name>`` in OpenCL (``opencl_kernel_name``).
_OPENCL_FUNCTIONS = SAME_BUILTINS | frozenset(RENAMED_BUILTINS.values()) | HELPER_BUILTINS | frozenset("""
barrier mem_fence read_mem_fence write_mem_fence work_group_barrier get_global_id get_local_id get_group_id
get_global_size get_local_size get_num_groups get_work_dim get_global_offset get_enqueued_local_size
get_global_linear_id get_local_linear_id mad mad24 mul24 mad_hi mad_sat hadd rhadd rotate upsample add_sat sub_sat
bitselect shuffle shuffle2 printf async_work_group_copy async_work_group_strided_copy wait_group_events prefetch
acospi asinpi atanpi atan2pi erf erfc expm1 frexp lgamma lgamma_r log1p maxmag minmag modf nan remainder remquo
rootn sincos tgamma fast_distance fast_length fast_normalize ctz nextafter
""".split())
_OPENCL_PREFIXES = ("native_", "half_", "vload", "vstore", "convert_", "as_", "atomic_", "atom_", "sub_group_",
                    "work_group_", "read_image", "write_image", "get_image_")


def opencl_kernel_name(name: str) -> str:
    """The OpenCL C name of the MSL kernel ``name``: itself, or ``__mtl_kernel_<name>`` where OpenCL has a
    built-in function or keyword of that name (a kernel named ``step``, ``max`` or ``local`` is valid MSL)."""
    if name in _OPENCL_FUNCTIONS or name in OPENCL_ONLY_KEYWORDS or name.startswith(_OPENCL_PREFIXES):
        return f"__mtl_kernel_{name}"
    return name


# OpenCL C keywords (OpenCL C §6.1, §6.5, §6.6, §6.7) that are ordinary identifiers in MSL: renamed
# ``__mtl_<name>`` where MSL uses them as names (a variable called ``local`` is common).
OPENCL_ONLY_KEYWORDS = frozenset({"global", "local", "private", "read_only", "write_only", "read_write", "uniform",
                                  "pipe", "image1d_t", "image2d_t", "image3d_t", "sampler_t", "event_t",
                                  "cl_mem_fence_flags"})


def cl_name(name: str) -> str:
    """The OpenCL C spelling of an MSL identifier: itself, or ``__mtl_<name>`` for an OpenCL-only keyword."""
    return f"__mtl_{name}" if name in OPENCL_ONLY_KEYWORDS else name


KEYWORDS = frozenset("""
if else for while do switch case default break continue return goto sizeof typedef struct union enum
static inline const volatile extern register restrict
""".split())

# Refused identifiers (the whole identifier, or any identifier starting with a prefix ending in "_"), with why.
_REFUSED: dict[str, str] = {
    # the SIMD-group and quad-group functions, matrices and positions the simulator has (``simd.SUPPORTED``) pass
    "simdgroup_": "this SIMD-group function or matrix is not one the simulated device emulates (docs/kernels.md)",
    "simd_": "this SIMD-group function is not one the simulated device emulates (docs/kernels.md)",
    "quad_": "this quad-group function is not one the simulated device emulates (docs/kernels.md)",
    "atomic_": "atomics are not supported by the simulated device yet",
    "memory_order_": "atomics are not supported by the simulated device yet",
    "sampler": "samplers are not supported by the simulated device",
    "imageblock": "imageblocks are not supported by the simulated device",
    "threadgroup_imageblock": "the threadgroup_imageblock address space is not supported",
    "ray_data": "the ray_data address space is not supported",
    "object_data": "the object_data address space is not supported",
    "visible_function_table": "function tables are not supported",
    "intersection_function_table": "function tables are not supported",
    "packed_": "packed vector types (no padding) have no OpenCL C equivalent",
    "template": "C++ templates are not supported",
    "typename": "C++ templates are not supported",
    "class": "C++ classes are not supported",
    "namespace": "C++ namespaces other than `using namespace metal;` are not supported",
    "operator": "C++ operator overloading is not supported",
    "auto": "C++ type deduction is not supported",
    "reinterpret_cast": "C++ casts other than static_cast are not supported (use as_type)",
    "const_cast": "C++ casts other than static_cast are not supported",
    "dynamic_cast": "C++ casts other than static_cast are not supported",
    "new": "C++ allocation is not supported",
    "delete": "C++ allocation is not supported",
    "this": "C++ member functions are not supported",
    "virtual": "C++ classes are not supported",
    "nullptr": "C++ nullptr is not supported",
    "vertex": "vertex functions are not supported (only kernel functions run on the simulated device)",
    "fragment": "fragment functions are not supported (only kernel functions run on the simulated device)",
}
_TEXTURES = ("texture1d", "texture2d", "texture3d", "texturecube", "texture_buffer", "depth2d", "depthcube")
# Templates MSL has and OpenCL C lacks: refused where the name is followed by ``<``.
TEMPLATES = frozenset({"vec", "matrix", "array", "array_ref", "numeric_limits", "atomic", "packed_vec"})


def refused_construct(name: str) -> str | None:
    """Why the identifier ``name`` is refused (``None`` when it is not): SIMD-group and quad-group names the
    simulator does not emulate (the translator lets ``simd.SUPPORTED`` through before asking), atomics, textures,
    samplers, address spaces and types OpenCL C lacks, C++ features. Matrix types such as ``float4x4`` and
    ``half8x8`` are refused too."""
    if (why := _REFUSED.get(name)) is not None:
        return why
    if "_" in name and (why := _REFUSED.get(name[:name.index("_") + 1])) is not None:
        return why
    if name.startswith(_TEXTURES):
        return "textures are not supported by the simulated device"
    if name in ("bool2", "bool3", "bool4"):
        return "boolean vectors have no OpenCL C type"
    elem, _, shape = name.rpartition("x")
    if elem[-1:].isdigit() and shape.isdigit() and elem.rstrip("0123456789") in ("float", "half"):
        return "matrix types have no OpenCL C equivalent"
    return None
