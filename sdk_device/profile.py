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


def device_profile(runtimes: list[str]) -> dict:
    """A JSON-ready description of this machine."""
    return {
        "arch": platform.machine(),
        "system": platform.system(),
        "release": platform.release(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "memory_mb": total_memory_mb(),
        "runtimes": runtimes,
    }
