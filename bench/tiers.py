"""Each tier's deployable model against AllSmall (issue 32): "tier t: X vs AllSmall Y".

Runs, through ``simulate``'s in-process path, a width method (HeteroFL, tiers 1.0 / 0.5 / 0.25)
against AllSmall at width 0.25, and an exit method (DepthFL on ``vgg_multi_exit``, tiers
1 / 2 / 3) against FedAvg-S (everybody trains the tier-1 prefix, the exit family's AllSmall),
Dirichlet α, several seeds; prints per tier the mean ± std over seeds of ``accuracy_tier_<t>``
(``methods/tier_accuracy.py``) averaged over the last ``--last-k`` rounds. ``--families
exit-sd`` (not in the default run): DepthFL with and without its self-distillation, and
FedAvg-S, on LeNet-5's 2-exit variant (tiers 2 / 1).

    OMP_NUM_THREADS=1 python bench/tiers.py --data-dir ../shared/datasets --rounds 20 --seeds 0 1 2
    OMP_NUM_THREADS=1 python bench/tiers.py --data-dir ../shared/datasets --families exit-sd
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from server_toolkit.sim.simulate import Simulation, SimulationConfig

WIDTH_TIERS, EXIT_TIERS = ["1.0", "0.5", "0.25"], ["3", "2", "1"]
# family -> (model, tiers, [(label, method, options)]): the method first, its control second
FAMILIES = {
    "width": ("small_cnn", WIDTH_TIERS, [("HeteroFL", "heterofl", {}),
                                         ("AllSmall", "allsmall", {"small_model": "width:0.25",
                                                                   "strong_tiers": ["1.0"]})]),
    "exit": ("vgg_multi_exit", EXIT_TIERS, [("DepthFL", "depthfl", {}),
                                            ("AllSmall (FedAvg-S)", "fedavg-s-exit", {})]),
    # DepthFL's self-distillation ablation on LeNet-5's 2-exit variant (small enough for this machine)
    "exit-sd": ("lenet5_multi_exit", ["2", "1"], [("DepthFL", "depthfl", {}),
                                                  ("DepthFL no SD", "depthfl", {"self_distillation": False}),
                                                  ("AllSmall (FedAvg-S)", "fedavg-s-exit", {})]),
}


def tier_accuracies(config: SimulationConfig, run_dir: Path, last_k: int) -> dict[str, float]:
    """{tier: its deployable accuracy averaged over the last ``last_k`` rounds} of one run."""
    rows = Simulation(config, run_dir).run().rows[-last_k:]
    return {t: statistics.fmean(r[f"accuracy_tier_{t}"] for r in rows) for t in config.tiers}


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {std:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--families", nargs="+", default=["exit", "width"], choices=sorted(FAMILIES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--devices", type=int, default=9)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--train-samples", type=int, default=None, help="A stratified subset (default: all).")
    parser.add_argument("--last-k", type=int, default=3, help="Rounds averaged at the end of each run.")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/tiers"))
    args = parser.parse_args()
    started = time.monotonic()
    for family in args.families:
        model, tiers, entries = FAMILIES[family]
        results: dict[str, dict[str, list[float]]] = {}
        for label, method, options in entries:
            for seed in args.seeds:
                config = SimulationConfig(
                    method=method, dataset=args.dataset, data_dir=args.data_dir, model=model,
                    devices=args.devices,
                    rounds=args.rounds, alpha=args.alpha, seed=seed, tiers=tiers, method_options=options,
                    grid="inprocess", train_samples=args.train_samples, label=label, setting=family)
                arm = label.lower().replace(" ", "-").replace("(", "").replace(")", "")
                found = tier_accuracies(config, args.runs_dir / family / arm / f"seed{seed}", args.last_k)
                for tier, value in found.items():
                    results.setdefault(label, {}).setdefault(tier, []).append(value)
        print(f"{family}: {args.dataset}, α {args.alpha}, seeds {args.seeds}, {args.rounds} rounds")
        for tier in tiers:
            print(f"  tier {tier}: " + " vs ".join(f"{label} {mean_std(results[label][tier])}"
                                                   for label, _, _ in entries))
    print(f"wall time {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
