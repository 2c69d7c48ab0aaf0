"""What a device is: hardware and software facts the server uses to pick its tier."""

from __future__ import annotations

import os
import platform
import resource
import sys


def total_memory_mb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        return None


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def available_memory_mb() -> float | None:
    """Memory the kernel says new work can use (``MemAvailable``), in MiB; None off Linux."""
    return _meminfo_mb("MemAvailable")


def _meminfo_mb(key: str) -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == key:
                    return int(rest.split()[0]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").strip("\x00 \n") or None
    except OSError:
        return None


def cpu_model() -> str | None:
    """The CPU's name from /proc/cpuinfo ("model name", or "Hardware"/"Processor" on ARM)."""
    text = _read("/proc/cpuinfo") or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip().lower(), value.strip())
    return fields.get("model name") or fields.get("hardware") or fields.get("processor") or (
        platform.processor() or None)


def board_model() -> str | None:
    """The board, e.g. "Raspberry Pi 4 Model B Rev 1.4" or "NVIDIA Jetson Orin Nano" (device tree)."""
    return _read("/proc/device-tree/model") or _read("/sys/firmware/devicetree/base/model")


def os_name() -> str:
    """The distribution's name (PRETTY_NAME of /etc/os-release), else the kernel's."""
    for line in (_read("/etc/os-release") or "").splitlines():
        key, _, value = line.partition("=")
        if key == "PRETTY_NAME" and value:
            return value.strip('"')
    return f"{platform.system()} {platform.release()}"


def current_rss_mb() -> float | None:
    """Resident memory of this process now, in MiB (Linux), else None."""
    text = _read("/proc/self/status") or ""
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def device_profile(runtimes: list[str]) -> dict:
    """A JSON-ready description of this machine."""
    return {
        "arch": platform.machine(),
        "system": platform.system(),
        "release": platform.release(),
        "os": os_name(),
        "board": board_model(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "memory_mb": total_memory_mb(),
        "memory_available_mb": available_memory_mb(),
        "runtimes": runtimes,
    }
