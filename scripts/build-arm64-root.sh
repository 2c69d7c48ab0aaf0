#!/usr/bin/env bash
# Usage: build-arm64-root.sh [--print-root]
#
# An emulated arm64 device for tests/integration/test_arm64_device.py: a Debian bookworm arm64
# root with the torch-free fedsdk device installed by firmware_scripts/install-device.sh.
# `make test` runs it (make arm64-root); the test itself downloads nothing.
#
# 1. base (cached by the package lists and pins): `mmdebstrap --variant=extract` (packages
#    unpacked, nothing run, nothing emulated) + the arm64 wheels from PyPI, downloaded by the
#    host's pip (executorch 1.5.1 cp311 aarch64 with no dependencies, numpy, paho-mqtt, ...).
# 2. install (cached by the checkout's sources as well): a copy of the base root, a fedsdk wheel
#    built offline from this checkout, install-device.sh run in the root under proot + qemu-user
#    (timed: the install time on arm64, emulated; pip's --no-compile: byte-compiling pygments
#    and numpy under emulation took minutes, and imports compile what they use), and the native ExecuTorch shim
#    and the fused training kernels (libfedsdk_kernels.so, beside the shim) cross-compiled on the host
#    with aarch64-linux-gnu-g++ against the installed wheel's headers and libraries.
#    proot runs the root's programs through qemu-aarch64-static without binfmt_misc or chroot.
#
# Cache: $FEDSDK_ARM64_CACHE (default ~/.cache/fedsdk-arm64); older installs are removed.
# --print-root prints where the installed root is (or would be) and exits 1 if it is not built.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${FEDSDK_HOST_PYTHON:-$REPO/.venv/bin/python}"   # the host's python, with pip
CACHE="${FEDSDK_ARM64_CACHE:-$HOME/.cache/fedsdk-arm64}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
DEBIAN_PACKAGES="bash,coreutils,sed,python3,python3-venv,libstdc++6,ca-certificates"
PREFIX=/opt/fedsdk                             # where install-device.sh puts the device, in the root

pin() { grep -i "^$1==" "$REPO/constraints.txt" | head -n1; }
WHEELS="$(pin executorch) $(pin numpy) $(pin paho-mqtt) $(pin safetensors) $(pin click) $(pin rich) $(pin cryptography)"

digest() { sha256sum | cut -c1-16; }
seconds_since() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}'; }
BASE_KEY="$( { cat "$0"; echo "$SUITE $DEBIAN_PACKAGES $WHEELS"; } | digest)"
SOURCES_KEY="$(cd "$REPO" && find fedcore sdk_device server_toolkit export firmware_scripts pyproject.toml \
    -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum | digest)"
BASE="$CACHE/base-$BASE_KEY"
INSTALLED="$CACHE/installed-$BASE_KEY-$SOURCES_KEY"

if [ "${1:-}" = --print-root ]; then
    echo "$INSTALLED"
    [ -f "$INSTALLED/install.json" ]
    exit
fi
if [ -f "$INSTALLED/install.json" ]; then
    echo "arm64 root up to date: $INSTALLED"
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "build-arm64-root.sh: mmdebstrap needs root here (sudo make test)" >&2; exit 1; }
sh "$REPO/scripts/ensure-tool.sh" mmdebstrap mmdebstrap
sh "$REPO/scripts/ensure-tool.sh" qemu-aarch64-static qemu-user-static
sh "$REPO/scripts/ensure-tool.sh" proot proot
sh "$REPO/scripts/ensure-tool.sh" aarch64-linux-gnu-g++ g++-aarch64-linux-gnu
mkdir -p "$CACHE"

