#!/usr/bin/env bash
# Install the fedsdk device agent on Raspberry Pi OS (64-bit), Debian, Ubuntu or JetPack.
#
#   sudo ./install-device.sh                  # venv in /opt/fedsdk, systemd service, user "fedsdk"
#   sudo ./install-device.sh --wheel fedsdk-0.1.0-py3-none-any.whl    # fedsdk is not on PyPI
#   ./install-device.sh --prefix ~/fedsdk --no-systemd        # just the venv, no root needed
#   sudo ./install-device.sh --uninstall [--purge]
#
# Safe to run again: it reuses the venv, upgrades nothing it does not have to, and rewrites
# the unit file. Run with --help for every option.
set -euo pipefail

PREFIX=/opt/fedsdk
STATE_DIR=""               # default: /var/lib/fedsdk with systemd, else the user's ~/.config/fedsdk
SERVICE_USER=fedsdk
UNIT_NAME=fedsdk-agent.service
UNIT_DIR=/etc/systemd/system
USE_SYSTEMD=1
UNINSTALL=0
PURGE=0
SOURCE=""                  # what pip installs: a source tree or a wheel (fedsdk is not on PyPI)
RUNTIME=auto              # auto | executorch | torch | none
EXECUTORCH_VERSION=1.5.1  # the wheel the native runtime is built against (constraints.txt)
NATIVE_LIB=""             # a prebuilt native ExecuTorch shim to install instead of compiling one
NATIVE_BUILD=1
TORCH_WHEEL=""
SYSTEM_SITE=0
REUSE_SITE=""
PYTHON_BIN=""
PIP_ARGS=""
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
    cat <<'EOF'
Usage: install-device.sh [options]

  --prefix DIR            install under DIR (venv in DIR/venv; default /opt/fedsdk)
  --state-dir DIR         where the pairing config and work files live (FEDSDK_CONFIG_DIR;
                          default /var/lib/fedsdk, the service user's home; with --no-systemd
                          the user's own ~/.config/fedsdk)
  --user NAME             service user (default fedsdk)
  --no-systemd            no service, no user, no root needed (pair and run by hand)
  --wheel FILE            install fedsdk from this wheel (copied to the device); fedsdk is
                          not on PyPI, so give --wheel or --source unless this script sits in
                          a fedsdk checkout (then that checkout is installed)
  --source PATH           install fedsdk from a source tree (or a wheel)
  --runtime auto|executorch|torch|none
                          training runtime (auto: torch on a Jetson, whose CUDA wheel is right
                          there; executorch elsewhere on aarch64/x86_64: the torch-free native
                          ExecuTorch runtime, the executorch wheel with --no-deps, built with g++)
  --native-lib FILE       with executorch: install this prebuilt native shim (e.g. built with
                          aarch64-linux-gnu-g++ on another machine) instead of compiling it here
  --no-native-build       with executorch: do not compile the shim now (put one in
                          PREFIX/native/ yourself; the runtime stays unavailable until then)
  --torch-wheel FILE      install this torch wheel first (e.g. NVIDIA's JetPack wheel)
  --system-site-packages  let the venv see system packages (JetPack's own torch)
  --reuse-site-packages DIR
                          make the packages of another environment's site-packages DIR
                          importable instead of downloading them (offline installs)
  --python PYTHON         interpreter for the venv (default python3; needs >= 3.11)
  --pip-args "ARGS"       extra pip install arguments (e.g. "--no-index --find-links DIR")
  --uninstall             remove the service and the venv (keeps pairing config and user)
  --purge                 with --uninstall: also remove the state dir and the service user
  -h, --help              this text
EOF
}

die() { echo "install-device.sh: $*" >&2; exit 1; }
say() { echo "==> $*"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX="${2:?--prefix needs a directory}"; shift 2 ;;
        --state-dir) STATE_DIR="${2:?--state-dir needs a directory}"; shift 2 ;;
        --user) SERVICE_USER="${2:?--user needs a name}"; shift 2 ;;
        --no-systemd) USE_SYSTEMD=0; shift ;;
        --source) SOURCE="${2:?--source needs a path}"; shift 2 ;;
        --wheel) SOURCE="${2:?--wheel needs a file}"
                 case "$SOURCE" in *.whl) ;; *) die "--wheel needs a .whl file, not '$SOURCE'" ;; esac
                 shift 2 ;;
        --runtime) RUNTIME="${2:?--runtime needs auto, executorch, torch or none}"; shift 2 ;;
        --native-lib) NATIVE_LIB="${2:?--native-lib needs a file}"; shift 2 ;;
        --no-native-build) NATIVE_BUILD=0; shift ;;
        --torch-wheel) TORCH_WHEEL="${2:?--torch-wheel needs a file}"; shift 2 ;;
        --system-site-packages) SYSTEM_SITE=1; shift ;;
        --reuse-site-packages) REUSE_SITE="${2:?--reuse-site-packages needs a directory}"; shift 2 ;;
        --python) PYTHON_BIN="${2:?--python needs an interpreter}"; shift 2 ;;
        --pip-args) PIP_ARGS="${2?--pip-args needs a value}"; shift 2 ;;
        --uninstall) UNINSTALL=1; shift ;;
        --purge) PURGE=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done

