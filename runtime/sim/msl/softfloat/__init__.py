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
``SOFTFLOAT_PRELUDE`` (``rounding``).

The pieces, one idea each: ``types`` (``Ty``, the C types and MSL's usual arithmetic conversions), ``rounding`` (the
OpenCL C rounding prelude ``SOFTFLOAT_PRELUDE``, and the same rounding in Python for constants), ``edits`` (token
insertions and replacements), ``expressions`` (typing an expression, rounding its half and bfloat operations) and
``lowering`` (``lower_soft_floats``: the pass over top-level items and statements).
"""
