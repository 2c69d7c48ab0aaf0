"""Each tier's deployable model against its controls (issue 32): "tier t: X vs AllSmall Y vs alone Z".

Runs, through ``simulate``'s in-process path, one heterogeneous method per family against
AllSmall (every device trains the smallest tier's model) and Alone (``--method alone``: each
tier's devices train that tier's model among themselves), Dirichlet α (each ``--alphas``),
several seeds; prints per tier the mean ± std over seeds of ``accuracy_tier_<t>``
(``methods/tier_accuracy.py``) averaged over the last ``--last-k`` rounds. Families:

* ``width``: HeteroFL on lenet5, tiers 1.0 / 0.5 / 0.25 (``--width-tiers`` sets others, e.g.
  1.0 0.5 0.125); AllSmall at the smallest tier's width;
* ``exit``: DepthFL on lenet5_multi_exit, tiers 2 / 1; AllSmall = FedAvg-S (the tier-1 prefix);
* ``exit-vgg``: the same on vgg_multi_exit, tiers 3 / 2 / 1 (heavy);
* ``exit-sd``: DepthFL with and without its self-distillation, lenet5_multi_exit;
* ``resource-skew``: RecipFL on lenet5, 1 strong device holding half the data (quantity skew)
  and 5 weak ones, small model width 0.3; AllSmall at width 0.3; Alone = ExclusiveFL;
* ``conv``: FedConv on small_cnn, tiers 1.0 / 0.5 / 0.25; AllSmall at width 0.25; Alone trains
  the width sub-models (FedConv's tier shapes) without FedConv's 5 % server data.

``--holdout F`` runs every arm with ``simulate --holdout F`` (each device holds back a
fraction F of its data, ``methods/holdout_accuracy.py``) and prints under each tier's line the
same arms scored on the devices' own held-back data (``accuracy_holdout_tier_<t>``, the model the
devices received: one round behind the server's figure); those runs live in ``seed<s>-holdout<F>``
beside the others (their devices train on 1 − F of the data, so the server's figures differ too).

A run whose ``metrics.jsonl`` under ``--runs-dir`` is complete for the same configuration is
read back instead of run again (a long bench can be stopped and restarted). ``--arms`` runs
some arms only (e.g. the controls in one process and the method in another on a shared
machine; a later call without it reads them all back). ``--methods`` replaces the family's
method row by one row per named registry method of the same family (e.g. ``--families width
--methods heterofl fedrolex feddm``), under the same controls; ``--method-option KEY=JSON``
gives those rows an option (named in their label, e.g. ``fresh_windows=[0.5,0.25]``).

    OMP_NUM_THREADS=1 python bench/tiers.py --data-dir ../shared/datasets --train-samples 6000 \\
        --test-samples 2000 --rounds 15 --seeds 0 1 2 --alphas 0.1 0.5 --families exit width
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from server_toolkit.sim.simulate import Simulation, SimulationConfig

WIDTH_TIERS = ["1.0", "0.5", "0.25"]
ALL_SMALL_WIDTH = {"small_model": "width:0.25", "strong_tiers": ["1.0"]}
RESOURCE = {"small_model": "width:0.3"}
# family -> (model, tiers, [(label, method, options)], other SimulationConfig fields): the method
# first, its controls after it
FAMILIES = {
    "width": ("lenet5", WIDTH_TIERS, [("HeteroFL", "heterofl", {}),
                                         ("AllSmall", "allsmall", ALL_SMALL_WIDTH),
                                         ("Alone", "alone", {"of": "heterofl"})], {}),
    "exit": ("lenet5_multi_exit", ["2", "1"], [("DepthFL", "depthfl", {}),
                                               ("AllSmall (FedAvg-S)", "fedavg-s-exit", {}),
                                               ("Alone", "alone", {"of": "depthfl"})], {}),
    "exit-vgg": ("vgg_multi_exit", ["3", "2", "1"], [("DepthFL", "depthfl", {}),
                                                     ("AllSmall (FedAvg-S)", "fedavg-s-exit", {}),
                                                     ("Alone", "alone", {"of": "depthfl"})], {}),
    "exit-sd": ("lenet5_multi_exit", ["2", "1"], [("DepthFL", "depthfl", {}),
                                                  ("DepthFL no SD", "depthfl", {"self_distillation": False}),
                                                  ("AllSmall (FedAvg-S)", "fedavg-s-exit", {})], {}),
    "resource-skew": ("lenet5", ["strong"] + ["weak"] * 5,
                      [("RecipFL", "recipfl", RESOURCE), ("AllSmall", "allsmall", RESOURCE),
                       ("Alone (ExclusiveFL)", "alone", {"of": "recipfl", "of_options": RESOURCE})],
                      {"devices": 6, "partition": "quantity-skew", "num_strong": 1}),
    "conv": ("small_cnn", WIDTH_TIERS, [("FedConv", "fedconv", {}),
                                        ("AllSmall", "allsmall", ALL_SMALL_WIDTH),
                                        ("Alone", "alone", {"of": "heterofl"})], {}),
}
SEPARATORS = (",", ":")  # compact JSON in labels
HELD = "holdout"  # the key prefix of a tier's accuracy on the devices' held-back data
LABELS = {"heterofl": "HeteroFL", "fedrolex": "FedRolex", "feddm": "FedDM"}  # --methods' row labels


def finished_rows(sim: Simulation) -> list[dict] | None:
    """The rows of a complete earlier run of the same configuration in ``sim``'s run dir, else None."""
    config, metrics = sim.run_dir / "config.json", sim.run_dir / "metrics.jsonl"
    if not (config.exists() and metrics.exists()):
        return None
    if json.loads(config.read_text()) != json.loads(sim.config.to_json()):
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return rows if len(rows) >= sim.config.rounds else None


