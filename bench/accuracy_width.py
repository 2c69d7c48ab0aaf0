"""Width-shared methods vs their baselines: same partition, seed and initial weights.

Setting: ``--devices`` devices (default 20) with tiers 1.0 / 0.75 / 0.5 / 0.25 given
round-robin (5 each), all of them every round; Dirichlet(alpha) label split of the
training set (min 10 samples), each device's part split 80/20 into local train / local
test. Model: ``small_cnn`` (16-32 conv, 64-unit MLP head), static BN where there is BN.
Recipe for every method: SGD lr 0.05, momentum 0.9, batch 16, ``--epochs`` local epochs.

Methods: FedAvg-S (everybody trains the r = 0.25 sub-model, the smallest tier's),
FedAvg-L (everybody trains the full model: ignores the device limits), HeteroFL,
FedRolex, FedDM without and with the similarity tree. FedDM's tree gets a reference batch
of 64 server test images (left out of the global test set for every method) and the
devices' label counts.

Printed per dataset and alpha: global accuracy of the server model on the test split
(after the last round, and the mean of the last 5 rounds) and two mean per-device
accuracies on the devices' local test splits: "sent" = the model the method would send
the device next round (its tier's sub-model, at next round's window; with the tree, its
subtree's deeper layers), "trained" = the model the device returned in the last round
(after its local training).
``--plot`` writes the global accuracy curves.

    .venv/bin/python bench/accuracy_width.py                       # digits, alpha 0.1 and 0.5
    .venv/bin/python bench/accuracy_width.py --dataset mnist --data-dir DIR
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods.base import DeviceInfo, Method
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.width.feddm import FedDM
from server_toolkit.methods.width.fedrolex import FedRolex
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds
from server_toolkit.sim.partition import partition
from server_toolkit.submodels.width import static_bn, width_layout

TIERS = ("1.0", "0.75", "0.5", "0.25")
REFERENCE_SIZE = 64


def make_devices(data, alpha: float, num_devices: int, seed: int):
    """Devices (tier i % 4) with local train data, their local test splits and label counts."""
    parts = partition(data.y_train, num_devices, "dirichlet", seed=seed, alpha=alpha, min_size=10)
    rng = np.random.default_rng(seed)
    devices, local_tests, label_counts = [], {}, {}
    for i, idx in enumerate(parts):
        idx = rng.permutation(idx)
        cut = int(round(0.8 * len(idx)))
        train, test = idx[:cut], idx[cut:]
        info = DeviceInfo(f"dev{i:03d}", len(train), TIERS[i % len(TIERS)])
        devices.append(LocalDevice(info, data.x_train[train], data.y_train[train]))
        local_tests[info.device_id] = (data.x_train[test], data.y_train[test])
        label_counts[info.device_id] = np.bincount(data.y_train[train], minlength=data.num_classes).tolist()
    return devices, local_tests, label_counts


def build_methods(spec: dict, recipe: Recipe, reference: np.ndarray, label_counts: dict) -> dict[str, Method]:
    smallest = width_layout(static_bn(spec)).plan(float(TIERS[-1])).spec
    return {
        "FedAvg-S": FedAvg(smallest, recipe),
        "FedAvg-L": FedAvg(static_bn(spec), recipe),
        "HeteroFL": HeteroFL(spec, recipe),
        "FedRolex": FedRolex(spec, recipe),
        "FedDM (no tree)": FedDM(spec, recipe, tree=False),
        "FedDM + tree": FedDM(spec, recipe, reference=reference, label_counts=label_counts),
    }


def local_accuracy(spec: dict, weights: dict, test: tuple[np.ndarray, np.ndarray]) -> float:
    runtime = TorchRuntime()
    runtime.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    runtime.set_weights(weights)
    return runtime.evaluate(*test).accuracy


def mean_sent_accuracy(method: Method, weights: dict, devices: list[LocalDevice], local_tests: dict,
                       next_round: int) -> float:
    """Mean over devices of the accuracy, on its local test split, of what it would be sent."""
    instructions = method.configure_train(next_round, weights, [d.info for d in devices])
    return float(np.mean([local_accuracy(i.spec, i.weights, local_tests[i.device_id]) for i in instructions]))


def keep_last_updates(method: Method) -> list:
    """Make ``method`` remember the updates of its latest round (in the returned list)."""
    last: list = []
    aggregate = method.aggregate_train

    def aggregate_and_keep(round_number, global_weights, updates):
        last[:] = updates
        return aggregate(round_number, global_weights, updates)

    method.aggregate_train = aggregate_and_keep
    return last


def run(data, alpha: float, args) -> dict[str, dict]:
    devices, local_tests, label_counts = make_devices(data, alpha, args.devices, args.seed)
    reference = data.x_test[:REFERENCE_SIZE]
    test = (data.x_test[REFERENCE_SIZE:], data.y_test[REFERENCE_SIZE:])
    spec = model_spec(args.model, data.input_shape, data.num_classes)
    recipe = Recipe(epochs=args.epochs, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9, seed=args.seed)
    results = {}
    for label, method in build_methods(spec, recipe, reference, label_counts).items():
        started = time.perf_counter()
        last_updates = keep_last_updates(method)
        result = run_rounds(method, devices, args.rounds, test, seed=args.seed)
        accs = [row["accuracy"] for row in result.rows]
        sent = mean_sent_accuracy(method, result.weights, devices, local_tests, args.rounds + 1)
        trained = float(np.mean([local_accuracy(u.instruction.spec, u.weights, local_tests[u.device_id])
                                 for u in last_updates]))
        results[label] = {"curve": accs, "final": accs[-1], "last5": float(np.mean(accs[-5:])),
                          "sent": sent, "trained": trained, "seconds": time.perf_counter() - started}
        print(f"  {label}: final {accs[-1]:.4f}, last-5 {np.mean(accs[-5:]):.4f}, per-device sent "
              f"{sent:.4f}, trained {trained:.4f} ({results[label]['seconds']:.0f} s)", flush=True)
    return results


def plot(tables: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(6 * len(tables), 4.2), squeeze=False)
    for ax, ((dataset, alpha), results) in zip(axes[0], tables.items(), strict=True):
        for label, r in results.items():
            ax.plot(range(1, len(r["curve"]) + 1), r["curve"], label=label)
        ax.set_title(f"{dataset}, Dirichlet alpha = {alpha}")
        ax.set_xlabel("round")
        ax.set_ylabel("global test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="digits", help="digits or mnist (needs --data-dir)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--alphas", default="0.1,0.5")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=Path("runs/accuracy_width.png"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # small models: one thread is fastest, and the machine is shared
    data = load_dataset(args.dataset, args.data_dir, seed=args.seed)
    tables = {}
    for alpha in [float(a) for a in args.alphas.split(",")]:
        print(f"{args.dataset}, alpha {alpha}:", flush=True)
        tables[(args.dataset, alpha)] = run(data, alpha, args)
    print(f"\n{args.dataset}, {args.model}, {args.devices} devices (tiers {'/'.join(TIERS)} round-robin, all "
          f"every round), {args.rounds} rounds, {args.epochs} local epochs, seed {args.seed}")
    print(f"{'dataset':<8} {'alpha':>5}  {'method':<16} {'final acc':>9} {'last-5':>7} {'dev. sent':>9} "
          f"{'dev. trained':>12} {'time s':>7}")
    for (dataset, alpha), results in tables.items():
        for label, r in results.items():
            print(f"{dataset:<8} {alpha:>5}  {label:<16} {r['final']:>9.4f} {r['last5']:>7.4f} "
                  f"{r['sent']:>9.4f} {r['trained']:>12.4f} {r['seconds']:>7.0f}")
    plot(tables, args.plot)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
