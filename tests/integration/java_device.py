"""Build the Java binding of libfedsdk_device (device_java/) for integration tests.

The JNI glue is a target of device_cpp's CMake build (built when a JDK's jni.h is found);
the Java classes and the test program (tests/integration/java/) are compiled with javac into
``device_java/build/classes`` (git-ignored). Samples go to the Java program as one
little-endian file: int64 N, C, H, W, then float32 x (N, C, H, W), then int64 y (N,).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from .cpp_client import BUILD, ROOT, build_client, build_lock

JNI_LIB = BUILD / "libfedsdk_device_jni.so"
CLASSES = ROOT / "device_java" / "build" / "classes"
PROGRAM = ROOT / "tests" / "integration" / "java" / "DigitsDevice.java"
SOURCES = [*(ROOT / "device_java" / "src").rglob("*.java"), PROGRAM]


def build_java() -> tuple[Path, Path]:
    """(classes directory, JNI library); raises with the fix when no JDK is installed."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        raise RuntimeError("javac/java not found: apt-get install -y openjdk-17-jdk-headless (make jdk)")
    build_client()
    if not JNI_LIB.exists():
        raise RuntimeError(f"{JNI_LIB} was not built: the CMake build found no jni.h (set JAVA_HOME)")
    CLASSES.mkdir(parents=True, exist_ok=True)
    with build_lock():  # parallel test processes compile into the same directory
        done = subprocess.run(["javac", "--release", "17", "-d", str(CLASSES), *map(str, SOURCES)],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"javac failed:\n{done.stdout}\n{done.stderr}")
    return CLASSES, JNI_LIB


def write_samples(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    """The Java program's sample file (see the module docstring)."""
    x = np.ascontiguousarray(x, dtype="<f4")
    header = np.array([x.shape[0], *x.shape[1:]], dtype="<i8")
    path.write_bytes(header.tobytes() + x.tobytes() + np.ascontiguousarray(y, dtype="<i8").tobytes())
    return path


def java_command(classes: Path, jni: Path, *args: str) -> list[str]:
    """``java`` running tests/integration/java/DigitsDevice.java with the binding."""
    return [
        "java",
        f"-Dfedsdk.jni={jni}",
        "-Xss1m",
        "-XX:+UseSerialGC",
        "-cp",
        str(classes),
        "DigitsDevice",
        *args,
    ]