def run_rows(config: SimulationConfig, run_dir: Path) -> list[dict]:
    """The metrics rows of one run (read back when it already ran to the end)."""
    sim = Simulation(config, run_dir)
    return finished_rows(sim) or sim.run().rows


def tier_accuracies(config: SimulationConfig, run_dir: Path, last_k: int) -> dict[str, float]:
    """{tier: its deployable accuracy averaged over the last ``last_k`` rounds} of one run,
    the global model's ``accuracy`` under "global" and a multi-exit model's ``accuracy_exit<k>``
    and ``accuracy_ensemble`` under "exit<k>" and "ensemble"; with a held-back split, each
    tier's ``accuracy_holdout_tier_<t>`` under "holdout <t>"."""
    rows = run_rows(config, run_dir)[-last_k:]
    found = {t: statistics.fmean(r[f"accuracy_tier_{t}"] for r in rows) for t in dict.fromkeys(config.tiers)}
    if config.holdout:  # on the devices' held-back data, under "holdout <t>"
        found.update({f"{HELD} {t}": statistics.fmean(r[f"accuracy_holdout_tier_{t}"] for r in rows)
                      for t in dict.fromkeys(config.tiers)})
    exits = [k for k in rows[-1] if k.startswith("accuracy_exit") or k == "accuracy_ensemble"]
    return {**found, "global": statistics.fmean(r["accuracy"] for r in rows),
            **{k.removeprefix("accuracy_"): statistics.fmean(r[k] for r in rows) for k in exits}}


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {std:.3f}"


def method_rows(family: str, names: list[str], options: dict) -> list[tuple[str, str, dict]]:
    """One (label, method, options) row per registry method in ``names``, with ``options``
    (named in the label); SystemExit if one is unknown or of another family than ``family``'s method."""
    from server_toolkit.methods import method_class

    wanted = method_class(FAMILIES[family][2][0][1]).family
    rows = []
    for name in names:
        try:
            method = method_class(name)
        except ValueError as error:
            raise SystemExit(f"--methods: {error}") from None
        if method.family != wanted:
            raise SystemExit(f"--methods {name}: of family {method.family!r}, not {family}'s ({wanted!r})")
        named = [f"{key}={json.dumps(value, separators=SEPARATORS)}" for key, value in options.items()]
        label = " ".join([LABELS.get(method.name, method.name), *named])
        rows.append((label, method.name, dict(options)))
    return rows


def with_width_tiers(family: str, tiers: list[str] | None) -> tuple:
    """``FAMILIES[family]``; for the width family with ``tiers`` given (e.g. 1.0, 0.5, 0.125),
    those tiers and AllSmall at the smallest of them (the fleet's weakest device's model)."""
    model, default_tiers, entries, extra = FAMILIES[family]
    if family != "width" or not tiers:
        return model, default_tiers, entries, extra
    try:
        smallest = min(float(t) for t in tiers)
    except ValueError:
        raise SystemExit(f"--width-tiers {tiers}: expected width ratios, e.g. 1.0 0.5 0.125") from None
    small = {**ALL_SMALL_WIDTH, "small_model": f"width:{smallest:g}"}
    entries = [(label, method, small if method == "allsmall" else options)
               for label, method, options in entries]
    return model, list(tiers), entries, extra


def selected(family: str, arms: list[str] | None, methods: list[str] | None = None,
             options: dict | None = None, width_tiers: list[str] | None = None) -> tuple:
    """``FAMILIES[family]`` (``with_width_tiers``), its method row replaced by ``methods``' rows
    when given (``method_rows``), with only the entries whose label is in ``arms`` (all if None);
    SystemExit naming the family's labels if one of ``arms`` is not among them."""
    model, tiers, entries, extra = with_width_tiers(family, width_tiers)
    if methods:
        entries = method_rows(family, methods, options or {}) + entries[1:]
    if arms is not None:
        labels = [label for label, _, _ in entries]
        if unknown := [arm for arm in arms if arm not in labels]:
            raise SystemExit(f"--arms {unknown}: {family}'s arms are {labels}")
        entries = [entry for entry in entries if entry[0] in arms]
    return model, tiers, entries, extra


