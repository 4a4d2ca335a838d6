"""``python -m benchmarks [--json] [--quick] [--only NAME[,NAME]] [--plot DIR] [--opencl-device D]``.

Runs the benchmark groups (``GROUPS``), prints a table of the figures against their targets (issue 14), or with
``--json`` one JSON object of every figure; ``--plot DIR`` also writes ``DIR/performance.svg``. A group that
cannot run here (the ctypes stand-in needs x86_64 and a C compiler) is left out and named under ``"skipped"``.
Exit status 0, or 2 for a bad option.
"""
from __future__ import annotations

import sys

from benchmarks.report import main

if __name__ == "__main__":
    sys.exit(main())
