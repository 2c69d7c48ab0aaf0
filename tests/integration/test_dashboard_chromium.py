"""The live dashboard of a real ``fedsdk-server simulate`` (2 device processes over MQTT, 3 rounds),
bound off loopback (0.0.0.0, so a token is generated and printed once): headless Chromium renders
its page, ``/metrics`` agrees with the registry, and the run's TensorBoard and MLflow logs hold the
accuracies of metrics.jsonl."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_report_chromium import CHROMIUM_FLAGS, _chromium
from tests.report_dom import page_tables

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 3


def _machine_address() -> str:
    """This machine's non-loopback IPv4 address (no packet is sent), else 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The simulate process, once its 3 rounds are done (its dashboard held up until the module ends)."""
    tmp = tmp_path_factory.mktemp("dashboard")
    run_dir = tmp / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("FEDSDK_DASHBOARD_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "server_toolkit.cli", "simulate", "--devices", "2", "--rounds", str(ROUNDS),
         "--partition", "iid", "--local-epochs", "1", "--batch-size", "32", "--run-dir", str(run_dir),
         "--dashboard", "0.0.0.0:0", "--dashboard-hold", "600",
         "--log-to", f"tensorboard:{tmp / 'tb'}", "--log-to", f"mlflow:file:{tmp / 'mlruns'}"],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    port = token = None
    try:
        for line in proc.stdout:
            output.append(line)
            if found := re.search(r"dashboard: http://[^:]+:(\d+)/", line):
                port = int(found.group(1))
            if found := re.search(r"dashboard token \(shown once\): (\S+);", line):
                token = found.group(1)
            if port and token:
                break
        assert port and token, "".join(output)
        threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True).start()  # keep the pipe open
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            status, body = _get(f"http://127.0.0.1:{port}/api/state", token)
            assert status == 200, body + "".join(output)
            if json.loads(body)["status"] in ("finished", "stopped", "failed"):
                break
            assert proc.poll() is None, "".join(output)
            time.sleep(1)
        state = json.loads(_get(f"http://127.0.0.1:{port}/api/state", token)[1])
        assert state["status"] == "finished", state["status"]
        yield {"port": port, "token": token, "run_dir": run_dir, "tmp": tmp, "state": state}
    finally:
        proc.send_signal(signal.SIGINT)  # ends the --dashboard-hold wait
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_chromium_shows_every_device_in_the_fleet_table_and_one_accuracy_point_per_round(run, tmp_path):
    chromium = _chromium()
    png = tmp_path / "dashboard.png"
    url = f"http://127.0.0.1:{run['port']}/?token={run['token']}"
    shown = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}",
                            f"--screenshot={png}", "--window-size=1280,1600", "--dump-dom", url],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr[-2000:]
    fleet = page_tables(shown.stdout)["fleet"]
    assert fleet[0][:7] == ["device", "arch", "tier", "why this tier", "runtime", "last seen", "online"]
    assert [row[0] for row in fleet[1:]] == ["dev000", "dev001"]
    assert all(row[1] == platform.machine() for row in fleet[1:])  # from each device's hello profile
    assert all(row[6] == "offline" for row in fleet[1:])  # the run is over: it serves no device
    accepted = {row[0]: int(row[7]) for row in fleet[1:]}
    assert sum(accepted.values()) == sum(r["accepted"] for r in _rows(run["run_dir"]))

    chart = re.search(r'<figure id="accuracy-chart">(.*?)</figure>', shown.stdout, re.S).group(1)
    points = re.findall(r"<circle[^>]*><title>accuracy: ([0-9.]+) at round (\d+)</title>", chart)
    rows = _rows(run["run_dir"])
    assert [int(r) for _, r in points] == [row["round"] for row in rows] == list(range(1, ROUNDS + 1))
    assert [float(v) for v, _ in points] == pytest.approx([row["accuracy"] for row in rows], abs=1e-4)
    assert f"{ROUNDS}</span> of {ROUNDS} rounds done" in shown.stdout

    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    assert np.any(pixels < 245, axis=2).mean() > 0.02  # not a blank page
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50


def test_off_loopback_every_route_answers_401_without_the_token_and_200_with_it(run):
    base = f"http://{_machine_address()}:{run['port']}"
    for path in ("/", "/fragment", "/api/state", "/metrics"):
        assert _get(base + path)[0] == 401, path
        assert _get(base + path, "wrong-token")[0] == 401, path
        assert _get(base + path, run["token"])[0] == 200, path
    assert _get(f"{base}/?token={run['token']}")[0] == 200


def test_metrics_parse_and_their_counters_match_the_registry_and_the_rows(run):
    status, text = _get(f"http://127.0.0.1:{run['port']}/metrics", run["token"])
    assert status == 200
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}
    db = sqlite3.connect(run["run_dir"] / "registry.sqlite")
    updates = db.execute("SELECT COUNT(*) FROM updates").fetchone()[0]
    devices = db.execute("SELECT COUNT(*) FROM devices").fetchone()[0]
    db.close()
    rows = _rows(run["run_dir"])
    assert updates > 0
    assert samples["fedsdk_updates_accepted_total"].value == updates
    assert samples["fedsdk_rounds_completed_total"].value == len(rows) == ROUNDS
    assert samples["fedsdk_devices_registered"].value == devices == 2
    assert samples["fedsdk_devices_online"].value == 0  # after the run
    assert samples["fedsdk_round_duration_seconds_count"].value == ROUNDS
    seconds = sum(r["seconds"] for r in rows)
    assert samples["fedsdk_round_duration_seconds_sum"].value == pytest.approx(seconds)
    assert samples["fedsdk_bytes_sent_total"].value == rows[-1]["bytes_down"] > 0
    assert samples["fedsdk_bytes_received_total"].value == rows[-1]["bytes_up"] > 0
    assert samples["fedsdk_accuracy"].value == pytest.approx(rows[-1]["accuracy"])
    assert samples["fedsdk_server_resident_memory_bytes"].value > 10e6


def test_tensorboard_and_mlflow_hold_the_accuracies_and_config_of_metrics_jsonl(run):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = _rows(run["run_dir"])
    events = EventAccumulator(str(run["tmp"] / "tb" / "run"))
    events.Reload()
    scalars = events.Scalars("accuracy")
    assert [e.step for e in scalars] == [r["round"] for r in rows]
    assert [e.value for e in scalars] == pytest.approx([r["accuracy"] for r in rows], rel=1e-6)  # float32
    assert {"loss", "bytes_down", "time_aggregate_s"} <= set(events.Tags()["scalars"])

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file:{run['tmp'] / 'mlruns'}")
    (found,) = client.search_runs([client.get_experiment_by_name("fedsdk").experiment_id])
    history = sorted(client.get_metric_history(found.info.run_id, "accuracy"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(r["round"], r["accuracy"]) for r in rows]
    assert found.data.params["method"] == "fedavg" and found.data.params["rounds"] == str(ROUNDS)
    assert found.data.params["recipe.epochs"] == "1"
    assert found.info.status == "FINISHED"
