#!/bin/sh
# Create .venv-ort: the second Python environment that runs ONNX Runtime training (the
# `onnxruntime` device runtime and the server's ort-training/1 artifact generation).
# Idempotent: does nothing when the stamp is newer than constraints-ort.txt.
#   ORT_PYTHON  interpreter to build it from (default python3.11; the wheels need <= 3.11)
#   ORT_VENV    where to put it (default .venv-ort)
set -eu
cd "$(dirname "$0")/.."
ORT_PYTHON=${ORT_PYTHON:-python3.11}
ORT_VENV=${ORT_VENV:-.venv-ort}
STAMP="$ORT_VENV/.fedsdk-ort-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt constraints-ort.txt ]; then
    exit 0
fi
if [ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]; then
    echo "onnxruntime-training has wheels for Linux x86_64 only (this is $(uname -s)/$(uname -m))" >&2
    exit 1
fi
if ! "$ORT_PYTHON" -c 'import sys; sys.exit(not ((3, 9) <= sys.version_info[:2] <= (3, 11)))'; then
    echo "onnxruntime-training needs CPython 3.9-3.11: set ORT_PYTHON to such an interpreter" >&2
    exit 1
fi
started=$(date +%s)
echo "creating $ORT_VENV for ONNX Runtime training (about 1.5 GB)..."
"$ORT_PYTHON" -m venv "$ORT_VENV"
PIP="$ORT_VENV/bin/python -m pip install --quiet --disable-pip-version-check -c constraints-ort.txt"
$PIP torch onnxruntime-training onnx numpy paho-mqtt safetensors click rich
$PIP --no-deps -e .
"$ORT_VENV/bin/python" -c 'import onnxruntime.training.api, onnxruntime.training.artifacts'
touch "$STAMP"
echo "$ORT_VENV ready in $(( $(date +%s) - started )) s, $(du -sh "$ORT_VENV" | cut -f1)"
