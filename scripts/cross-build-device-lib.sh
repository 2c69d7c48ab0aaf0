#!/bin/bash
# Usage: cross-build-device-lib.sh OUT_DIR
# Cross-compiles libfedsdk_device.so (device_cpp/, the C ABI of fedsdk_device.h) for arm64 with
# aarch64-linux-gnu-g++, as `fedsdk runtime build --cxx aarch64-linux-gnu-g++` does for the
# native shim, and checks that it links (no undefined symbol left against its libraries):
# * ExecuTorch: the aarch64 executorch wheel of the arm64 device root (scripts/build-arm64-root.sh,
#   `make arm64-root`);
# * libmosquitto, OpenSSL, nlohmann-json: an arm64 Debian sysroot made once by mmdebstrap
#   (--variant=extract: unpacked, nothing run) in $FEDSDK_ARM64_DEV_CACHE (default
#   ~/.cache/fedsdk-arm64-dev).
# Prints the library's path. Needs root for mmdebstrap the first time; the library is cached by
# the content of the sources (about 1 min of CPU to build, one compiler per core).
set -euo pipefail

OUT="${1:?usage: cross-build-device-lib.sh OUT_DIR}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${FEDSDK_ARM64_DEV_CACHE:-$HOME/.cache/fedsdk-arm64-dev}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CXX="${CXX:-aarch64-linux-gnu-g++}"
SYSROOT="$CACHE/bookworm-arm64"

sh "$REPO/scripts/ensure-tool.sh" aarch64-linux-gnu-g++ g++-aarch64-linux-gnu >&2
if [ ! -f "$SYSROOT/done" ]; then
    rm -rf "$SYSROOT"
    mkdir -p "$SYSROOT"
    mmdebstrap --quiet --variant=extract --architectures=arm64 \
        --include=libmosquitto-dev,libssl-dev,nlohmann-json3-dev bookworm "$SYSROOT/root" "$MIRROR" >&2
    touch "$SYSROOT/done"
fi
root="$(bash "$REPO/scripts/build-arm64-root.sh" --print-root)" || {
    echo "cross-build-device-lib.sh: no arm64 device root (make arm64-root)" >&2
    exit 1
}
et="$(ls -d "$root"/root/opt/fedsdk/venv/lib/python3.*/site-packages/executorch)"
sys="$SYSROOT/root"
mkdir -p "$OUT"
src="$REPO/device_cpp/src"
sources=()
for f in "$src"/*.cpp; do
    [ "$(basename "$f")" = main.cpp ] || sources+=("$f")   # the library: everything but the executable's main
done
flags=(-std=c++17 -O2 -fPIC -fvisibility=hidden -fvisibility-inlines-hidden -Wno-deprecated-declarations
       -DC10_USING_CUSTOM_GENERATED_MACROS -DET_EVENT_TRACER_ENABLED -DET_USE_THREADPOOL
       -I"$REPO/device_cpp/include" -I"$src" -I"$et/include" -I"$et/include/executorch/runtime/core/portable_type/c10"
       -idirafter "$sys/usr/include" -idirafter "$sys/usr/include/aarch64-linux-gnu")
# Built once per content of the sources, the flags and the wheel: $CACHE/lib-<digest>/.
digest="$( (cat "${sources[@]}" "$src"/*.h "$REPO/device_cpp/include/fedsdk_device.h" "$0"; echo "$et") | sha256sum | cut -c1-16)"
built="$CACHE/lib-$digest"
if [ ! -f "$built/libfedsdk_device.so.1" ]; then
    rm -rf "$CACHE"/lib-*
    mkdir -p "$built/obj"
    # one compiler per core; `wait` on a failed one stops the script (set -e)
    jobs_=()
    for f in "${sources[@]}"; do
        "$CXX" "${flags[@]}" -c "$f" -o "$built/obj/$(basename "$f" .cpp).o" &
        jobs_+=("$!")
        if [ "${#jobs_[@]}" -ge "$(nproc)" ]; then
            wait "${jobs_[0]}"
            jobs_=("${jobs_[@]:1}")
        fi
    done
    for job in "${jobs_[@]}"; do wait "$job"; done
    # The wheel's libraries are found on the device through the rpath (the venv's path there);
    # --no-undefined: every symbol resolves against the arm64 libraries, i.e. the library links.
    "$CXX" -shared "$built"/obj/*.o -o "$built/libfedsdk_device.so.1" -Wl,-soname,libfedsdk_device.so.1 \
        -L"$et/lib" -L"$sys/usr/lib/aarch64-linux-gnu" -Wl,-rpath-link,"$sys/usr/lib/aarch64-linux-gnu" \
        -Wl,--no-as-needed -lexecutorch -lexecutorch_kernels_optimized -lexecutorch_backend_xnnpack \
        -lexecutorch_threadpool -Wl,--as-needed -lmosquitto -lssl -lcrypto -lpthread \
        -Wl,--no-undefined -Wl,-rpath,"${et#"$root/root"}/lib"
fi
cp "$built/libfedsdk_device.so.1" "$OUT/"
echo "$OUT/libfedsdk_device.so.1"