case "$RUNTIME" in
    auto|executorch|torch|none) ;;
    *) die "--runtime must be auto, executorch, torch or none, not '$RUNTIME'" ;;
esac
if [ -z "$SOURCE" ] && [ -f "$HERE/../pyproject.toml" ] && [ -d "$HERE/../sdk_device" ]; then
    SOURCE="$(cd "$HERE/.." && pwd)"   # this script's own checkout
fi
PREFIX="$(realpath -m "$PREFIX")"
if [ -z "$STATE_DIR" ] && [ "$USE_SYSTEMD" = 1 ]; then STATE_DIR=/var/lib/fedsdk; fi
if [ -n "$STATE_DIR" ]; then STATE_DIR="$(realpath -m "$STATE_DIR")"; fi
VENV="$PREFIX/venv"
MARKER="$PREFIX/.fedsdk-device-install"
UNIT_FILE="$PREFIX/$UNIT_NAME"
if [ "$USE_SYSTEMD" = 1 ] && [ "$(id -u)" != 0 ]; then
    die "the systemd service needs root: run with sudo, or pass --no-systemd (and --prefix DIR)"
fi
if [ "$USE_SYSTEMD" = 1 ] && [ ! -d /run/systemd/system ]; then
    die "systemd is not running here (a container?): pass --no-systemd and start 'fedsdk run' yourself"
fi

# ---------------------------------------------------------------------------------------
uninstall() {
    if [ "$USE_SYSTEMD" = 1 ] && [ -f "$UNIT_DIR/$UNIT_NAME" ]; then
        say "stopping and removing $UNIT_NAME"
        systemctl disable --now "$UNIT_NAME" >/dev/null 2>&1 || true
        rm -f "$UNIT_DIR/$UNIT_NAME"
        systemctl daemon-reload >/dev/null 2>&1 || true
    fi
    if [ -d "$PREFIX" ] && [ ! -f "$MARKER" ] && [ -d "$VENV" ]; then
        die "$PREFIX was not made by this script (no $MARKER): not removing anything there"
    fi
    say "removing $VENV"
    rm -rf "$VENV"
    rm -rf "$PREFIX/native"
    rm -f "$UNIT_FILE" "$MARKER"
    rmdir "$PREFIX" 2>/dev/null || true
    if [ "$PURGE" = 1 ] && [ -n "$STATE_DIR" ]; then
        say "removing $STATE_DIR (pairing config, work files)"
        rm -rf "$STATE_DIR"
        if [ "$USE_SYSTEMD" = 1 ] && id "$SERVICE_USER" >/dev/null 2>&1; then
            userdel "$SERVICE_USER" 2>/dev/null || true
        fi
    elif [ -n "$STATE_DIR" ]; then
        echo "kept $STATE_DIR (pairing config); --purge removes it (and the service user)"
    fi
    say "fedsdk device agent uninstalled"
}

if [ "$UNINSTALL" = 1 ]; then
    uninstall
    exit 0
fi

# ---------------------------------------------------------------------------------------
# Platform: 64-bit Linux; Raspberry Pi and Jetson recognised for the notes.
ARCH="$(uname -m)"
OS_NAME="unknown Linux"
if [ -r /etc/os-release ]; then
    # shellcheck disable=SC1091
    OS_NAME="$(. /etc/os-release && echo "${PRETTY_NAME:-$ID}")"
fi
BOARD=""
if [ -r /proc/device-tree/model ]; then
    BOARD="$(tr -d '\0' </proc/device-tree/model)"
