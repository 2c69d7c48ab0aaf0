"""bench/fedconv_stages.py: a FedConv run's tiers right after compression and after device
training, read back from a real (tiny, digits) run; one-line errors on a wrong directory."""

import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from server_toolkit.sim.simulate import Simulation, SimulationConfig
from tests.bench_module import load_bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fedconv_stages.py"


def _load_bench() -> ModuleType:
    return load_bench("fedconv_stages")


def _main(bench: ModuleType, monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["fedconv_stages.py", *args])
    bench.main()


def test_the_compressed_tier_is_the_model_the_run_evaluated(tmp_path, monkeypatch, capsys, one_torch_thread):
    options = {"pretrain_epochs": 1, "compress_epochs": 2, "dilate_epochs": 1, "aggregate_epochs": 1}
    config = SimulationConfig(method="fedconv", dataset="digits", model="small_cnn", devices=4, rounds=2,
                              alpha=0.5, seed=0, tiers=["1.0", "0.5"], method_options=options,
                              grid="inprocess")
    row = Simulation(config, tmp_path / "run").run().rows[-1]
    bench = _load_bench()
    _main(bench, monkeypatch, "--run-dir", str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "global_r0002" in out and f"global (tier 1.0) {row['accuracy']:.3f}" in out
    found = re.search(r"tier 0\.5 \(2 devices\): block ([\d.]+), compressed ([\d.]+), "
                      r"block trained ([\d.]+), compressed trained ([\d.]+)", out)
    assert found, out
    assert float(found.group(2)) == pytest.approx(row["accuracy_tier_0.5"], abs=1e-3)
    assert all(0.0 <= float(v) <= 1.0 for v in found.groups())


def test_a_directory_that_is_no_fedconv_run_is_one_line(tmp_path, monkeypatch):
    bench = _load_bench()
    with pytest.raises(SystemExit, match="no config.json"):
        _main(bench, monkeypatch, "--run-dir", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"method": "fedavg"}))
    with pytest.raises(SystemExit, match="a fedavg run, not fedconv"):
        _main(bench, monkeypatch, "--run-dir", str(tmp_path))


def test_the_profile_bench_rejects_an_option_that_is_not_json(monkeypatch):
    module = load_bench("profile_fedconv")
    monkeypatch.setattr(sys, "argv", ["profile_fedconv.py", "--method-option", "compress_epochs=five"])
    with pytest.raises(SystemExit, match="expected KEY=JSON"):
        module.main()
