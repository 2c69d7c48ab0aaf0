"""Accuracy vs epsilon of client-level DP (DP-FedAvg, central noise) on Fashion-MNIST.

    .venv/bin/python bench/privacy.py --data-dir /work/shared/datasets [--seeds 0 1 2]
        [--epsilons 1 3 8 inf] [--rounds 10] [--runs-dir runs/privacy]

Every run is a `fedsdk-server simulate --grid inprocess` command (printed; same code path as
a user's): FedAvg and HeteroFL (tiers 1.0 / 0.5 round-robin), small_cnn, IID split of the
60,000 training images over ``--devices`` (1000) devices, ``--per-round`` (50) devices per
round (sampling rate q = 0.05), ``--rounds`` (6) rounds, update deltas clipped to ``--clip``
(L2) and averaged unweighted; test accuracy on 2,000 stratified test images.

Why this fleet: the noise on the average has std z·C/m per element, so a model of d
weights gets noise of norm z·C·√d/m against a clipped signal of norm ≤ C; with d ≈ 10⁵
(small_cnn) m must be in the hundreds before any epsilon below 10 leaves a usable signal.
1000 devices with 50 per round is what a shared 2-core machine trains in minutes per run;
a small q also makes rounds cheap in epsilon (amplification by sampling). The
noise multiplier z of each epsilon is the smallest that keeps epsilon (RDP accountant,
Poisson rate q, delta 1e-5) within the target after ``--rounds`` rounds
(``privacy/accountant.noise_for_epsilon``); ``--dp-epsilon`` is set to the target too, as
a guard. ε = ∞: the same clipping and unweighted average, no noise.

Printed: a markdown table of final test accuracy (mean ± std over seeds) and the epsilon
each run reported. ``fedsdk-server report RUNS/privacy --out privacy.html`` draws the runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reproduce import _mean_std, read_rows, rounds_done, run_one  # noqa: E402

from server_toolkit.privacy.accountant import noise_for_epsilon  # noqa: E402

METHODS = {"FedAvg": "--method fedavg", "HeteroFL": "--method heterofl --tiers 1.0,0.5"}


def command(method_args: str, epsilon: float, seed: int, run_dir: Path, args) -> list[str]:
    """The simulate command of one arm."""
    rate = args.per_round / args.devices
    dp = f"--dp-clip {args.clip}"
    if math.isfinite(epsilon):
        z = noise_for_epsilon(epsilon, "central", rate, args.rounds, args.delta)
        dp += f" --dp-noise-multiplier {z:.4f} --dp-epsilon {epsilon:g} --dp-delta {args.delta:g}"
    label = f"{method_args.split()[1]} eps={epsilon:g}"
    return ["simulate", "--grid", "inprocess", "--dataset", args.dataset, "--data-dir", args.data_dir,
            "--model", "small_cnn", "--devices", str(args.devices),
            "--clients-per-round", str(args.per_round),
            "--rounds", str(args.rounds), "--partition", "iid", "--test-samples", "2000", "--seed", str(seed),
            "--lr", str(args.lr), "--max-steps", str(args.max_steps),
            *method_args.split(), *dp.split(), "--label", label, "--setting", "privacy",
            "--run-dir", str(run_dir)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 8.0, math.inf])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--lr", type=float, default=0.05,
                        help="Device learning rate (0.05: the recipe of the recorded figures, 2026-11-24).")
    parser.add_argument("--max-steps", type=int, default=0, help="Local step bound (0: none, as recorded).")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/privacy"))
    parser.add_argument("--table-only", action="store_true", help="Print the table of the finished runs.")
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp-accounting warns per RDP order
    started = time.monotonic()
    table: dict = {}
    for seed in args.seeds:  # every cell once before any gets a second seed
        for epsilon in args.epsilons:
            for label, method_args in ((m, METHODS[m]) for m in args.methods):
                run_dir = args.runs_dir / label / f"eps{epsilon:g}" / f"seed{seed}"
                cmd = command(method_args, epsilon, seed, run_dir, args)
                if rounds_done(run_dir) < args.rounds and not args.table_only:
                    print("fedsdk-server " + " ".join(cmd), flush=True)
                    wall, code, cpu = run_one(cmd, run_dir, run_dir.parent / f"seed{seed}.log")
                    print(f"  exit {code}, {wall:.0f} s wall, {cpu:.0f} s CPU", flush=True)
                rows = read_rows(run_dir)
                found = run_dir / "summary.json"
                summary = json.loads(found.read_text()) if found.exists() else {}
                spent = summary.get("privacy", {}).get("dp_epsilon")
                cell = table.setdefault((label, epsilon), {"acc": [], "eps": []})
                if len(rows) == args.rounds:
                    cell["acc"].append(rows[-1]["accuracy"])
                    cell["eps"].append(spent if spent is not None else math.inf)
    print(f"\n{args.dataset}, {args.devices} devices, {args.per_round} per round, {args.rounds} rounds, "
          f"C = {args.clip}, delta = {args.delta:g}, seeds {args.seeds}; "
          f"{time.monotonic() - started:.0f} s wall\n")
    print("| method | target ε | noise multiplier z | ε reported | final accuracy | runs |")
    print("|---|---|---|---|---|---|")
    for (label, epsilon), cell in table.items():
        z = noise_for_epsilon(epsilon, "central", args.per_round / args.devices, args.rounds, args.delta) \
            if math.isfinite(epsilon) else 0.0
        reported = max(cell["eps"]) if cell["eps"] else math.nan
        print(f"| {label} | {epsilon:g} | {z:.3f} | {reported:.3f} | {_mean_std(cell['acc'])} | "
              f"{len(cell['acc'])} |")


if __name__ == "__main__":
    main()