fi
JETSON=0
if [ -f /etc/nv_tegra_release ] || [[ "$BOARD" == *Jetson* ]]; then
    JETSON=1
fi
say "platform: $OS_NAME, $ARCH${BOARD:+, $BOARD}"

if [ -z "$SOURCE" ]; then
    die "fedsdk is not on PyPI: copy a wheel to the device and pass --wheel FILE (build it in a checkout with 'python3 -m pip wheel --no-deps -w dist .'), or run this script from a fedsdk checkout"
fi
if [ "$RUNTIME" = auto ]; then
    case "$ARCH" in
        x86_64|aarch64|arm64) if [ "$JETSON" = 1 ]; then RUNTIME=torch; else RUNTIME=executorch; fi ;;
        *) RUNTIME=none
           echo "note: no PyTorch or ExecuTorch wheels for $ARCH (a 32-bit OS?): installing without a training"
           echo "      runtime. Use a 64-bit OS (Raspberry Pi OS 64-bit) to train on this board." ;;
    esac
fi

# Python >= 3.11 with venv.
PYTHON_BIN="${PYTHON_BIN:-python3}"
command -v "$PYTHON_BIN" >/dev/null 2>&1 || die "$PYTHON_BIN not found: apt-get install -y python3 python3-venv"
if ! "$PYTHON_BIN" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    echo "Ubuntu 22.04 / JetPack 6: apt-get install -y python3.11 python3.11-venv; --python python3.11" >&2
    die "fedsdk needs Python >= 3.11; $PYTHON_BIN is $("$PYTHON_BIN" -V 2>&1)"
fi
if ! "$PYTHON_BIN" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing python3-venv (apt-get)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
        die "$PYTHON_BIN lacks the venv module: sudo apt-get install -y python3-venv"
    fi
fi

# ---------------------------------------------------------------------------------------
mkdir -p "$PREFIX"
if [ -d "$VENV" ] && [ ! -f "$MARKER" ]; then
    die "$VENV exists but was not made by this script: choose another --prefix"
fi
if [ ! -x "$VENV/bin/python" ]; then
    say "creating the venv $VENV"
    venv_args=()
    if [ "$SYSTEM_SITE" = 1 ]; then venv_args+=(--system-site-packages); fi
    "$PYTHON_BIN" -m venv "${venv_args[@]}" "$VENV"
fi
touch "$MARKER"
if [ -n "$REUSE_SITE" ]; then
    [ -d "$REUSE_SITE" ] || die "--reuse-site-packages: $REUSE_SITE is not a directory"
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    realpath "$REUSE_SITE" >"$site/fedsdk-reused-site.pth"   # appended after the venv's own packages
fi

# shellcheck disable=SC2206  # PIP_ARGS is split into words on purpose
pip_extra=($PIP_ARGS)
pip_install() { "$VENV/bin/python" -m pip install --disable-pip-version-check -q "${pip_extra[@]}" "$@"; }

if [ -n "$TORCH_WHEEL" ]; then
    say "installing torch from $TORCH_WHEEL"
    pip_install "$TORCH_WHEEL"
fi
extras="device"
if [ "$RUNTIME" = torch ]; then
    if "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
        say "torch is already importable in the venv: keeping it"
    else
        if [ "$JETSON" = 1 ]; then
            echo "note: Jetson: PyPI's aarch64 torch is CPU-only. For the GPU, install NVIDIA's JetPack"
            echo "      torch wheel (--torch-wheel FILE, or JetPack's system torch with"
            echo "      --system-site-packages); see firmware_scripts/README.md."
        fi
        extras="device,torch"
    fi
fi
[ -e "$SOURCE" ] || die "$SOURCE does not exist (fedsdk is not on PyPI: --wheel FILE or --source DIR)"
target="$(realpath "$SOURCE")[$extras]"
say "installing $target"
pip_install "$target"
"$VENV/bin/fedsdk" --help >/dev/null || die "the installed fedsdk does not start"

