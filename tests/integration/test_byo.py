"""Bring your own, through ``simulate`` as a user runs it: a model (an ``nn.Module`` with a
residual block, in a file) and a data loader federated with HeteroFL by real device
processes over the embedded broker; a method another package registers by entry point;
a project made by ``fedsdk-server new``; a config file equal to the same flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USER_MODEL = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return x + torch.relu(self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self, channels, classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = Block(16)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        x = self.pool(self.block(self.stem(x)))
        return self.head(torch.flatten(x, 1))


def build(input_shape, num_classes):
    return Net(input_shape[0], num_classes)
'''

USER_DATA = '''
import numpy as np
from sklearn.datasets import load_digits


def load():
    digits = load_digits()
    x, y = (digits.images / 16.0).astype(np.float32), digits.target
    order = np.random.default_rng(1).permutation(len(y))
    x, y = x[order], y[order]
    return x[:1400], y[:1400], x[1400:], y[1400:]
'''

PLUGIN = '''
from server_toolkit.methods.fedavg import FedAvg


class PlainAverage(FedAvg):
    """FedAvg under another name, as a package outside fedsdk would ship a method."""

    name = "plain-average"
    family = "plugin"
'''


def fedsdk_server(args: list[str], cwd: Path, extra_path: str = "") -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(ROOT), extra_path) if p)
    done = subprocess.run([sys.executable, "-m", "server_toolkit.cli", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_user_module_and_data_loader_federate_with_heterofl_over_mqtt(tmp_path):
    (tmp_path / "model.py").write_text(USER_MODEL)
    (tmp_path / "data.py").write_text(USER_DATA)
    fedsdk_server(["simulate", "--model", "model.py:build", "--dataset", "data.py:load",
                   "--method", "heterofl", "--tiers", "1.0,0.5", "--devices", "2", "--rounds", "3",
                   "--local-epochs", "1", "--partition", "iid", "--run-dir", "run"], cwd=tmp_path)
    run = rows(tmp_path / "run")
    assert [r["round"] for r in run] == [1, 2, 3] and all(r["accepted"] == 2 for r in run)
    assert run[-1]["accuracy"] > 0.5  # chance: 0.1
    # what the devices were sent is the traced spec (JSON, with the residual block), not the user's code
    sent = [p.read_bytes() for p in (tmp_path / "run" / "blobs").rglob("*") if p.is_file()]
    assert any(b'"residual"' in blob for blob in sent)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"] == "model.py:build"


def test_a_method_registered_by_entry_point_runs_in_simulate(tmp_path):
    site = tmp_path / "site"
    (site / "fedsdk_plugin_demo").mkdir(parents=True)
    (site / "fedsdk_plugin_demo" / "__init__.py").write_text(PLUGIN)
    info = site / "fedsdk_plugin_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedsdk-plugin-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedsdk.methods]\n"
                                           "plain-average = fedsdk_plugin_demo:PlainAverage\n")
    listed = fedsdk_server(["methods", "list"], cwd=tmp_path, extra_path=str(site))
    assert "plain-average" in listed.stdout
    fedsdk_server(["simulate", "--method", "plain-average", "--grid", "inprocess", "--devices", "3",
                   "--rounds", "3", "--local-epochs", "2", "--partition", "iid", "--run-dir", "run"],
                  cwd=tmp_path, extra_path=str(site))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["method"] == "plain-average" and summary["final_accuracy"] > 0.3  # chance: 0.1


def test_a_new_project_runs_with_simulate_as_generated(tmp_path):
    fedsdk_server(["new", "proj"], cwd=tmp_path)
    assert sorted(p.name for p in (tmp_path / "proj").iterdir()) == ["README.md", "data.py", "fedsdk.toml",
                                                                      "model.py"]
    fedsdk_server(["simulate"], cwd=tmp_path / "proj")
    (run_dir,) = (tmp_path / "proj" / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "heterofl" and summary["status"] == "finished"
    assert summary["final_accuracy"] > 0.5


def test_a_config_file_run_equals_the_same_run_given_by_flags(tmp_path):
    flags = ["--grid", "inprocess", "--devices", "3", "--rounds", "2", "--local-epochs", "1",
             "--partition", "dirichlet", "--alpha", "1.0", "--seed", "3", "--method", "fedprox",
             "--method-option", "mu=0.01", "--tiers", "1,2,3"]
    (tmp_path / "by_file").mkdir()
    (tmp_path / "by_file" / "fedsdk.toml").write_text(textwrap.dedent('''
        [simulate]
        grid = "inprocess"
        devices = 3
        rounds = 2
        local_epochs = 1
        partition = "dirichlet"
        alpha = 1.0
        seed = 3
        method = "fedprox"
        method-option = {mu = 0.01}
        tiers = [1, 2, 3]
    '''))
    fedsdk_server(["simulate", "--run-dir", "run"], cwd=tmp_path / "by_file")
    (tmp_path / "by_flags").mkdir()
    fedsdk_server(["simulate", *flags, "--run-dir", "run"], cwd=tmp_path / "by_flags")
    by_file, by_flags = (json.loads((tmp_path / d / "run" / "config.json").read_text())
                         for d in ("by_file", "by_flags"))
    assert by_file == by_flags and by_file["method_options"] == {"mu": 0.01} and by_file["seed"] == 3
    keep = ("round", "accuracy", "loss", "accepted")
    assert [{k: r[k] for k in keep} for r in rows(tmp_path / "by_file" / "run")] == \
        [{k: r[k] for k in keep} for r in rows(tmp_path / "by_flags" / "run")]
