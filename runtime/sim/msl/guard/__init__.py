"""Bounds checks on buffer accesses: the translated kernels never touch memory outside the MTLBuffers bound to them.

On Metal a kernel that reads or writes far past a buffer faults the GPU (the command buffer ends in status Error,
PageFault, METAL.md §2); on PoCL the same access is a load or store into the host process, which crashes it or
silently corrupts its heap. So every access through a ``device`` or ``constant`` buffer pointer is checked against
the MTLBuffer it points into. The translator knows which identifiers are buffer pointers (the kernel's buffer
parameters, a helper function's ``device T*`` parameters, and pointer variables initialised or assigned from them:
their *provenance*), and rewrites each access it finds:

- ``p[e]`` -> the access at ``p + (e)``; ``p->f`` -> the access at ``p``;
- ``*X`` where the pointer expression ``X`` involves exactly one tracked pointer at its top level (``*(p + e)``,
  ``*((device float4*)(p + e))``, ``*p++``, ``*(c ? p : q)``: one buffer) -> the access at ``X``;
- ``(X)[e]``, ``(X)->f`` for a pointer to vectors ``X`` (``((device float4*)(p + 1))[i]``, ``(c ? p : q)[i]``)
  -> the access at ``(X) + (e)``, ``(X)``.

An access becomes ``(*({ __auto_type a = (X); __MTL_CHK(a, start, length, code); }))`` (the macro is
``(__typeof__(a))__mtl_chk((__global uchar*)(a), sizeof(*(a)), start, length, __mtl_fault, code)``): a GNU
statement expression (Clang accepts it in OpenCL C) that evaluates ``X`` once and keeps its
type, so loads, stores, ``+=``, ``.x`` and ``&`` work as before. ``__mtl_chk`` (in the prelude) returns the
address when ``[a, a + sizeof(*a))`` lies inside the MTLBuffer ``[start, start + length)``; otherwise it records
the first such access in the kernel's fault buffer (which parameter, read or write, the byte offset and size) and
returns a scratch area instead, so the access is skipped (a read gets scratch bytes). The runner reads the fault
buffer after the run (``kernels.runner``) and raises ``KernelAccessError``; the simulated GPU turns that into a
PageFault (``gpu``).

What the translator cannot follow it refuses with ``UnsupportedKernelError`` naming the pointer, never running it
unchecked: a buffer pointer used in any other way (compared with anything but a pointer into its own buffer,
converted to an integer, passed to a macro, stored in a variable that is not a ``device``/``constant`` pointer), a
dereference whose pointer mixes two buffers or comes from no buffer at all (``*((device float*)(x))``), a pointer
variable used before it is assigned from a buffer, a cast of an integer to a ``device`` pointer, a function
returning one, ``device`` pointers in structs or prototypes, a top-level ``#define`` naming a buffer parameter.
Helper functions with ``device T*`` parameters get the bounds as hidden extra parameters, passed at each call.

A kernel's own fixed-size arrays (``float buf0[16];``, ``threadgroup float buf1[16];``) are tracked the same way,
bounded by their own bytes (``__MTL_CHK_L``/``__MTL_CHK_P`` with scratch areas of their address space); an
element the translator can check itself (``*(buf0+0)``) stays plain. Once an access has been skipped, every loop
without a barrier also ends (``loop_guard``), so a runaway loop does not keep the dispatch busy.

Vectors: every access to a vector through a pointer (in device, threadgroup or thread memory) is a
``vloadN``/``vstoreN`` or an access to its elements (``vector``), never a dereference of a vector pointer, which
NVIDIA's OpenCL faults on when the vector is not aligned to its size. The translation without checks
(``translate(bounds_checks=False)``) runs the same rules with a ``Guard`` whose ``checked`` is False: they type the
vector accesses and emit no check; scalar accesses stay as written and nothing is refused for the checks' sake.

The pieces, one idea each: ``bound`` (``Bound``, ``Guard``, the names and sizes the translated kernel and the runner
share), ``scan`` (reading the tokens around an access), ``access`` (the checked accesses), ``pointers``
(parenthesised vector pointers, ``&p[i]``, comparisons, and the ``Bound`` a pointer expression's names share),
``vector`` (the forms of a vector access) and ``loops`` (the loops that end after a fault). Their token rules run
from the translator's table (``msl.token_rules.TOKEN_RULES``).
"""
