"""The runs comparison page rendered by headless Chromium: built from a real simulated run (2 devices
x 3 rounds, embedded broker) and a hand-written two-seed series in the same setting, the screenshot
shows the chart's lines and bands, and the tables of the rendered DOM hold the metrics' numbers."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from fedcore.recipe import Recipe
from server_toolkit.cli.report import report
from server_toolkit.report.compare_html import PALETTE, format_stat, format_value
from server_toolkit.report.series import Stat
from server_toolkit.sim.simulate import Simulation, SimulationConfig
from tests.report_dom import page_tables, table_dict

pytestmark = pytest.mark.integration

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (the README's test command "
                    "does this)")
    return path


def _hand_written_series(runs: Path, config: dict) -> None:
    """Series "FedAvg-S" in the real run's setting: seeds 0 and 1, 3 rounds, with exit accuracies and
    a server stage's seconds."""
    accuracies = {0: [0.41, 0.55, 0.62], 1: [0.35, 0.60, 0.70]}
    for seed, values in accuracies.items():
        run_dir = runs / f"fedavg-s-seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps({**config, "label": "FedAvg-S", "seed": seed}))
        rows = [{"round": r, "accuracy": acc, "accuracy_exit1": acc - 0.1, "seconds": 0.5 + seed,
                 "server_aggregate_s": 0.01 * r, "bytes_down": 50_000 * r, "bytes_up": 40_000 * r}
                for r, acc in enumerate(values, start=1)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _stat(values: list[float]) -> Stat:
    return Stat(statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None, len(values))


def test_chromium_renders_the_report_of_a_real_run_with_its_numbers_and_a_drawn_chart(tmp_path):
    chromium = _chromium()
    runs = tmp_path / "runs"
    config = SimulationConfig(devices=2, rounds=3, seed=0, partition="iid", round_timeout_s=60,
                              recipe=Recipe(epochs=1, batch_size=32, lr=0.05, momentum=0.9).to_dict())
    Simulation(config, runs / "real-seed0").run()
    real_config = json.loads((runs / "real-seed0" / "config.json").read_text())
    _hand_written_series(runs, real_config)

    out = tmp_path / "report.html"
    result = CliRunner().invoke(report, [str(runs), "--out", str(out), "--last-k", "2"])
    assert result.exit_code == 0, result.output

    png = tmp_path / "page.png"
    shown = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}",
                            f"--screenshot={png}", "--window-size=1280,2000", "--dump-dom", out.as_uri()],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr[-2000:]

    # (b) the rendered DOM's tables hold the numbers of the metrics.jsonl files
    tables = page_tables(shown.stdout)
    real = _rows(runs / "real-seed0")
    hand = [_rows(runs / f"fedavg-s-seed{seed}") for seed in (0, 1)]
    accuracy = table_dict(tables["setting-1-accuracy"])
    assert set(accuracy) == {"fedavg", "FedAvg-S"}
    assert accuracy["fedavg"]["final accuracy"] == format_value("accuracy", real[-1]["accuracy"])
    assert accuracy["fedavg"]["mean of last 2 rounds"] == format_value(
        "accuracy", statistics.mean(row["accuracy"] for row in real[-2:]))
    assert accuracy["fedavg"]["runs (seeds)"] == "1 (0)" and accuracy["fedavg"]["rounds"] == "3"
    assert accuracy["FedAvg-S"]["final accuracy"] == format_stat(
        "accuracy", _stat([rows[-1]["accuracy"] for rows in hand]))
    assert accuracy["FedAvg-S"]["final accuracy"] == "0.6600 ± 0.0566"
    assert accuracy["FedAvg-S"]["runs (seeds)"] == "2 (0, 1)"

    cost = table_dict(tables["setting-1-cost"])
    totals = [0] + [row["bytes_down"] for row in real]  # cumulative: a round's bytes are the difference
    real_down = [after - before for before, after in zip(totals, totals[1:], strict=False)]
    assert cost["bytes_down"]["fedavg"] == format_value("bytes_down", statistics.mean(real_down))
    assert cost["bytes_down"]["FedAvg-S"] == "50.0 kB ± 0 B"
    assert cost["seconds"]["fedavg"] == format_value("seconds", statistics.mean(r["seconds"] for r in real))
    assert cost["server_aggregate_s"]["FedAvg-S"] == "0.020 s ± 0.000 s"
    assert cost["server_aggregate_s"]["fedavg"] == "–"
    parts = table_dict(tables["setting-1-parts"])
    assert parts["accuracy_exit1"]["FedAvg-S"] == format_stat(
        "accuracy", _stat([statistics.mean(r["accuracy_exit1"] for r in rows[-2:]) for rows in hand]))
    run_rows = table_dict(tables["setting-1-runs"])
    assert run_rows["real-seed0"]["final accuracy"] == format_value("accuracy", real[-1]["accuracy"])
    assert run_rows["fedavg-s-seed1"]["series"] == "FedAvg-S"
    assert [row[0] for row in tables["runs"][1:]] == [str(runs / name) for name in
                                                      ("fedavg-s-seed0", "fedavg-s-seed1", "real-seed0")]

    # (a) the screenshot is a drawn page: many colours, and both series' lines run across the chart
    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    assert pixels.shape == (2000, 1280, 3)
    not_white = np.any(pixels < 245, axis=2)
    assert not_white.mean() > 0.03
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 200
    for colour in PALETTE[:2]:  # "FedAvg-S" (its run dirs sort first), then "fedavg"
        rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
        line = np.all(np.abs(pixels - rgb) <= 12, axis=2)
        ys, xs = np.nonzero(line)
        assert len(xs) > 300, f"{colour}: {len(xs)} pixels"
        assert xs.max() - xs.min() > 500, f"{colour} spans x {xs.min()}..{xs.max()}"  # not just swatches
    band_rgb = np.array([255 - 0.18 * (255 - int(PALETTE[0][i:i + 2], 16)) for i in (1, 3, 5)])
    assert np.all(np.abs(pixels - band_rgb) <= 6, axis=2).sum() > 2000  # FedAvg-S's ± std band
