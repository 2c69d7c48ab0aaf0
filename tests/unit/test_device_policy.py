"""Device policies (`fedsdk run --only-when`) read from fake sysfs/procfs roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdk_device.policy import DevicePolicy, parse_conditions


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def laptop(root: Path, ac_online: str, battery: str) -> Path:
    write(root, "sys/class/power_supply/AC/type", "Mains")
    write(root, "sys/class/power_supply/AC/online", ac_online)
    write(root, "sys/class/power_supply/BAT0/type", "Battery")
    write(root, "sys/class/power_supply/BAT0/status", battery)
    return root


def test_a_laptop_on_battery_is_not_charging_and_says_why(tmp_path):
    reason = DevicePolicy(("charging",), laptop(tmp_path, "0", "Discharging")).blocked()
    assert reason is not None and "not charging" in reason and "BAT0: Discharging" in reason


def test_a_laptop_on_mains_power_is_charging_even_when_its_battery_holds_its_charge(tmp_path):
    assert DevicePolicy(("charging",), laptop(tmp_path, "1", "Not charging")).blocked() is None


def test_a_full_or_charging_battery_counts_as_charging(tmp_path):
    assert DevicePolicy(("charging",), laptop(tmp_path / "a", "0", "Full")).blocked() is None
    assert DevicePolicy(("charging",), laptop(tmp_path / "b", "0", "Charging")).blocked() is None


def test_a_phone_on_usb_power_is_charging(tmp_path):
    write(tmp_path, "sys/class/power_supply/usb/type", "USB")
    write(tmp_path, "sys/class/power_supply/usb/online", "1")
    write(tmp_path, "sys/class/power_supply/battery/type", "Battery")
    write(tmp_path, "sys/class/power_supply/battery/status", "Discharging")
    assert DevicePolicy(("charging",), tmp_path).blocked() is None


def test_a_board_without_any_battery_runs_on_mains_and_counts_as_charging(tmp_path):
    assert DevicePolicy(("charging",), tmp_path).blocked() is None


def test_idle_compares_the_one_minute_load_average_per_cpu_with_one_half(tmp_path):
    write(tmp_path, "proc/loadavg", "1.90 3.00 3.00 2/300 1234")
    assert DevicePolicy(("idle",), tmp_path, cpus=4).blocked() is None
    write(tmp_path, "proc/loadavg", "2.10 0.10 0.10 2/300 1234")
    reason = DevicePolicy(("idle",), tmp_path, cpus=4).blocked()
    assert reason is not None and "load average 2.10 on 4 CPUs" in reason


def test_cool_requires_every_thermal_zone_below_seventy_degrees(tmp_path):
    write(tmp_path, "sys/class/thermal/thermal_zone0/temp", "45000")
    write(tmp_path, "sys/class/thermal/thermal_zone1/temp", "69999")
    write(tmp_path, "sys/class/thermal/cooling_device0/cur_state", "0")
    assert DevicePolicy(("cool",), tmp_path).blocked() is None
    write(tmp_path, "sys/class/thermal/thermal_zone1/temp", "81500")
    reason = DevicePolicy(("cool",), tmp_path).blocked()
    assert reason is not None and "thermal_zone1 81.5 °C" in reason and "thermal_zone0" not in reason


def test_an_unreadable_thermal_zone_is_skipped(tmp_path):
    write(tmp_path, "sys/class/thermal/thermal_zone0/temp", "")
    assert DevicePolicy(("cool",), tmp_path).blocked() is None


def test_every_failing_condition_is_named(tmp_path):
    laptop(tmp_path, "0", "Discharging")
    write(tmp_path, "proc/loadavg", "9.00 9.00 9.00 9/300 1234")
    write(tmp_path, "sys/class/thermal/thermal_zone0/temp", "90000")
    reason = DevicePolicy(("charging", "idle", "cool"), tmp_path, cpus=2).blocked()
    assert reason is not None
    assert "not charging" in reason and "not idle" in reason and "too hot" in reason


def test_conditions_are_parsed_from_a_comma_separated_list():
    assert parse_conditions("charging, idle,cool,idle") == ("charging", "idle", "cool")
    with pytest.raises(ValueError, match="unknown condition hot"):
        parse_conditions("charging,hot")
    with pytest.raises(ValueError):
        parse_conditions(" , ")