if [ ! -f "$BASE/done" ]; then
    rm -rf "$BASE" "$CACHE"/base-*   # one base at a time
    echo "arm64 root: mmdebstrap $SUITE ($DEBIAN_PACKAGES)"
    mkdir -p "$BASE/wheels"
    mmdebstrap --quiet --variant=extract --architectures=arm64 --include="$DEBIAN_PACKAGES" \
        "$SUITE" "$BASE/root" "$MIRROR"
    echo "arm64 root: arm64 wheels from PyPI ($WHEELS)"
    platform=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none
              --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64)
    # shellcheck disable=SC2086  # WHEELS is a list of requirements
    "$PYTHON" -m pip download -q --disable-pip-version-check "${platform[@]}" -d "$BASE/wheels" \
        --no-deps $WHEELS
    "$PYTHON" -m pip download -q --disable-pip-version-check "${platform[@]}" -d "$BASE/wheels" \
        -c "$REPO/constraints.txt" rich cryptography   # with their dependencies (cryptography: --secagg)
    touch "$BASE/done"
fi

rm -rf "$CACHE"/installed-*   # the previous checkout's install
work="$INSTALLED.partial"
rm -rf "$work"
mkdir -p "$work/wheels"
cp -a "$BASE/root" "$work/root"
cp "$BASE"/wheels/*.whl "$work/wheels/"

echo "arm64 root: fedsdk wheel from $REPO (offline)"
src="$(mktemp -d)"
cp "$REPO/pyproject.toml" "$REPO/README.md" "$src/"
for package in fedcore sdk_device server_toolkit export; do
    cp -r "$REPO/$package" "$src/$package"
done
"$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation --no-index \
    -w "$work/wheels" "$src" >/dev/null
rm -rf "$src"
wheel="$(cd "$work/wheels" && ls fedsdk-*.whl)"

# Run a command in the root: arm64 programs through qemu-user; the host's /proc, /dev, /sys;
# the wheels at /wheels and the installer at /installer.
in_root() {
    proot -q qemu-aarch64-static -r "$work/root" -b /proc -b /dev -b /sys -b "$work/wheels:/wheels" \
        -b "$REPO/firmware_scripts:/installer" -w / /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root "$@"
}
echo "arm64 root: install-device.sh under qemu-user ($(qemu-aarch64-static --version | head -n1))"
started="$(date +%s%N)"
in_root /bin/bash /installer/install-device.sh --no-systemd --prefix "$PREFIX" --state-dir /var/lib/fedsdk \
    --wheel "/wheels/$wheel" --no-native-build --pip-args "--no-index --find-links /wheels --no-compile"
install_s="$(seconds_since "$started")"
load="$(cut -d' ' -f1 /proc/loadavg)"

echo "arm64 root: native ExecuTorch shim and fused kernels, cross-compiled with aarch64-linux-gnu-g++"
site="$work/root$PREFIX/venv/lib/python3.11/site-packages"
started="$(date +%s%N)"
# --kernels: libfedsdk_kernels.so beside the shim (fused pte/1 programs; FEDSDK_KERNELS_LIB)
PYTHONPATH="$REPO" "$PYTHON" -m sdk_device.runtimes.native_build --kernels --cxx aarch64-linux-gnu-g++ \
    --executorch-dir "$site/executorch" --rpath "${site#"$work/root"}/executorch/lib" \
    --out "$work/root$PREFIX/native/libfedsdk_executorch.so" >/dev/null
compile_s="$(seconds_since "$started")"

mb() { du -sm "$@" | awk '{s += $1} END {print s}'; }
cat >"$work/install.json" <<EOF
{"install_s": $install_s, "load_average": $load, "cross_compile_s": $compile_s, "qemu": "$(qemu-aarch64-static --version | head -n1)",
 "venv_mb": $(mb "$work/root$PREFIX/venv"), "site_packages_mb": $(mb "$site"),
 "executorch_mb": $(mb "$site/executorch"), "numpy_mb": $(mb "$site"/numpy "$site"/numpy.libs),
 "fedsdk_mb": $(mb "$site"/fedcore "$site"/sdk_device "$site"/server_toolkit "$site"/export),
 "paho_mb": $(mb "$site/paho"), "native_lib_kb": $(du -sk "$work/root$PREFIX/native" | cut -f1),
 "kernels_lib_kb": $(du -sk "$work/root$PREFIX/native/libfedsdk_kernels.so" | cut -f1),
 "root_mb": $(mb "$work/root")}
EOF
mv "$work" "$INSTALLED"
echo "arm64 root ready: $INSTALLED ($(tr -d '\n' <"$INSTALLED/install.json"))"
