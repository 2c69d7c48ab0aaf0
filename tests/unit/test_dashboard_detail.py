"""The dashboard's detail: each asked device's state in the open round (MQTT and in-process grids),
the fleet table's arch and tier reason, the per-tier accuracy chart and the training / uploading
gauges."""

from __future__ import annotations

import re
import time
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from sdk_device.protocol import messages as msgs
from sdk_device.transport.endpoint import Incoming
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.observe import pages
from server_toolkit.observe.fleet_view import FleetView, registry_fleet
from server_toolkit.observe.prometheus_metrics import exposition, metrics_registry
from server_toolkit.observe.state import DashboardState
from server_toolkit.rounds import inprocess_grid
from server_toolkit.rounds.grid import Grid, LiveRound
from server_toolkit.rounds.inprocess_grid import InProcessGrid
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.rounds.mqtt_grid import MqttGrid
from server_toolkit.rounds.results import PendingTask
from tests.report_dom import page_tables


class NoDevices(Grid):
    def online(self):
        return []

    def exchange(self, round_number, instructions, deadline, quorum):
        raise NotImplementedError


class FixedRound(NoDevices):
    def __init__(self, live: LiveRound | None) -> None:
        self._live = live

    def live(self):
        return self._live


def _mqtt_grid_in_round_5(tmp_path) -> MqttGrid:
    """Round 5 asked a..e: a accepted, b pulled, c training (40 %), d rejected, e offline."""
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    registry.add_devices([(d, None) for d in "abcde"])
    grid = MqttGrid(None, registry)
    for dev in "abcde":
        grid._pending[f"t-{dev}"] = PendingTask(f"t-{dev}", 5, SimpleNamespace(device_id=dev), {}, {}, None)
        grid.devices[dev] = DeviceInfo(dev, 10)
    grid._open_round, grid._deadline = 5, time.time() + 30
    grid._accepted = ["t-a"]
    grid._pulls[("t-b",)] = ("b", None, Future())
    grid._handle(Incoming("c", msgs.Heartbeat(state="training", task_id="t-c", progress=0.4)))
    grid._record_rejection(5, "d", "t-d", "non_finite", "update holds NaN")
    grid._handle(Incoming("e", status="offline"))
    return grid


def test_the_mqtt_grid_reports_each_asked_device_as_training_uploading_accepted_rejected_or_gone(tmp_path):
    live = _mqtt_grid_in_round_5(tmp_path).live()
    assert live.states == {"a": "accepted", "b": "uploading", "c": "training", "d": "rejected: non_finite",
                           "e": "gone"}
    assert live.progress == {"c": 0.4}
    assert live.count("training") == live.count("uploading") == live.count("gone") == 1
    assert live.count("rejected: ") == 1 and live.trained() == 3  # a, b and d sent a result


def test_a_new_round_forgets_the_progress_reported_for_the_last_task(tmp_path):
    grid = _mqtt_grid_in_round_5(tmp_path)
    assert grid.progress["c"] == 0.4
    grid._pulls.clear()
    grid._send_task = lambda *args: None  # nothing is sent: only the round's bookkeeping is under test
    grid.exchange(6, [SimpleNamespace(device_id="c", programs=b"given")], deadline=time.time() - 1, quorum=1)
    assert "c" not in grid.progress


def test_the_page_and_metrics_show_the_state_totals_and_each_devices_state(tmp_path):
    grid = _mqtt_grid_in_round_5(tmp_path)
    state = DashboardState()
    state.begin({"rounds": 9})
    state.watch(FleetView, grid)
    tables = page_tables(pages.page(state.snapshot()))
    totals = {row[0]: row[1] for row in tables["round"]}
    assert totals["selected"] == "5: a, b, c, d, e"
    assert (totals["training"], totals["uploading"], totals["gone"]) == ("1", "1", "1")
    assert totals["trained"] == "3 (result in)" and totals["accepted"] == "1: a"
    assert totals["rejected"] == "1 (non_finite × 1)"
    assert tables["round-devices"][1:] == [["a", "accepted"], ["b", "uploading"], ["c", "training 40%"],
                                           ["d", "rejected: non_finite"], ["e", "gone"]]
    text = exposition(metrics_registry(state)).decode()
    gauges = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert gauges["fedsdk_devices_training"] == 1 and gauges["fedsdk_devices_uploading"] == 1
    assert gauges["fedsdk_round_open"] == 5


def test_without_an_open_round_no_device_counts_as_training_or_uploading():
    state = DashboardState()
    state.watch(FleetView, FixedRound(None))
    text = exposition(metrics_registry(state)).decode()
    gauges = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert gauges["fedsdk_devices_training"] == 0 and gauges["fedsdk_devices_uploading"] == 0


