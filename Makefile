# mtlir: `make run` (the main job) and `make test` (the whole suite) set everything up on a fresh machine.
# Debian/Ubuntu: missing system packages are installed with apt-get (Graphviz's dot, an OpenCL runtime for the CPU,
# a C compiler, clang for tinygrad's CPU device). Elsewhere the Makefile says what to install by hand. A second run
# reuses what is installed.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TRACE ?= examples/traces/mlp.apple7.json
OUT ?= out
APT_PACKAGES := graphviz pocl-opencl-icd ocl-icd-libopencl1 build-essential clang

# The package installs editable in setuptools' strict mode: a tree of links that mypy and other tools follow (the
# plain editable mode maps passes/ and runtime/ with an import hook that only Python understands). A module added or
# removed changes MODULES and reinstalls. PYTHONSAFEPATH keeps the repository root off sys.path, so the installed
# package is the one imported (from the root, mtlir/ would be: it finds passes/, runtime/ and clients/ itself).
MODULES := $(sort $(shell find mtlir passes runtime clients -name '*.py' 2>/dev/null))
export PYTHONSAFEPATH := 1

.PHONY: run test test-tinygrad test-gpu test-arm64 typecheck setup sysdeps browser objc oclgrind bench example fuzz clean FORCE

run: $(STAMP)
	$(VENV)/bin/mtlir run $(TRACE) --viz $(OUT)/$(notdir $(basename $(TRACE)))
	@echo "pictures of every lowering stage: $(OUT)/$(notdir $(basename $(TRACE)))/*.svg"

test: typecheck browser objc oclgrind
	$(PY) -m pytest -rs tests

# the long fuzzing campaign (docs/fuzzing.md): the hypothesis profile fuzz (tests/fuzz/fuzz_profile.py, thousands of
# random queues and bad inputs); a queue that fails is saved as JSON into tests/fuzz/regressions/, which the normal
# suite replays. FUZZ_ARGS passes more pytest options (FUZZ_ARGS="--hypothesis-seed=7").
fuzz: $(STAMP)
	PYTHONPATH=tests/fuzz $(PY) -m pytest -p fuzz_profile --hypothesis-profile=fuzz -q -rs $(FUZZ_ARGS) tests/fuzz

# the tests marked gpu (tests/runtime/sim/kernels/test_gpu.py): every trace on an OpenCL device that is a GPU; they
# skip, saying why, where there is none (docs/performance.md: how they ran on an NVIDIA H200)
test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu -rs tests

# tinygrad's test/test_tiny.py (downloaded from PyPI into .cache/tinygrad at test time: tinygrad's sdist ships no
# other test file) and our tinygrad workload tests, on mtlir's METAL device (docs/tinygrad.md)
test-tinygrad: $(STAMP)
	$(PY) -m pytest -rsx tests/tinygrad

# Oclgrind: a second OpenCL device for the test of views of one buffer on every device
# (tests/runtime/sim/kernels/test_devices.py); Debian's package oclgrind, installed with apt-get when missing
OCLGRIND_ICD := /usr/lib/oclgrind/liboclgrind-rt-icd.so
oclgrind:
	@[ "$$(uname)" != Linux ] || [ -e $(OCLGRIND_ICD) ] || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; echo "installing oclgrind (a second OpenCL device for tests)"; \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq oclgrind >/dev/null || \
	    echo "apt-get could not install oclgrind: the Oclgrind test will be skipped"; \
	  else echo "no oclgrind: the Oclgrind test will be skipped (install Oclgrind to run it)"; fi; }

# The real-Metal path on AArch64 under qemu-user (docs/metal-bridge.md): tests/arm64/setup.sh installs qemu and the
# AArch64 cross compilers and caches an AArch64 Python with its wheels under .cache/arm64 (a second run reuses them).
ARM64_CACHE := .cache/arm64
test-arm64: $(STAMP) objc
	timeout 1200 tests/arm64/setup.sh $(ARM64_CACHE)
	timeout 2400 $(PY) tests/arm64/run_arm64.py --cache $(ARM64_CACHE)

