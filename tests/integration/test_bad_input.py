"""Bad input to ``fedsdk-server``: every case exits non-zero at once (before any broker or
device starts), with one line on stderr and no traceback, and leaves no run directory.

The cases are the ones a newcomer hit (issue 19). Most run through the CLI's entry point in
this process (click's test runner: the same ``OneLineGroup.main``, its exit code and stderr; an
exception escaping it fails the test, as a traceback would): a fresh interpreter per case cost
2.5 s of CPU (5-6 s with the method registry's torch import) and showed nothing more than
the representatives of ``IN_A_PROCESS``, which run as real ``python -m server_toolkit.cli``
processes: a plain option check, a check that imports the method registry (torch), one that
imports a user's model file and one that probes a socket that is not a broker. Every case's
time bound is 5 s on a quiet machine (a wait for a broker or devices takes 30 s and more),
stretched by how many times slower a bare ``import torch`` is here than there (1.3 s on a
quiet 2-core machine): the CLI's own start-up and the 1.5 s broker probe slow down alike on a
busy machine (they failed at 3.6 s there, on the old code as well)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from server_toolkit.broker.mosquitto import free_port
from server_toolkit.broker.mosquitto_auth import MosquittoAuthFiles
from server_toolkit.rounds.checkpoint import save_checkpoint
from server_toolkit.sim.simulate import SimulationConfig

ROOT = Path(__file__).resolve().parents[2]
QUIET_TORCH_IMPORT_S = 1.3
# The cases run as real processes (the others through the entry point in this process).
IN_A_PROCESS = {"devices 0", "unknown method", "user model with an unsupported layer",
                "simulate broker not mqtt"}


def fedsdk_server(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "server_toolkit.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    return done, time.monotonic() - start


def fedsdk_server_here(args: list[str], cwd: Path, monkeypatch) -> tuple[subprocess.CompletedProcess, float]:
    """``fedsdk_server`` through the entry point in this process (``cwd`` as the working
    directory); an exception that escapes ``main`` propagates (the test fails)."""
    from click.testing import CliRunner

    from server_toolkit.cli import main

    monkeypatch.chdir(cwd)
    start = time.monotonic()
    result = CliRunner().invoke(main, args, prog_name="fedsdk-server", catch_exceptions=False)
    seconds = time.monotonic() - start
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr), seconds


@pytest.fixture(scope="module")
def torch_slowdown() -> float:
    """How many times slower a bare ``import torch`` is here than on a quiet machine (>= 1)."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return max(1.0, (time.monotonic() - start) / QUIET_TORCH_IMPORT_S)


@pytest.fixture(scope="module")
def not_mqtt_port():
    """A loopback port held by a listener that accepts and never answers (not an MQTT broker)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    def accept_forever() -> None:
        while True:
            held.append(server.accept()[0])

    threading.Thread(target=accept_forever, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Damaged inputs: a text file, an npz without labels, runs with a truncated checkpoint,
    a corrupt state.json, no config.json; a non-empty directory."""
    root = tmp_path_factory.mktemp("bad")
    (root / "notes.txt").write_text("not an npz\n")
    (root / "gelu_model.py").write_text("from torch import nn\n\n\ndef build():\n    return nn.Sequential("
                                        "nn.Flatten(), nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 10))\n")
    (root / "no_loader.py").write_text("def something_else():\n    return None\n")
    (root / "three_arrays.py").write_text(
        "import numpy as np\n\n\ndef load():\n    return np.zeros((4, 8, 8)), np.zeros(4), np.ones(2)\n")
    np.savez(root / "no_y.npz", x=np.zeros((4, 1, 8, 8), np.float32))
    (root / "empty_data").mkdir()
    MosquittoAuthFiles.create(root / "security", "f", listener={"host": "127.0.0.1", "port": free_port()})
    (root / "bad_config.toml").write_text("[simulate]\nround = 3\n")
    (root / "full").mkdir()
    (root / "full" / "something").write_text("x")
    for name in ("truncated", "bad_state", "good", "no_config"):
        run = root / name
        run.mkdir()
        if name != "no_config":
            (run / "config.json").write_text(SimulationConfig(rounds=3).to_json())
        path = save_checkpoint(run, 2, {"w": np.ones((64, 64), np.float32)}, {})
        if name == "truncated":
            path.write_bytes(path.read_bytes()[:1000])
        if name == "bad_state":
            (run / "state.json").write_text('{"round": 2, "checkpoint": "x\x01')
    return {p.stem: p for p in root.iterdir()}


