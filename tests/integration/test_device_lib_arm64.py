"""libfedsdk_device cross-compiles for arm64 and links: scripts/cross-build-device-lib.sh
builds it with aarch64-linux-gnu-g++ against the arm64 device root's executorch wheel and an
arm64 Debian sysroot (-Wl,--no-undefined), and the result is an AArch64 shared object that
exports exactly the C ABI of fedsdk_device.h."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_the_device_library_cross_compiles_for_arm64_and_exports_the_c_abi(tmp_path):
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "cross-build-device-lib.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    library = Path(built.stdout.strip().splitlines()[-1])
    header = subprocess.run(
        ["readelf", "-h", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"Machine:\s+AArch64", header) and re.search(r"Type:\s+DYN", header), header
    assert "Library soname: [libfedsdk_device.so.1]" in header, header
    symbols = subprocess.run(
        ["readelf", "--dyn-syms", "-W", str(library)], capture_output=True, text=True, check=True
    ).stdout
    exported = {
        line.split()[-1]
        for line in symbols.splitlines()
        if " GLOBAL " in line
        and " DEFAULT " in line
        and " UND " not in line
        and line.split()[-1].startswith("fedsdk")
    }
    header_text = (ROOT / "device_cpp" / "include" / "fedsdk_device.h").read_text()
    declared = set(re.findall(r"FEDSDK_DEVICE_API \w[\w ]*?\*?\s*(fedsdk_device_\w+)\(", header_text))
    assert exported == declared and len(declared) == 10, (exported, declared)
