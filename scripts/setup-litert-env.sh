#!/bin/sh
# Create .venv-litert: the optional environment with litert-torch, which converts torch
# models to .tflite (export/tflite.py runs it as a subprocess). ~2.1 GB, about 2 minutes.
# Idempotent: does nothing when the stamp is newer than constraints-litert.txt.
#   LITERT_PYTHON  interpreter to build it from (default python3.11)
#   LITERT_VENV    where to put it (default .venv-litert)
set -eu
cd "$(dirname "$0")/.."
LITERT_PYTHON=${LITERT_PYTHON:-python3.11}
LITERT_VENV=${LITERT_VENV:-.venv-litert}
STAMP="$LITERT_VENV/.fedsdk-litert-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt constraints-litert.txt ]; then
    exit 0
fi
started=$(date +%s)
echo "creating $LITERT_VENV for litert-torch (about 2 GB)..."
"$LITERT_PYTHON" -m venv "$LITERT_VENV"
PIP="$LITERT_VENV/bin/python -m pip install --quiet --disable-pip-version-check -c constraints-litert.txt"
$PIP torch litert-torch ai-edge-litert numpy paho-mqtt safetensors click rich
$PIP --no-deps -e .
"$LITERT_VENV/bin/python" -c 'import litert_torch, ai_edge_litert.interpreter'
touch "$STAMP"
echo "$LITERT_VENV ready in $(( $(date +%s) - started )) s, $(du -sh "$LITERT_VENV" | cut -f1)"