RUN = ["run", "--fleet", "f", "--run-dir", "{tmp}/rd"]
# (case id, arguments, words the error must contain, needs the method registry)
CASES = [
    ("devices 0", ["simulate", "--devices", "0"], "--devices must be >= 1", False),
    ("rounds -1", ["simulate", "--rounds", "-1"], "--rounds must be >= 1", False),
    ("rounds 0 in run", [*RUN, "--rounds", "0"], "--rounds", False),
    ("fraction above 1", ["simulate", "--fraction", "1.5"], "--fraction", False),
    ("clients per round 0", ["simulate", "--clients-per-round", "0"], "--clients-per-round", False),
    ("lr 0", ["simulate", "--lr", "0"], "--lr must be > 0", False),
    ("max steps -1", ["simulate", "--max-steps", "-1"], "--max-steps must be >= 0", False),
    ("negative round timeout", ["simulate", "--round-timeout", "-5"], "--round-timeout", False),
    ("empty tier name", ["simulate", "--tiers", "1.0,,0.5"], "empty tier name", False),
    ("method option without =", ["simulate", "--method-option", "mu"], "KEY=VALUE", False),
    ("edges in process", ["simulate", "--edges", "2", "--grid", "inprocess"], "--grid mqtt", False),
    ("unknown partition", ["simulate", "--partition", "zipf"], "zipf", False),
    ("non-empty run dir", ["simulate", "--run-dir", "{full}"], "not empty", False),
    ("run dir and resume", ["simulate", "--run-dir", "{tmp}/new", "--resume", "{good}"], "not both", False),
    ("simulate broker down", ["simulate", "--broker", "mqtt://127.0.0.1:{free}"], "nothing listens", False),
    ("simulate broker not mqtt", ["simulate", "--broker", "mqtt://127.0.0.1:{notmqtt}"],
     "not answer as an MQTT", False),
    ("broker url scheme", ["simulate", "--broker", "http://127.0.0.1:1883"], "mqtt://host:port", False),
    ("run broker down", [*RUN, "--broker", "mqtt://127.0.0.1:{free}"],
     "nothing listens", False),
    ("run broker not mqtt", [*RUN, "--broker",
                             "mqtt://127.0.0.1:{notmqtt}"], "not answer as an MQTT", False),
    ("run embedded port busy", [*RUN, "--port", "{notmqtt}"], "in use",
     False),
    ("broker port busy", ["broker", "--port", "{notmqtt}"], "in use", False),
    ("run with the broker of a security dir down", [*RUN, "--security-dir", "{security}"], "is down", False),
    ("npz given a text file", ["simulate", "--dataset", "npz:{notes}"], "not an npz file", False),
    ("npz missing", ["simulate", "--dataset", "npz:{tmp}/nothing.npz"], "no such file", False),
    ("npz without labels", ["simulate", "--dataset", "npz:{no_y}"], "no array(s) y", False),
    ("unknown dataset", ["simulate", "--dataset", "cifar"], "unknown --dataset", False),
    ("dataset misspelt", ["simulate", "--dataset", "fasion-mnist"], "did you mean fashion_mnist", False),
    ("mnist not on disk", ["simulate", "--dataset", "mnist", "--data-dir", "{empty_data}"],
     "datasets fetch", False),
    ("resume truncated checkpoint", ["simulate", "--resume", "{truncated}"], "truncated", False),
    ("resume corrupt state", ["simulate", "--resume", "{bad_state}"], "state.json is damaged", False),
    ("resume without config", ["simulate", "--resume", "{no_config}"], "config.json is missing", False),
    ("resume conflicting flags", ["simulate", "--resume", "{good}", "--method", "heterofl", "--devices", "2"],
     "keeps its stored configuration", False),
    ("run resume corrupt state", ["run", "--fleet", "f", "--run-dir", "{bad_state}", "--resume"],
     "state.json is damaged", False),
    ("unknown method", ["simulate", "--method", "fedavgg"], "did you mean fedavg, fedavgm or fedavg-groups?",
     True),
    ("method misspelt", ["simulate", "--method", "hetrofl"], "'hetrofl' (did you mean heterofl?); one of: ",
     True),
    ("run unknown method", [*RUN, "--method", "fedavgg"], "fedavgg",
     True),
    ("tier not a ratio", ["simulate", "--method", "heterofl", "--tiers", "1.0,abc"],
     "'abc' is not one", True),
    ("tiers that do not fit", ["simulate", "--method", "heterofl", "--tiers", "1,2,3"],
     "'2' is not one", True),
    ("exit tier not a count",
     ["simulate", "--method", "depthfl", "--model", "vgg_multi_exit", "--tiers", "a"], "exit count", True),
    ("width tiers for an exit method",
     ["simulate", "--method", "hypemefed", "--model", "vgg_multi_exit", "--tiers", "1.0,0.5"],
     "hypemefed reads a tier as an exit count 1..3; '1.0' is not one", True),
    ("exit tier deeper than the model",
     ["simulate", "--method", "depthfl", "--model", "vgg_multi_exit", "--tiers", "1,4"], "'4' is not one",
     True),
    ("tier_map tier not a ratio",
     ["simulate", "--method", "heterofl", "--method-option", 'tier_map={{"dev001":"big"}}'],
     "tier_map['dev001']: heterofl reads a tier as a width ratio", True),
    ("architecture tier misspelt", ["simulate", "--method", "pfedhn", "--tiers", "small_cnn,lenett"],
     "did you mean lenet or lenet5?", True),
    ("unknown method option", ["simulate", "--method-option", "foo=1"], "no option 'foo'", True),
    ("method option of the wrong type", ["simulate", "--method", "fedprox", "--method-option", "mu=abc"],
     "expected float", True),
    ("unknown model", ["simulate", "--model", "resnet99"], "unknown --model", True),
    ("model misspelt", ["simulate", "--model", "vgg_multiexit"], "did you mean vgg_multi_exit", True),
    ("user model with an unsupported layer", ["simulate", "--model", "{gelu_model}:build"],
     "layer GELU", True),
    ("user model file missing", ["simulate", "--model", "{tmp}/nothing.py:build"], "no such file", True),
    ("user data loader missing", ["simulate", "--dataset", "{no_loader}:load"], "no function 'load'", False),
    ("user data loader breaking the contract", ["simulate", "--dataset", "{three_arrays}:load"],
     "must return (x_train, y_train, x_test, y_test)", False),
    ("config file with an unknown key", ["simulate", "--config", "{bad_config}"], "no option 'round'", False),
]
assert IN_A_PROCESS <= {c[0] for c in CASES}


