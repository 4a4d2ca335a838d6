"""``python -m mtlir``: the command line ``mtlir`` (``mtlir.cli.main.main``), the same as the console script."""
from __future__ import annotations

import sys

from mtlir.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
