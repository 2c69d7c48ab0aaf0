"""Device policies: train only while charging, idle and/or cool (``fedsdk run --only-when``).

Read from Linux's files under ``root`` (``/`` on a real device; a fake tree in tests):

* ``charging``: ``sys/class/power_supply/*``: an ``AC``/``Mains``/``USB`` supply whose ``online``
  is 1, or a battery whose ``status`` is ``Charging`` or ``Full``. A machine with no battery at
  all (a Raspberry Pi, a Jetson, a desktop) runs on mains power and counts as charging.
* ``idle``: ``proc/loadavg``: the 1-minute load average per CPU is below ``IDLE_LOAD_PER_CPU``
  (0.5: on a 4-core Pi, under 2 runnable tasks on average). The agent's own training of the
  last minute counts too, so a device that just trained may skip the next round.
* ``cool``: ``sys/class/thermal/thermal_zone*/temp`` (millidegrees Celsius): every zone is below
  ``COOL_MAX_C`` (70 °C; a Raspberry Pi 4 throttles at 80 °C, 85 °C hard). No thermal zone: cool.

A device whose condition does not hold refuses the task with the ``policy`` code; it stays
online and registered, so the server asks it again in a later round.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CONDITIONS", "COOL_MAX_C", "IDLE_LOAD_PER_CPU", "DevicePolicy", "parse_conditions"]

CONDITIONS = ("charging", "idle", "cool")
IDLE_LOAD_PER_CPU = 0.5  # 1-minute load average per CPU below which the device is idle
COOL_MAX_C = 70.0  # every thermal zone below this many degrees Celsius
EXTERNAL_SUPPLIES = {"Mains", "USB", "USB_C", "USB_PD", "USB_DCP", "USB_CDP", "USB_ACA", "Wireless"}


def parse_conditions(text: str) -> tuple[str, ...]:
    """``"charging,idle"`` -> ``("charging", "idle")``; an unknown name is a ValueError."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in CONDITIONS]
    if unknown or not names:
        raise ValueError(f"unknown condition {', '.join(unknown) or repr(text)}: "
                         f"choose from {', '.join(CONDITIONS)}")
    return names


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


@dataclass(frozen=True)
class DevicePolicy:
    """The conditions (names of ``CONDITIONS``) that must all hold for this device to train."""

    conditions: tuple[str, ...]
    root: Path = Path("/")
    cpus: int | None = None  # for ``idle``; None: os.cpu_count()

    def blocked(self) -> str | None:
        """Why the device may not train now (one line), or None when every condition holds."""
        reasons = [why for name in self.conditions if (why := getattr(self, f"_{name}")()) is not None]
        return "; ".join(reasons) or None

    def _charging(self) -> str | None:
        supplies = sorted((self.root / "sys/class/power_supply").glob("*"))
        batteries = []
        for supply in supplies:
            kind = _read(supply / "type")
            if kind in EXTERNAL_SUPPLIES and _read(supply / "online") == "1":
                return None
            if kind == "Battery":
                batteries.append((supply.name, _read(supply / "status") or "Unknown"))
        if not batteries or any(status in ("Charging", "Full") for _, status in batteries):
            return None
        return "not charging (" + ", ".join(f"{n}: {s}" for n, s in batteries) + ")"

    def _idle(self) -> str | None:
        text = _read(self.root / "proc/loadavg")
        if text is None:
            return None  # no load average (not Linux): nothing to go by
        try:
            load = float(text.split()[0])
        except (ValueError, IndexError):
            return None
        cpus = self.cpus or os.cpu_count() or 1
        if load / cpus < IDLE_LOAD_PER_CPU:
            return None
        return f"not idle (load average {load:.2f} on {cpus} CPUs; idle below {IDLE_LOAD_PER_CPU * cpus:.2f})"

    def _cool(self) -> str | None:
        hot = []
        for zone in sorted((self.root / "sys/class/thermal").glob("thermal_zone*")):
            text = _read(zone / "temp")
            if text is None or not text.lstrip("-").isdigit():
                continue  # some zones cannot be read (sensor off): skip them
            celsius = int(text) / 1000
            if celsius >= COOL_MAX_C:
                hot.append(f"{zone.name} {celsius:.1f} °C")
        if not hot:
            return None
        return f"too hot ({', '.join(hot)}; cool below {COOL_MAX_C:.0f} °C)"