# The torch-free runtime: the executorch wheel without its dependencies (they name torch, and
# PyPI's aarch64 torch is a CUDA build of ~2.8 GB), and the native shim compiled against it.
NATIVE_OUT="$PREFIX/native/libfedsdk_executorch.so"
if [ "$RUNTIME" = executorch ]; then
    say "installing executorch $EXECUTORCH_VERSION (--no-deps: no torch)"
    # --no-compile: the native runtime uses the wheel's include/ and lib/ only, never its Python
    # (47 MB of .pyc, and most of the install time on a slow board)
    pip_install --no-deps --no-compile "executorch==$EXECUTORCH_VERSION"
    mkdir -p "$PREFIX/native"
    if [ -n "$NATIVE_LIB" ]; then
        [ -f "$NATIVE_LIB" ] || die "--native-lib $NATIVE_LIB does not exist"
        say "installing the prebuilt native runtime $NATIVE_LIB"
        install -m 0644 "$NATIVE_LIB" "$NATIVE_OUT"
    elif [ "$NATIVE_BUILD" = 1 ]; then
        if ! command -v "${CXX:-g++}" >/dev/null 2>&1; then
            if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
                say "installing g++ (apt-get) to build the native ExecuTorch runtime"
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
            else
                die "no C++ compiler for the native ExecuTorch runtime: sudo apt-get install -y g++ (or --native-lib FILE, or --no-native-build)"
            fi
        fi
        say "building the native ExecuTorch runtime and its fused training kernels (${CXX:-g++})"
        # --kernels: libfedsdk_kernels.so beside the shim (fused pte/1 programs; FEDSDK_KERNELS_LIB)
        "$VENV/bin/python" -m sdk_device.runtimes.native_build --kernels --out "$NATIVE_OUT" >/dev/null \
            || die "building the native ExecuTorch runtime failed (see above)"
    else
        echo "note: --no-native-build: put the native runtime in $NATIVE_OUT before 'fedsdk run'"
    fi
fi

# ---------------------------------------------------------------------------------------
# The unit file is always written next to the venv (inspect it, or install it by hand).
sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@STATE_DIR@|${STATE_DIR:-/var/lib/fedsdk}|g" \
    -e "s|@USER@|$SERVICE_USER|g" "$HERE/fedsdk-agent.service" >"$UNIT_FILE"

if [ "$USE_SYSTEMD" = 1 ]; then
    if ! id "$SERVICE_USER" >/dev/null 2>&1; then
        say "creating the system user $SERVICE_USER (home $STATE_DIR)"
        useradd --system --home-dir "$STATE_DIR" --shell /usr/sbin/nologin "$SERVICE_USER"
    fi
    for group in video render; do  # GPU access on Jetson (and the Pi's VideoCore)
        if getent group "$group" >/dev/null; then usermod -a -G "$group" "$SERVICE_USER"; fi
    done
    install -d -m 0700 -o "$SERVICE_USER" -g "$SERVICE_USER" "$STATE_DIR"
    install -m 0644 "$UNIT_FILE" "$UNIT_DIR/$UNIT_NAME"
    systemctl daemon-reload
    systemctl enable "$UNIT_NAME" >/dev/null
    say "installed $UNIT_DIR/$UNIT_NAME (enabled; it starts once the device is paired)"
    run_as="sudo -u $SERVICE_USER FEDSDK_CONFIG_DIR=$STATE_DIR "
elif [ -n "$STATE_DIR" ]; then
    mkdir -p "$STATE_DIR"
    run_as="FEDSDK_CONFIG_DIR=$STATE_DIR "
else
    run_as=""
fi
native_env=""
if [ "$RUNTIME" = executorch ]; then
    # the unit file sets both for the service
    native_env="FEDSDK_NATIVE_LIB=$NATIVE_OUT FEDSDK_KERNELS_LIB=$PREFIX/native/libfedsdk_kernels.so "
fi
data="${STATE_DIR:-\$HOME}/data.npz"

cat <<EOF

fedsdk device agent installed in $VENV.
Pair this device: on the server run 'fedsdk-server pair-code --run-dir RUN_DIR'; it prints the command to type
here. Run it as below, so that the agent finds its configuration later:

  ${run_as}$VENV/bin/fedsdk pair --server mqtts://SERVER:8883 --code CODE --data $data

EOF
if [ "$USE_SYSTEMD" = 1 ]; then
    cat <<EOF
Then:  sudo systemctl start $UNIT_NAME         (starts at boot from now on)
Logs:  journalctl -u $UNIT_NAME -f
State: ${run_as}$VENV/bin/fedsdk status
EOF
else
    cat <<EOF
Then:  ${run_as}${native_env}$VENV/bin/fedsdk run
(a unit file for later is in $UNIT_FILE)
EOF
fi