@pytest.mark.parametrize(("case", "args", "words", "registry"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_at_once_in_one_line_and_leaves_no_run_directory(
        case, args, words, registry, files, not_mqtt_port, torch_slowdown, tmp_path, monkeypatch):
    names = {**{k: str(v) for k, v in files.items()}, "tmp": str(tmp_path), "free": str(free_port()),
             "notmqtt": str(not_mqtt_port)}
    args = [a.format(**names) for a in args]
    if case in IN_A_PROCESS:
        done, seconds = fedsdk_server(args, cwd=tmp_path)
    else:
        done, seconds = fedsdk_server_here(args, tmp_path, monkeypatch)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0, done.stdout
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert words in lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    assert "broker:" not in done.stdout  # nothing started
    assert not any((tmp_path / name).exists() for name in ("runs", "rd", "new"))
    # "at once": seconds, not a timeout's wait; every case scaled by how slow this machine is now
    # (a bare torch import as the yardstick: the CLI's own start-up slows down alike)
    assert seconds < 5.0 * torch_slowdown, f"took {seconds:.1f} s (machine {torch_slowdown:.1f}x slow)"


def test_resume_of_a_damaged_run_leaves_its_files_as_they_were(files, tmp_path, monkeypatch):
    before = {p: p.read_bytes() for p in files["truncated"].rglob("*") if p.is_file()}
    fedsdk_server_here(["simulate", "--resume", str(files["truncated"])], tmp_path, monkeypatch)
    assert {p: p.read_bytes() for p in files["truncated"].rglob("*") if p.is_file()} == before


def test_tiers_given_to_a_method_that_ignores_them_are_a_warning(capsys):
    from server_toolkit.cli.tier_checks import check_tiers
    from server_toolkit.methods import method_class

    fedavg = method_class("fedavg")
    check_tiers(fedavg, fedavg.Options.parse("fedavg", {}), ["1", "2", "3"], edges=False)
    assert "--tiers ignored: fedavg" in capsys.readouterr().err
    check_tiers(fedavg, fedavg.Options.parse("fedavg", {}), ["1", "2"], edges=True)  # edges group by tier
    assert capsys.readouterr().err == ""


def test_a_second_secured_mosquitto_refuses_and_keeps_the_running_ones_pid_file(secured_mosquitto, tmp_path):
    directory = secured_mosquitto.security.directory
    pid_file = directory / "mosquitto.pid"
    deadline = time.monotonic() + 5
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = pid_file.read_text()
    done, seconds = fedsdk_server(["broker", "--mosquitto", "--security-dir", str(directory)], cwd=tmp_path)
    assert done.returncode == 1 and f"already serves {directory}" in done.stderr
    assert pid_file.read_text() == pid
    secured_mosquitto.security.grant_device("dev-after", "pw-after-1234")  # reloads it through the pid file
    assert "dev-after" in secured_mosquitto.security.devices()
    assert json.loads((directory / "security.json").read_text())["fleet"] == "sec"
