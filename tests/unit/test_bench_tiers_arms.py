"""bench/tiers.py's ``--arms``: only the named arms of a family run, in the family's order."""

from types import ModuleType

import pytest

from tests.bench_module import load_bench


def _load_bench() -> ModuleType:
    return load_bench("tiers")


def test_arms_keeps_only_the_named_controls_in_the_familys_order() -> None:
    bench = _load_bench()
    model, tiers, entries, extra = bench.selected("resource-skew", ["Alone (ExclusiveFL)", "AllSmall"])
    assert [label for label, _, _ in entries] == ["AllSmall", "Alone (ExclusiveFL)"]
    assert (model, extra["num_strong"], tiers[0]) == ("lenet5", 1, "strong")


def test_no_arms_keeps_every_arm_and_an_unknown_label_is_refused_with_the_known_ones() -> None:
    bench = _load_bench()
    assert bench.selected("conv", None)[2] == bench.FAMILIES["conv"][2]
    with pytest.raises(SystemExit, match="conv's arms are .*FedConv"):
        bench.selected("conv", ["FedKonv"])


def test_methods_replace_the_method_row_under_the_same_controls_and_another_family_is_refused() -> None:
    bench = _load_bench()
    entries = bench.selected("width", None, ["fedrolex", "feddm"])[2]
    assert [(label, method) for label, method, _ in entries] == [
        ("FedRolex", "fedrolex"), ("FedDM", "feddm"), ("AllSmall", "allsmall"), ("Alone", "alone")]
    kept = bench.selected("width", ["FedDM", "Alone"], ["fedrolex", "feddm"])[2]
    assert [label for label, _, _ in kept] == ["FedDM", "Alone"]
    with pytest.raises(SystemExit, match="depthfl: of family 'exit', not width's"):
        bench.selected("width", None, ["depthfl"])
    with pytest.raises(SystemExit, match="--methods: unknown method 'fedrolexx'"):
        bench.selected("width", None, ["fedrolexx"])


def test_a_holdout_run_reports_each_tier_on_the_devices_held_back_data_too(monkeypatch) -> None:
    from server_toolkit.sim.simulate import SimulationConfig

    bench = _load_bench()
    config = SimulationConfig(method="heterofl", tiers=["1.0", "0.5"], rounds=2, holdout=0.1)
    rows = [{"round": r, "accuracy": 0.5 + r / 10, "accuracy_tier_1.0": 0.5 + r / 10,
             "accuracy_tier_0.5": 0.4, "accuracy_holdout_tier_1.0": 0.3 + r / 10,
             "accuracy_holdout_tier_0.5": 0.2} for r in (1, 2)]
    monkeypatch.setattr(bench, "run_rows", lambda c, run_dir: rows if c is config else [])
    found = bench.tier_accuracies(config, None, last_k=2)
    assert found["holdout 1.0"] == pytest.approx(0.45) and found["holdout 0.5"] == pytest.approx(0.2)
    assert found["1.0"] == pytest.approx(0.65)
    without = SimulationConfig(method="heterofl", tiers=["1.0", "0.5"], rounds=2)
    monkeypatch.setattr(bench, "run_rows", lambda c, run_dir: rows)
    assert not any(k.startswith("holdout") for k in bench.tier_accuracies(without, None, last_k=2))
