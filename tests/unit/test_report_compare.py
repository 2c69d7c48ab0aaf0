"""Unit tests of the runs comparison page (server_toolkit.report.runs/series/svg/compare_html and
``fedsdk-server report``): grouping, statistics over seeds, per-round costs, odd inputs, errors."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from server_toolkit.cli.report import report
from server_toolkit.report.compare_html import build_page, format_stat, format_value
from server_toolkit.report.runs import ReportInputError, find_run_dirs, load_runs, series_label
from server_toolkit.report.series import Stat, group_runs, points
from server_toolkit.report.svg import tick_labels, ticks
from tests.report_dom import page_tables, table_dict

BASE_CONFIG = {"method": "fedavg", "dataset": "digits", "model": "small_cnn", "partition": "dirichlet",
               "alpha": 0.5, "classes_per_client": 2, "devices": 3, "rounds": 4, "seed": 0,
               "tiers": None, "method_options": {}, "fleet": "sim-x", "recipe": {"lr": 0.05, "seed": 0}}


def write_run(root: Path, name: str, rows: list[dict], config: dict | None = BASE_CONFIG, **changes) -> Path:
    """A run directory with ``rows`` as metrics.jsonl and ``config | changes`` as config.json (none
    when ``config`` is None)."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if config is not None:
        (run_dir / "config.json").write_text(json.dumps({**config, **changes}))
    return run_dir


def accuracy_rows(rng: random.Random, rounds: int, **extra_keys) -> list[dict]:
    """Rows like a simulation's, with random accuracies and cumulative byte counters."""
    rows, down, up = [], 0, 0
    for round_no in range(1, rounds + 1):
        down, up = down + rng.randint(1000, 2000), up + rng.randint(900, 1100)
        rows.append({"round": round_no, "accuracy": rng.uniform(0.3, 0.9), "loss": rng.uniform(0.1, 2),
                     "seconds": rng.uniform(0.2, 3), "bytes_down": down, "bytes_up": up,
                     **{key: rng.uniform(0, 1) for key in extra_keys}})
    return rows


def make_page(tmp_path: Path, *paths: Path, last_k: int = 5) -> tuple[str, dict[str, list[list[str]]]]:
    out = tmp_path / "report.html"
    result = CliRunner().invoke(report, [*map(str, paths), "--out", str(out), "--last-k", str(last_k)])
    assert result.exit_code == 0, result.output
    html = out.read_text(encoding="utf-8")
    return html, page_tables(html)


def test_runs_with_one_label_form_one_series_whose_seeds_are_its_replicates(tmp_path):
    rng = random.Random(1)
    for seed in (0, 1, 2):
        write_run(tmp_path, f"s{seed}", accuracy_rows(rng, 3), label="FedAvg-S", seed=seed)
    write_run(tmp_path, "h0", accuracy_rows(rng, 3), label="HypeMeFed", method="hypemefed")
    write_run(tmp_path, "h1", accuracy_rows(rng, 3), label="HypeMeFed", method="hypemefed", seed=1)

    settings = group_runs(load_runs([tmp_path]))

    assert [s.label for s in settings] == ["digits · dirichlet α=0.5 · small_cnn"]
    assert [(series.label, series.seeds) for series in settings[0].series] == [
        ("HypeMeFed", [0, 1]), ("FedAvg-S", [0, 1, 2])]  # order of the first run (h0 sorts first)


def test_without_a_label_a_series_is_the_method_with_its_tiers_and_options():
    config = {**BASE_CONFIG, "method": "heterofl", "tiers": ["1.0", "0.5"],
              "method_options": {"small_model": "width:0.3", "epochs": 2}}
    assert series_label(config, Path("r")) == "heterofl tiers=1.0,0.5 epochs=2 small_model=width:0.3"
    assert series_label(BASE_CONFIG, Path("r")) == "fedavg"
    assert series_label({**BASE_CONFIG, "label": "FedAvg-L"}, Path("r")) == "FedAvg-L"
    assert series_label(None, Path("runs/20261123-1")) == "20261123-1 (no config.json)"


