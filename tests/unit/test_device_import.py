"""The device SDK must stay importable without torch: ``import sdk_device`` never pulls it in."""

from __future__ import annotations

import json
import subprocess
import sys

MODULES = ["sdk_device", "sdk_device.agent", "sdk_device.cli", "sdk_device.transport.endpoint",
           "sdk_device.protocol"]

PROBE = """
import importlib, json, sys
for name in {modules!r}:
    importlib.import_module(name)
engines = ('torch', 'torchvision', 'executorch', 'onnxruntime')
heavy = sorted(m for m in sys.modules if m.split('.')[0] in engines)
print(json.dumps({{"loaded": [n for n in {modules!r} if n in sys.modules], "heavy": heavy}}))
"""


def _probe(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_device_sdk_does_not_import_torch():
    result = _probe(PROBE.format(modules=MODULES))
    assert result["loaded"] == MODULES  # the imports really happened
    assert result["heavy"] == [], f"the device SDK imported {result['heavy'][:5]}"


def test_probe_can_see_torch():
    """Guards the probe itself: importing the torch runtime does show up as torch."""
    result = _probe(PROBE.format(modules=["sdk_device.runtimes.torch_runtime"]))
    assert "torch" in result["heavy"]