def test_the_inprocess_grid_reports_the_device_it_trains_and_those_still_waiting(monkeypatch):
    grid = InProcessGrid([LocalDevice(DeviceInfo(d, 4), np.zeros((4, 1)), np.zeros(4)) for d in "xyz"])
    seen: list[dict] = []

    def train(device, instruction, runtimes):
        seen.append(grid.live().states)
        value = np.nan if device.info.device_id == "y" else 1.0
        return ClientUpdate(device.info.device_id, 4, {"w": np.full(2, value, np.float32)}, {}, instruction)

    monkeypatch.setattr(inprocess_grid, "train_on_device", train)
    instructions = [SimpleNamespace(device_id=d, all_models=dict) for d in "xyz"]
    exchange = grid.exchange(1, instructions, time.time() + 60, quorum=3)
    assert seen == [{"x": "training", "y": "waiting", "z": "waiting"},
                    {"x": "accepted", "y": "training", "z": "waiting"},
                    {"x": "accepted", "y": "rejected: non_finite", "z": "training"}]
    assert exchange.rejections == {"non_finite": 1} and grid.live() is None


def test_the_fleet_row_carries_the_arch_and_why_the_device_has_its_tier(tmp_path):
    path = tmp_path / "registry.sqlite"
    registry = FleetRegistry(path)
    summary = "tier weak: ~40 MB of a 100 MB budget, ~3.0 s of local training per round"
    registry.register_paired("pi-1", "pi", "weak", {"arch": "aarch64"},
                             {"mode": "auto", "tier": "weak", "summary": summary}, "hash")
    registry.add_device("lab-1", tier="strong")
    registry.record_hello("lab-1", {"arch": "x86_64"}, ["torch"], 10)
    registry.add_device("free-1")
    rows = {d.device: d for d in registry_fleet(registry, path, NoDevices())().devices}
    assert (rows["pi-1"].arch, rows["pi-1"].tier, rows["pi-1"].tier_reason) == ("aarch64", "weak", summary)
    assert (rows["lab-1"].arch, rows["lab-1"].tier, rows["lab-1"].tier_reason) == ("x86_64", "strong",
                                                                                   "set by hand")
    assert (rows["free-1"].tier, rows["free-1"].tier_reason) == (None, "")
    simulated = registry_fleet(registry, path, NoDevices(), unexplained="--tiers")().devices
    assert {d.device: d.tier_reason for d in simulated}["lab-1"] == "--tiers"

    state = DashboardState()
    state.watch(registry_fleet(registry, path, NoDevices()), NoDevices())
    fleet = page_tables(pages.page(state.snapshot()))["fleet"]
    assert fleet[0][:4] == ["device", "arch", "tier", "why this tier"]
    assert ["pi-1", "aarch64", "weak", summary] in [row[:4] for row in fleet[1:]]
    registry.close()


def test_the_per_tier_chart_has_one_point_per_round_for_every_accuracy_part_key():
    rows = [{"round": r, "accuracy": 0.5 + r / 100, "accuracy_strong": 0.6 + r / 100, "accuracy_weak": 0.4,
             "personal_accuracy": 0.7, "personal_accuracy_lenet": 0.71, "loss": 1.0} for r in (1, 2, 3)]
    rows[1].pop("accuracy_weak")  # a key missing from a row has no point there
    html = pages.fragment(_snapshot(rows))
    parts = re.search(r'<figure id="parts-chart">(.*?)</figure>', html, re.S).group(1)
    found = re.findall(r"<title>([a-z_]+): [0-9.]+ at round (\d+)</title>", parts)
    expected = [(k, str(r)) for k in ("accuracy_strong", "personal_accuracy_lenet") for r in (1, 2, 3)]
    assert sorted(found) == sorted([*expected, ("accuracy_weak", "1"), ("accuracy_weak", "3")])
    for key in ("accuracy_strong", "accuracy_weak", "personal_accuracy_lenet"):
        assert f">{key}</text>" in parts  # the legend names every line
    main = re.search(r'<figure id="accuracy-chart">(.*?)</figure>', html, re.S).group(1)
    assert {k for k, _ in re.findall(r"<title>([a-z_]+): [0-9.]+ at round (\d+)</title>", main)} == {
        "accuracy", "personal_accuracy"}


def test_rows_without_per_tier_keys_get_no_per_tier_chart():
    html = pages.fragment(_snapshot([{"round": 1, "accuracy": 0.5, "loss": 1.0}]))
    assert 'id="parts-chart"' not in html and 'id="accuracy-chart"' in html


def _snapshot(rows: list[dict]):
    state = DashboardState()
    state.begin({"rounds": len(rows)}, rows)
    return state.snapshot()