def test_settings_split_by_dataset_partition_alpha_and_model_unless_the_config_names_one(tmp_path):
    rows = accuracy_rows(random.Random(2), 2)
    write_run(tmp_path, "a", rows)
    write_run(tmp_path, "b", rows, seed=1)  # same setting as a: a replicate
    write_run(tmp_path, "c", rows, alpha=0.1)
    write_run(tmp_path, "d", rows, partition="k-classes", classes_per_client=3)
    write_run(tmp_path, "e", rows, model="lenet5")
    write_run(tmp_path, "f", rows, setting="CIFAR-10 α=0.1", model="resnet")
    write_run(tmp_path, "g", rows, setting="CIFAR-10 α=0.1", dataset="other")

    settings = group_runs(load_runs([tmp_path]))

    assert [(s.label, [run.name for run in s.runs]) for s in settings] == [
        ("digits · dirichlet α=0.5 · small_cnn", ["a", "b"]),
        ("digits · dirichlet α=0.1 · small_cnn", ["c"]),
        ("digits · k-classes 3 classes/client · small_cnn", ["d"]),
        ("digits · dirichlet α=0.5 · lenet5", ["e"]),
        ("CIFAR-10 α=0.1", ["f", "g"]),
    ]


def test_final_and_last_k_accuracy_are_mean_and_sample_std_over_seeds_of_the_rows(tmp_path):
    rng = random.Random(3)
    written = {seed: accuracy_rows(rng, 7) for seed in (0, 1, 2)}
    for seed, rows in written.items():
        write_run(tmp_path, f"run{seed}", rows, seed=seed)
    written_short = accuracy_rows(rng, 2)  # fewer rounds than k: its mean counts both
    write_run(tmp_path, "short", written_short, label="Short")

    html, tables = make_page(tmp_path, tmp_path, last_k=3)

    finals = [rows[-1]["accuracy"] for rows in written.values()]
    last3 = [statistics.mean(row["accuracy"] for row in rows[-3:]) for rows in written.values()]
    table = table_dict(tables["setting-1-accuracy"])
    expected_final = f"{statistics.mean(finals):.4f} ± {statistics.stdev(finals):.4f}"
    assert table["fedavg"]["final accuracy"] == expected_final
    assert table["fedavg"]["mean of last 3 rounds"] == (
        f"{statistics.mean(last3):.4f} ± {statistics.stdev(last3):.4f}")
    assert table["fedavg"]["runs (seeds)"] == "3 (0, 1, 2)"
    assert table["fedavg"]["rounds"] == "7"
    assert table["Short"]["final accuracy"] == f"{written_short[-1]['accuracy']:.4f}"  # one run: no ±
    assert table["Short"]["mean of last 3 rounds"] == (
        f"{statistics.mean(r['accuracy'] for r in written_short):.4f}")

    # the chart's markers carry the per-round mean over seeds
    round_5 = [rows[4]["accuracy"] for rows in written.values()]
    note = f"fedavg, round 5: {statistics.mean(round_5):.4f} ± {statistics.stdev(round_5):.4f} (n=3)"
    assert f"<title>{note}</title>" in html


def test_runs_repeating_one_seed_and_config_are_one_replicate_not_two(tmp_path):
    write_run(tmp_path, "a", [{"round": 1, "accuracy": 0.50}, {"round": 2, "accuracy": 0.60}])
    write_run(tmp_path, "b", [{"round": 1, "accuracy": 0.54}, {"round": 2, "accuracy": 0.64}], fleet="sim-y")
    write_run(tmp_path, "c", [{"round": 1, "accuracy": 0.70}, {"round": 2, "accuracy": 0.90}], seed=1)
    write_run(tmp_path, "d", [{"round": 1, "accuracy": 0.40}], label="Once")
    write_run(tmp_path, "e", [{"round": 1, "accuracy": 0.44}], label="Once", broker_url="mqtt://x:1")

    series = {s.label: s for s in group_runs(load_runs([tmp_path]))[0].series}
    assert [[run.name for run in repeats] for repeats in series["fedavg"].replicates()] == [["a", "b"], ["c"]]
    html, tables = make_page(tmp_path, tmp_path)

    table = table_dict(tables["setting-1-accuracy"])
    replicates = [statistics.mean([0.60, 0.64]), 0.90]  # seed 0's two runs count once, as their mean
    assert table["fedavg"]["final accuracy"] == (
        f"{statistics.mean(replicates):.4f} ± {statistics.stdev(replicates):.4f}")
    assert table["fedavg"]["runs (seeds)"] == "3 (0 ×2, 1)"
    assert table["Once"]["final accuracy"] == "0.4200"  # two runs of one seed: no "± 0.0000"
    assert table["Once"]["runs (seeds)"] == "2 (0 ×2)"
    assert "fedavg: runs a, b repeat seed 0 with the same configuration" in html
    assert "Once: runs d, e repeat seed 0" in html
    assert "<title>fedavg, round 1: 0.6100 ± 0.1273 (n=2)</title>" in html


