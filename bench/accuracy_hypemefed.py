"""HypeMeFed vs its baselines: same partition, seed, initial weights and sampling.

Setting (HypeMeFed's UniMiB set-up scaled down): ``--clients`` clients (default 30), tiers
1/2/3 round-robin (client i has tier i % 3 + 1), ``--fraction`` of them per round (20 %),
Dirichlet(alpha) label split of the training set (when no draw gives every client 10
samples, 3 clients fewer are used until one does), each client's part split 80/20 into
local train / local test (as the authors' code does). Model: the paper's VGG
(``vgg_multi_exit``: 32-64-128-256, exits after blocks 2, 3, 4).

Methods, each built with the defaults ``fedsdk-server simulate --method NAME`` gives: FedAvg-S
(everybody trains the tier-1 prefix), FedAvg-L (everybody trains the full model),
multi-exit without hypernetwork (``depthfl``), HypeMeFed (LRF, k = 100), and HeteroFL (width
ratios 0.25 / 0.5 / 1.0 for tiers 1 / 2 / 3, about the exit tiers' parameter counts). The
exit-split methods hand out their own device recipe (Adam, their default lr and batch, the
user's ``--epochs``); HeteroFL trains the user's recipe, which the bench sets to that same
recipe so every method trains alike.

Data: ``--dataset digits`` (bundled, 8x8), ``mnist`` or ``fashion_mnist`` (from ``--data-dir``,
see docs/datasets.md; the Debian package's Fashion-MNIST is found without it).
``--train-size`` / ``--test-size`` subsample the training / test set, stratified by class
and seeded (0 = all).

Printed per alpha and seed: global accuracy at the final exit (server test split) after the
last round and averaged over the last 5 rounds, the mean per-client accuracy at each client's
deepest exit on its local test split, the number of hypernetwork-generated tensors over the
run and the mean relative errors of the hypernetworks' skill checks against the global
weights' (HypeMeFed), and the wall time; then the last-5 means over seeds and HypeMeFed's gain over
FedAvg-S. Paper anchor: +5.12 points over FedAvg-S on its testbed task (UniMiB, alpha 0.5).

    .venv/bin/python bench/accuracy_hypemefed.py                 # digits, alpha 0.5 and 0.1, 40 rounds
    .venv/bin/python bench/accuracy_hypemefed.py --rounds 10 --alphas 0.5 --seeds 0,1
    .venv/bin/python bench/accuracy_hypemefed.py --dataset fashion_mnist \\
        --data-dir /path/to/datasets --clients 20 --train-size 3000 --test-size 1000 --rounds 20
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from fedcore.recipe import Recipe
from server_toolkit.data.datasets import Dataset, load_dataset
from server_toolkit.methods import methods
from server_toolkit.methods.base import DeviceInfo, Method
from server_toolkit.models.exit_eval import deepest_exit_accuracy
from server_toolkit.models.zoo import vgg_multi_exit
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds
from server_toolkit.sim.partition import PartitionError, partition
from server_toolkit.submodels.exit_split import num_tiers

METHODS = [("FedAvg-S", "fedavg-s-exit"), ("FedAvg-L", "fedavg-l-exit"), ("multi-exit, no HN", "depthfl"),
           ("HypeMeFed (LRF k=100)", "hypemefed"), ("HeteroFL", "heterofl")]


# VGG 32-64-128-256 on 8x8: the tier-1 / tier-2 / full exit-split models have 68k / 291k / 1.18M
# parameters; width 0.25 / 0.5 / 1.0 gives 75k / 297k / 1.18M (capacities balanced, as the paper did).
HETEROFL_RATIOS = {"1": 0.25, "2": 0.5, "3": 1.0}


def load_data(args, seed: int) -> Dataset:
    """The dataset (``--data-dir`` for MNIST / Fashion-MNIST), stratified to the sizes asked."""
    data = load_dataset(args.dataset, data_dir=args.data_dir or None, seed=seed)
    return data.subset(args.train_size or None, args.test_size or None, seed)


def make_clients(data: Dataset, alpha: float, num_clients: int, seed: int):
    """Devices (tier i % 3 + 1) with their local train split, and their local test splits."""
    while True:  # a skewed draw may leave a client under 10 samples: use 3 clients fewer (one per tier)
        try:
            parts = partition(data.y_train, num_clients, "dirichlet", seed=seed, alpha=alpha, min_size=10)
            break
        except PartitionError:
            if num_clients <= 3:
                raise
            num_clients -= 3
    rng = np.random.default_rng(seed)
    devices, local_tests = [], []
    for i, idx in enumerate(parts):
        idx = rng.permutation(idx)
        cut = int(round(0.8 * len(idx)))
        train, test = idx[:cut], idx[cut:]
        tier = i % 3 + 1
        devices.append(LocalDevice(DeviceInfo(f"c{i:03d}", len(train), str(tier)),
                                   data.x_train[train], data.y_train[train]))
        local_tests.append((tier, data.x_train[test], data.y_train[test]))
    return devices, local_tests


def build_method(key: str, spec: dict, recipe: Recipe) -> Method:
    """Method ``key`` with its defaults; HeteroFL with the exit tiers' width ratios (it trains
    ``recipe`` as it is)."""
    cls = methods()[key]
    if key == "heterofl":
        return cls(spec, recipe, tier_ratios=HETEROFL_RATIOS)
    return cls(spec, recipe)


def device_recipe(spec: dict, epochs: int, seed: int) -> Recipe:
    """The recipe the exit-split methods hand out by default, with ``epochs`` local epochs."""
    return methods()["depthfl"](spec, Recipe(epochs=epochs, seed=seed)).client_recipe


def eval_tier(key: str, client_tier: int, spec: dict) -> int:
    """The exit a client is scored at: its own deepest exit; FedAvg-S has only exit 1 and
    FedAvg-L gives every client the full model."""
    if key == "fedavg-s-exit":
        return 1
    if key in ("fedavg-l-exit", "heterofl"):
        return num_tiers(spec)
    return client_tier


def run(alpha: float, seed: int, args) -> list[tuple[str, dict]]:
    data = load_data(args, seed)
    devices, local_tests = make_clients(data, alpha, args.clients, seed)
    if len(devices) != args.clients:
        print(f"  alpha {alpha} seed {seed}: no Dirichlet draw gave {args.clients} clients >= 10 samples; "
              f"using {len(devices)} clients", flush=True)
    spec = vgg_multi_exit(data.input_shape, data.num_classes)
    recipe = device_recipe(spec, args.epochs, seed)
    per_round = max(1, round(args.fraction * len(devices)))
    results = []
    for label, key in METHODS:
        if args.methods and key not in args.methods.split(","):
            continue
        if key not in methods():
            print(f"  {label}: not installed (no method {key!r}), skipped", flush=True)
            continue
        method = build_method(key, spec, recipe)
        torch.manual_seed(seed)
        started = time.perf_counter()
        run_result = run_rounds(method, devices, args.rounds, (data.x_test, data.y_test), seed=seed,
                                clients_per_round=per_round)
        seconds = time.perf_counter() - started
        accs = [row["accuracy"] for row in run_result.rows]
        clients = [(eval_tier(key, tier, spec), x, y) for tier, x, y in local_tests]
        per_client = deepest_exit_accuracy(method.global_spec, run_result.weights, clients)
        generated = sum(row.get("generated", 0) for row in run_result.rows)
        results.append((label, {"final": accs[-1], "last5": float(np.mean(accs[-5:])), "client": per_client,
                                "generated": generated, "seconds": seconds}))
        checks = [(row["hn_check_rel_err"], row["hn_stand_in_rel_err"]) for row in run_result.rows
                  if "hn_check_rel_err" in row]
        gate = (f", skill checks: hypernetworks' rel. error {np.mean([c[0] for c in checks]):.3f} vs global "
                f"weights' {np.mean([c[1] for c in checks]):.4f}") if checks else ""
        print(f"  {label}: final {accs[-1]:.4f}, last-5 mean {np.mean(accs[-5:]):.4f}, per-client deepest "
              f"exit {per_client:.4f}, generated {generated}{gate} ({seconds:.0f} s)", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=("digits", "mnist", "fashion_mnist"), default="digits")
    parser.add_argument("--data-dir", default="",
                        help="Where MNIST / Fashion-MNIST are (see docs/datasets.md).")
    parser.add_argument("--train-size", type=int, default=0, help="Training images kept (0: all).")
    parser.add_argument("--test-size", type=int, default=0, help="Test images kept (0: all).")
    parser.add_argument("--alphas", default="0.5,0.1")
    parser.add_argument("--seeds", default="0", help="Comma-separated seeds (partition, init, sampling).")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--methods", default="", help="Comma-separated method names (default: all).")
    args = parser.parse_args()
    torch.set_num_threads(1)  # 2 threads on a shared 2-core machine ran ~10x slower (oversubscription)
    seeds = [int(s) for s in args.seeds.split(",")]
    tables: dict[float, dict[int, list[tuple[str, dict]]]] = {}
    for alpha in [float(a) for a in args.alphas.split(",")]:
        tables[alpha] = {}
        for seed in seeds:
            print(f"alpha {alpha}, seed {seed}:", flush=True)
            tables[alpha][seed] = run(alpha, seed, args)
    print(f"\n{args.dataset}, VGG 32-64-128-256 with 3 exits, {args.clients} clients (tiers 1/2/3 "
          f"round-robin), {args.fraction:.0%} per round, {args.rounds} rounds, {args.epochs} local epochs, "
          f"seeds {args.seeds}, train/test size {args.train_size or 'all'}/{args.test_size or 'all'}")
    print(f"{'alpha':>5}  {'method':<24} {'last-5 mean':>11} {'per seed (last-5)':>24} {'per-client':>10} "
          f"{'vs FedAvg-S':>11} {'time s':>7}")
    for alpha, by_seed in tables.items():
        labels = [label for label, _ in next(iter(by_seed.values()))]
        means = {}
        for label in labels:
            runs = [dict(rows)[label] for rows in by_seed.values()]
            means[label] = {k: float(np.mean([r[k] for r in runs])) for k in ("last5", "client", "seconds")}
            means[label]["seeds"] = " ".join(f"{r['last5']:.3f}" for r in runs)
        base = means.get("FedAvg-S")
        for label in labels:
            m = means[label]
            delta = f"{100 * (m['last5'] - base['last5']):+.2f} pt" if base else "-"
            print(f"{alpha:>5}  {label:<24} {m['last5']:>11.4f} {m['seeds']:>24} {m['client']:>10.4f} "
                  f"{delta:>11} {m['seconds']:>7.0f}")
    print("'vs FedAvg-S' compares last-5-round means of global final-exit accuracy (mean over seeds); paper "
          "anchor: +5.12 pt (HypeMeFed over FedAvg-S, UniMiB testbed).")


if __name__ == "__main__":
    main()
