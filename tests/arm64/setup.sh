#!/usr/bin/env bash
# The AArch64 side of `make test-arm64` on a Debian/Ubuntu x86_64 machine, cached under $1 (default .cache/arm64):
#   - qemu-user-static, the AArch64 cross compilers with Objective-C (apt-get, when missing);
#   - an AArch64 Python 3.11 and libobjc4 unpacked from Debian's arm64 packages into $1/root (apt-get download +
#     dpkg -x: nothing is installed for arm64, no binfmt_misc is needed: qemu-aarch64-static -L $1/root runs it);
#   - AArch64 wheels of mtlir's dependencies (numpy, networkx, graphviz, tqdm) from PyPI unpacked into $1/site.
# A second run finds everything and returns at once. Every download step is bounded and says what failed.
set -euo pipefail
CACHE=${1:-.cache/arm64}
PY=${PYTHON:-python3}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
ROOT=$CACHE/root SITE=$CACHE/site DEBS=$CACHE/debs WHEELS=$CACHE/wheels
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
APT="env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::http::Timeout=60 -o Acquire::Retries=2"
fail() { echo "make test-arm64: $*" >&2; exit 1; }

[ "$(uname -m)" = x86_64 ] || fail "the harness runs on an x86_64 Linux machine (this is $(uname -m))"
command -v apt-get >/dev/null || fail "needs Debian/Ubuntu's apt-get (qemu-user-static, gobjc-12-aarch64-linux-gnu, arm64 packages)"

missing=""
command -v qemu-aarch64-static >/dev/null || missing="$missing qemu-user-static"
command -v aarch64-linux-gnu-gcc-12 >/dev/null || missing="$missing gcc-12-aarch64-linux-gnu"
echo '@interface A
@end' | aarch64-linux-gnu-gcc-12 -x objective-c -fsyntax-only - 2>/dev/null || missing="$missing gobjc-12-aarch64-linux-gnu"
echo '@interface A
@end' | gcc-12 -x objective-c -fsyntax-only - 2>/dev/null || missing="$missing gobjc-12 libobjc4"
if [ -n "$missing" ]; then
  echo "installing:$missing"
  timeout 900 $SUDO $APT update -qq && timeout 900 $SUDO $APT install -y -qq $missing >/dev/null \
    || fail "apt-get install$missing failed (network? install them by hand)"
fi

if [ ! -x "$ROOT/usr/bin/python3.11" ] || [ ! -e "$ROOT/.complete" ]; then
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  timeout 900 $SUDO $APT update -qq || fail "apt-get update failed (network?)"
  mkdir -p "$DEBS" "$ROOT"
  # python3.11 and what its interpreter, ctypes and the wheels load; libobjc4 for the fake Metal
  PKGS="python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libffi8 libc6 libobjc4 libgcc-s1 libstdc++6
        zlib1g libexpat1 libbz2-1.0 liblzma5 libssl3 libuuid1 libcrypt1 libtinfo6 libncursesw6 libreadline8
        libsqlite3-0 libnsl2 libtirpc3 libdb5.3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2
        libkrb5support0 libkeyutils1"
  (cd "$DEBS" && timeout 900 $APT download $(for p in $PKGS; do echo "$p:arm64"; done) >/dev/null) \
    || fail "apt-get download of the arm64 packages failed (network, or the archive has no arm64?)"
  for deb in "$DEBS"/*.deb; do dpkg -x "$deb" "$ROOT"; done
  touch "$ROOT/.complete"
fi

# the wheels: mtlir's runtime dependencies (pyproject.toml's, less pyopencl: kernels run in the x86_64 server); the
# stamp holds the list, so a dependency added later downloads again
PACKAGES="numpy networkx graphviz tqdm ml_dtypes"
if [ "$(cat "$SITE/.complete" 2>/dev/null)" != "$PACKAGES" ]; then
  mkdir -p "$WHEELS" "$SITE"
  timeout 900 "$PY" -m pip download -q --dest "$WHEELS" --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 \
      --platform manylinux_2_17_aarch64 --python-version 3.11 --implementation cp --only-binary=:all: \
      $PACKAGES || fail "pip download of the aarch64 wheels ($PACKAGES) failed (network?)"
  for whl in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$whl" "$SITE"; done
  echo "$PACKAGES" > "$SITE/.complete"
fi
echo "arm64 root: $ROOT, wheels: $SITE"