def test_runs_of_one_seed_that_differ_in_config_stay_separate_replicates(tmp_path):
    write_run(tmp_path, "a", [{"round": 1, "accuracy": 0.5}], devices=3)
    write_run(tmp_path, "b", [{"round": 1, "accuracy": 0.7}], devices=5)
    write_run(tmp_path, "n1", [{"round": 1, "accuracy": 0.5}], config=None)

    settings = group_runs(load_runs([tmp_path]))
    fedavg = next(s for setting in settings for s in setting.series if s.label == "fedavg")
    assert len(fedavg.replicates()) == 2 and fedavg.final("accuracy").n == 2


def test_bytes_per_round_are_differences_of_the_cumulative_counters(tmp_path):
    totals = [1000, 3000, 6000, 500, 2500]  # the counter restarted (a resumed run) at round 4
    rows = [{"round": i + 1, "bytes_up": total, "bytes_down": 2 * total} for i, total in enumerate(totals)]
    assert points(rows, "bytes_up") == [(1, 1000), (2, 2000), (3, 3000), (4, 500), (5, 2000)]

    write_run(tmp_path, "a", rows)
    write_run(tmp_path, "b", [{"round": 1, "bytes_up": 4000, "bytes_down": 0}], seed=1)
    _, tables = make_page(tmp_path, tmp_path)

    per_run = [statistics.mean([1000, 2000, 3000, 500, 2000]), 4000.0]
    cost = table_dict(tables["setting-1-cost"])
    assert cost["bytes_up"]["fedavg"] == (
        f"{format_value('bytes_up', statistics.mean(per_run))} ± "
        f"{format_value('bytes_up', statistics.stdev(per_run))}")
    assert cost["bytes_up"]["fedavg"] == "2.9 kB ± 1.6 kB"


def test_unknown_numeric_keys_are_tabulated_and_charted_and_non_numbers_are_ignored(tmp_path):
    rows = [{"round": r, "accuracy": 0.5, "accuracy_tier0.25": 0.1 * r, "strong_accuracy": 0.2,
             "server_fancy_s": 0.5 * r, "hn_distance": 10.0 * r, "ok": True, "note": "x",
             "clients": {"a": 1}, "ids": [1, 2]} for r in (1, 2, 3)]
    write_run(tmp_path, "a", rows)

    html, tables = make_page(tmp_path, tmp_path, last_k=2)

    assert table_dict(tables["setting-1-parts"])["accuracy_tier0.25"]["fedavg"] == "0.2500"
    assert table_dict(tables["setting-1-parts"])["strong_accuracy"]["fedavg"] == "0.2000"
    assert table_dict(tables["setting-1-cost"])["server_fancy_s"]["fedavg"] == "1.000 s"
    other = table_dict(tables["setting-1-other"])
    assert list(other) == ["hn_distance"] and other["hn_distance"]["fedavg"] == "25"
    assert 'aria-label="hn_distance per round"' in html
    for ignored in ("ok", "note", "clients", "ids"):
        assert f"{ignored} per round" not in html


def test_runs_with_no_rounds_or_no_config_still_make_a_page(tmp_path):
    write_run(tmp_path, "empty", [], seed=4)
    write_run(tmp_path, "bare", [{"round": 1, "accuracy": 0.7}], config=None)

    html, tables = make_page(tmp_path, tmp_path)

    assert [row[0] for row in tables["runs"][1:]] == [str(tmp_path / "bare"), str(tmp_path / "empty")]
    bare = table_dict(tables["setting-1-accuracy"])["bare (no config.json)"]
    assert bare["final accuracy"] == "0.7000" and bare["runs (seeds)"] == "1 (?)"
    empty = table_dict(tables["setting-2-accuracy"])["fedavg"]
    assert empty["final accuracy"] == "–" and empty["rounds"] == "0" and empty["runs (seeds)"] == "1 (4)"
    assert "no data" in html  # the empty setting's chart says so


def test_the_page_fetches_nothing_and_escapes_what_the_runs_say(tmp_path):
    write_run(tmp_path, "a", [{"round": 1, "accuracy": 0.5}], label="<b>A & B</b>")
    html, tables = make_page(tmp_path, tmp_path)
    lowered = html.lower()
    for fetching in ("<script", "http:", "https:", "src=", "url(", "@import", "<link"):
        assert fetching not in lowered
    assert "<b>A" not in html and "&lt;b&gt;A &amp; B&lt;/b&gt;" in html
    assert table_dict(tables["setting-1-accuracy"])["<b>A & B</b>"]["final accuracy"] == "0.5000"


def test_replicates_whose_configs_differ_beyond_the_seed_are_noted(tmp_path):
    write_run(tmp_path, "a", [{"round": 1, "accuracy": 0.5}], devices=3)
    write_run(tmp_path, "b", [{"round": 1, "accuracy": 0.6}], devices=5, seed=1, fleet="other")
    html, _ = make_page(tmp_path, tmp_path)
    assert "fedavg: runs differ in <code>devices</code> (3, 5)" in html
    assert "<code>fleet</code>" not in html and "<code>seed</code>" not in html


