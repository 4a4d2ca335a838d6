"""The tinygrad tests need the optional extra (``pip install mtlir[tinygrad]``; make installs it): without tinygrad
they are skipped, saying so. ``import mtlir.tinygrad`` registers the device before tinygrad opens one."""
from __future__ import annotations

import pytest

tinygrad = pytest.importorskip("tinygrad", reason="tinygrad is not installed: pip install -e '.[tinygrad]'")
import mtlir.tinygrad  # noqa: E402,F401