# The fake Metal of tests/native is Objective-C for GNU's runtime: on Linux x86_64, gobjc-12 and libobjc4 (apt-get)
objc:
	@if [ "$$(uname)" = Linux ] && [ "$$(uname -m)" = x86_64 ] && \
	  ! printf '@interface A\n@end\n' | gcc-12 -x objective-c -fsyntax-only - >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  echo "installing system packages: gobjc-12 libobjc4 (the fake Metal of tests/native)"; \
	  command -v apt-get >/dev/null 2>&1 && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gobjc-12 libobjc4 >/dev/null || \
	  { echo "could not install gobjc-12 and libobjc4: install them by hand (the fake-Metal tests need them)"; \
	    exit 1; }; \
	fi

# a headless browser for the test that opens the --html page (tests/cli/test_page.py): Debian's chromium, installed
# with apt-get when missing; elsewhere that test is skipped and says why
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  command -v google-chrome >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; echo "installing chromium (headless browser for the page test)"; \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || \
	    echo "apt-get could not install chromium: the page test will be skipped"; \
	  else echo "no chromium: the page test will be skipped (install Chromium or Chrome to run it)"; fi; }

# mypy --strict over the installed package (run from .venv: from the repository root mypy would read the bare mtlir/)
typecheck: $(STAMP)
	cd $(VENV) && bin/mypy --config-file ../pyproject.toml -p mtlir

setup: $(STAMP)

example: $(STAMP)
	$(PY) examples/saxpy_reduce.py --viz $(OUT)/saxpy_reduce --run

# The benchmarks (docs/performance.md): the package benchmarks/, run from the repository root. The root stays off
# sys.path (the installed package is the one imported), so build/bench/path holds only a link to benchmarks/.
# The extra "bench" (matplotlib for --plot, tinygrad for the rewrite comparison) installs once. BENCH_ARGS: e.g.
# make bench BENCH_ARGS="--json --only replay"
BENCH_ARGS ?= --plot docs/img
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]' --config-settings editable_mode=strict
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	@mkdir -p build/bench/path && ln -sfn ../../../benchmarks build/bench/path/benchmarks
	PYTHONPATH=build/bench/path $(PY) -m benchmarks $(BENCH_ARGS)

# system packages: checked every time (cheap), installed only when something is missing
sysdeps:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
	  { echo "mtlir needs Python 3.11 or newer: '$(PYTHON)' is $$($(PYTHON) --version 2>&1); run make PYTHON=python3.11 ..."; exit 1; }
	@missing=""; \
	command -v dot >/dev/null 2>&1 || missing="$$missing graphviz"; \
	command -v cc >/dev/null 2>&1 || missing="$$missing build-essential"; \
	command -v clang >/dev/null 2>&1 || missing="$$missing clang"; \
	if [ "$$(uname)" != Darwin ]; then \
	  ls /etc/OpenCL/vendors/ 2>/dev/null | grep -qi pocl || missing="$$missing pocl-opencl-icd"; \
	  { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep -q 'libOpenCL\.so\.1' || missing="$$missing ocl-icd-libopencl1"; \
	fi; \
	$(PYTHON) -c "import venv, ensurepip" >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  echo "installing system packages:$$missing"; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || \
	  { echo "apt-get failed: install by hand:$$missing"; exit 1; }; \
	elif [ "$$(uname)" = Darwin ]; then \
	  echo "missing:$$missing -- on macOS install Graphviz with 'brew install graphviz' and the Xcode command line"; \
	  echo "tools with 'xcode-select --install' (OpenCL and Metal come with macOS)"; exit 1; \
	else \
	  echo "missing:$$missing -- install Graphviz (the 'dot' program), an OpenCL runtime for the CPU (PoCL) with"; \
	  echo "an ICD loader, a C compiler and Python's venv module with your system's package manager"; exit 1; \
	fi

$(VENV)/.modules: FORCE
	@mkdir -p $(VENV)
	@echo '$(MODULES)' | cmp -s - $@ || echo '$(MODULES)' > $@

$(STAMP): pyproject.toml $(VENV)/.modules | sysdeps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,tinygrad]' --config-settings editable_mode=strict
	touch $(STAMP)

clean:
	rm -rf $(VENV) $(OUT) build dist *.egg-info .pytest_cache .hypothesis .mypy_cache .cache