def test_parent_directories_are_searched_four_levels_down_and_each_run_counts_once(tmp_path):
    write_run(tmp_path / "bench" / "fedavg", "r1", [{"round": 1}])
    write_run(tmp_path / "bench", "r0", [{"round": 1}])
    write_run(tmp_path / "deep" / "x" / "y" / "z", "r9", [{"round": 1}])  # five levels: not found
    found = find_run_dirs([tmp_path / "bench", tmp_path / "bench" / "r0" / "metrics.jsonl", tmp_path])
    assert found == [tmp_path / "bench" / "fedavg" / "r1", tmp_path / "bench" / "r0"]


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda root: _append(write_run(root, "a", [{"round": 1}]) / "metrics.jsonl", "{bad\n"),
         "a/metrics.jsonl:2: corrupt line (Expecting property name enclosed in double quotes, column 2)"),
        (lambda root: write_run(root, "a", [{"round": 1}, {"accuracy": 1}]),
         "a/metrics.jsonl:2: the row has no integer 'round' (got None)"),
        (lambda root: write_run(root, "a", [[1, 2]]), "a/metrics.jsonl:1: expected a JSON object, got list"),
        (lambda root: write_run(root, "a", [{"round": 1}]).joinpath("config.json").write_text("{"),
         "a/config.json:1: corrupt JSON"),
        (lambda root: root.joinpath("nothing-here").mkdir(), "no run found in"),
    ],
    ids=["corrupt-json", "no-round", "not-an-object", "corrupt-config", "no-run"],
)
def test_bad_inputs_are_one_line_errors_naming_the_file_and_line(tmp_path, setup, message):
    setup(tmp_path)
    result = CliRunner().invoke(report, [str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert message in result.output
    assert not (tmp_path / "r.html").exists()


def test_a_missing_input_or_an_unwritable_output_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(report, [str(tmp_path / "nope"), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 1 and result.output == f"Error: no such run directory: {tmp_path / 'nope'}\n"

    write_run(tmp_path, "a", [{"round": 1}])
    out = tmp_path / "missing-dir" / "r.html"
    result = CliRunner().invoke(report, [str(tmp_path / "a"), "--out", str(out)])
    assert result.exit_code == 1
    assert result.output == f"Error: cannot write {out}: No such file or directory\n"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportInputError, match=f"^no run found in {tmp_path / 'empty'} "):
        load_runs([tmp_path / "empty"])


def test_numbers_are_formatted_by_kind():
    assert format_value("accuracy", 0.96) == "0.9600"
    assert format_value("accuracy_exit2", 0.5) == "0.5000"
    assert format_value("bytes_down", 166320) == "166.3 kB"
    assert format_value("bytes_up", 6171496) == "6.17 MB"
    assert format_value("server_dilate_s", 0.01234) == "0.012 s"
    assert format_value("loss", 0.123456) == "0.1235"
    assert format_value("hn_trained", 4) == "4"
    assert format_value("samples", 123456) == "123,456"
    assert format_stat("loss", None) == "–"
    assert format_stat("loss", Stat(0.5, None, 1)) == "0.5"
    assert format_stat("accuracy", Stat(0.5, 0.01, 2)) == "0.5000 ± 0.0100"


def test_chart_ticks_are_round_numbers_that_cover_the_data():
    assert ticks(0.61, 0.97) == [0.6, 0.7, 0.8, 0.9, 1.0]
    assert ticks(1, 20, 8, integer=True) == [0, 5, 10, 15, 20]
    assert ticks(1, 3, 2, integer=True) == [1, 2, 3]
    assert ticks(0.5, 0.5)[0] < 0.5 < ticks(0.5, 0.5)[-1]
    assert tick_labels(ticks(120000, 170000)) == ["120k", "130k", "140k", "150k", "160k", "170k"]
    assert tick_labels([0.1, 0.15, 0.2]) == ["0.10", "0.15", "0.20"]


def test_build_page_refuses_a_k_below_one():
    with pytest.raises(ValueError, match="last_k"):
        build_page([], last_k=0)


def test_the_report_finds_the_runs_of_a_reproduction_from_its_runs_directory(tmp_path):
    from server_toolkit.report.runs import find_run_dirs

    run = tmp_path / "hypemefed" / "Dir_0.1" / "HypeMeFed" / "seed0"  # bench/reproduce.py's layout
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"round": 1, "accuracy": 0.5}\n')
    assert find_run_dirs([tmp_path]) == [run]
    assert find_run_dirs([tmp_path / "hypemefed"]) == [run]