def run_family(family: str, alpha: float, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """{label: {tier or "global": [value per seed]}} of one family at Dirichlet ``alpha``."""
    model, tiers, entries, extra = selected(family, args.arms, args.methods, args.method_option,
                                            args.width_tiers)
    results: dict[str, dict[str, list[float]]] = {}
    holdout = getattr(args, "holdout", 0.0)
    for seed in args.seeds:  # seeds outermost: a bench stopped early has every arm of its first seeds
        for label, method, options in entries:
            config = SimulationConfig(**{
                "method": method, "dataset": args.dataset, "data_dir": args.data_dir, "model": model,
                "devices": args.devices, "rounds": args.rounds, "alpha": alpha, "seed": seed,
                "tiers": tiers, "method_options": options, "grid": "inprocess",
                "train_samples": args.train_samples, "test_samples": args.test_samples, "label": label,
                "setting": family, "holdout": holdout, **extra})
            arm = label.lower().replace(" ", "-").replace("(", "").replace(")", "")
            run_dir = args.runs_dir / family / f"alpha{alpha}" / arm / (
                f"seed{seed}-holdout{holdout:g}" if holdout else f"seed{seed}")
            for key, value in tier_accuracies(config, run_dir, args.last_k).items():
                results.setdefault(label, {}).setdefault(key, []).append(value)
    return results


def method_option(text: str) -> tuple[str, object]:
    """``KEY=JSON`` -> (key, decoded value); argparse error on another shape."""
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=JSON, e.g. fresh_windows=[0.5,0.25]") \
            from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--families", nargs="+", default=["exit", "width"], choices=sorted(FAMILIES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--devices", type=int, default=9, help="Devices (resource-skew: always 6).")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.5], help="Dirichlet α, one bench each.")
    parser.add_argument("--train-samples", type=int, default=None, help="A stratified subset (default: all).")
    parser.add_argument("--test-samples", type=int, default=None,
                        help="A stratified subset of the test split (default: all of it).")
    parser.add_argument("--last-k", type=int, default=3, help="Rounds averaged at the end of each run.")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/tiers"))
    parser.add_argument("--arms", nargs="+", default=None,
                        help="Run only the arms with these labels (e.g. HeteroFL AllSmall; default: all).")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="Replace the family's method row by these registry methods of the same "
                        "family (e.g. heterofl fedrolex feddm; default: the family's one).")
    parser.add_argument("--method-option", type=method_option, action="append", default=None,
                        help="KEY=JSON option of the --methods rows (repeatable), e.g. "
                        "'fresh_windows=[0.5,0.25]'; named in the row's label.")
    parser.add_argument("--width-tiers", nargs="+", default=None,
                        help="The width family's tiers (ratios, largest first), e.g. 1.0 0.5 0.125; AllSmall "
                        "then trains the smallest (default: 1.0 0.5 0.25).")
    parser.add_argument("--holdout", type=float, default=0.0, metavar="F",
                        help="Each device holds back this fraction of its data (simulate --holdout); "
                        "prints each tier on it too (default 0: off).")
    args = parser.parse_args()
    if not 0.0 <= args.holdout <= 0.5:
        parser.error(f"--holdout {args.holdout}: a fraction in 0..0.5")
    args.method_option = dict(args.method_option or [])
    started = time.monotonic()
    for family in args.families:
        _, tiers, entries, _ = selected(family, args.arms, args.methods, args.method_option, args.width_tiers)
        for alpha in args.alphas:
            results = run_family(family, alpha, args)
            print(f"{family}: {args.dataset}, α {alpha}, seeds {args.seeds}, {args.rounds} rounds",
                  flush=True)
            for tier in [*dict.fromkeys(tiers), "global"]:
                name = "global model (accuracy)" if tier == "global" else f"tier {tier}"
                print(f"  {name}: " + " vs ".join(f"{label} {mean_std(results[label][tier])}"
                                                  for label, _, _ in entries), flush=True)
                if args.holdout and tier != "global":
                    print("    on the devices' held-back data: " + " vs ".join(
                        f"{label} {mean_std(results[label][f'{HELD} {tier}'])}" for label, _, _ in entries),
                          flush=True)
            for label, _, _ in entries:  # a multi-exit global model's exits, for the reasons
                exits = sorted(k for k in results[label] if k.startswith("exit") or k == "ensemble")
                if exits:
                    print(f"  {label}'s global model: " + ", ".join(
                        f"{k} {mean_std(results[label][k])}" for k in exits), flush=True)
    print(f"wall time {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
