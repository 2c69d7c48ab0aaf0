"""The report draws final accuracy against epsilon for runs that used differential privacy."""

from __future__ import annotations

from pathlib import Path

from server_toolkit.report.compare_html import build_page
from server_toolkit.report.runs import Run


def _run(name: str, method: str, eps: float | None, accuracy: float, noise: float) -> Run:
    config = {"method": method, "label": f"{method} {eps}", "setting": "privacy", "seed": 0,
              "privacy": {"clip": 1.0, "noise_multiplier": noise}}
    rows = [{"round": 1, "accuracy": accuracy / 2, "dp_epsilon": None if eps is None else eps / 2},
            {"round": 2, "accuracy": accuracy, "dp_epsilon": eps}]
    return Run(Path(name), rows, config)


def test_runs_with_dp_get_an_accuracy_vs_epsilon_chart_and_others_do_not():
    runs = [_run("a", "fedavg", 1.0, 0.6, 1.3), _run("b", "fedavg", 8.0, 0.7, 0.5),
            _run("c", "fedavg", None, 0.75, 0.0), _run("d", "heterofl", 1.0, 0.55, 1.3)]
    page = build_page(runs)
    assert "final accuracy vs epsilon" in page
    assert "fedavg 1.0: epsilon 1, " in page and "fedavg None: epsilon inf" in page
    plain = [Run(Path("e"), [{"round": 1, "accuracy": 0.5}], {"method": "fedavg", "seed": 0})]
    assert "final accuracy vs epsilon" not in build_page(plain)
