"""FedConv vs its baselines on one partition, plus the compression ablation ladder.

Data (the paper's split, scaled to what this machine has): the dataset's test split is the
server's IID test set (global accuracy); 5 % of the training split (stratified) is the
server data; the rest is spread over ``--devices`` devices (default 20) by Dirichlet(alpha)
labels (min 10 samples), each device's part split 80/20 into local train / local test
(client accuracy). Tiers (shrinkage ratios) 1.0 / 0.75 / 0.5 / 0.25 round-robin; every
device takes part in every round; ``small_cnn``; device recipe SGD lr 0.05, momentum 0.9,
batch 16, ``--epochs`` local epochs; in-process rounds (``server_toolkit/sim/inprocess.py``).

Methods (same devices, seed and initial weights where they share a model):

* FedConv (defaults: compress/dilate 20 epochs, learned aggregation 10 epochs, MLR off);
  with ``--ablations`` also FedConv with plain sample-weighted averaging of the dilated
  models (the paper's "no weight vectors" ablation).
* FedAvg-S: every device trains the SR 0.25 model; HeteroFL; FedRolex.
* Serveralone: the full model trained on the server data only (``--server-epochs``).
* Standalone: every device trains its own tier's model alone (``rounds × epochs`` epochs).

Printed: global accuracy (final, mean of the last 5 rounds), client accuracy (mean over
devices, on their local test split, of the model they trained last round; for Serveralone
the server model, for Standalone their own), and FedConv's server seconds per round spent
compressing, dilating and aggregating.

Ablation ladder (``--ladder``, the paper's MNIST table): a global model trained centrally on
all device data (SGD lr 0.02, ``--ladder-epochs``), compressed to each SR with the
compressor's parts switched on one by one, each trained 20 epochs on the server data;
sub-model accuracy on the server test set.

    nice -n 10 .venv/bin/python bench/accuracy_fedconv.py                 # digits, alpha 0.1
    nice -n 10 .venv/bin/python bench/accuracy_fedconv.py --dataset mnist --data-dir DIR
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.data.datasets import load_dataset
from server_toolkit.data.server_slice import take_server_slice
from server_toolkit.methods.base import DeviceInfo, Method
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.fedconv.conv_compress import (
    PLAIN,
    BlockConfig,
    compressor,
    tier_spec,
    train_transform,
)
from server_toolkit.methods.fedconv.fedconv import FedConv
from server_toolkit.methods.fedconv.train_generated import Schedule
from server_toolkit.methods.width.fedrolex import FedRolex
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds
from server_toolkit.sim.partition import partition
from server_toolkit.submodels.width import static_bn

TIERS = ("1.0", "0.75", "0.5", "0.25")
STAGES = ("server_compress_s", "server_dilate_s", "server_aggregate_s")
LADDER = [  # (label, block, cosine schedule, epochs); BlockConfig(expand, mlr, weight_norm, init, keep_norm)
    ("top-left block, untrained (HeteroFL's sub-model)", PLAIN, False, 0),
    ("single conv, random init (paper)", BlockConfig(0, False, False, "random", False), False, 20),
    ("single conv", PLAIN, False, 20),
    ("+ 1x1 block with skip", BlockConfig(16, False, False, "delta", False), False, 20),
    ("+ MLR", BlockConfig(16, True, False, "delta", False), False, 20),
    ("+ weight norm", BlockConfig(16, True, True, "delta", False), False, 20),
    ("+ cosine lr (the paper's full block)", BlockConfig(16, True, True, "delta", False), True, 20),
    ("the paper's full block without the MLR", BlockConfig(16, False, True, "delta", False), True, 20),
    ("+ norm kept (our default)", BlockConfig(16, False, True, "delta", True), True, 20),
]


def make_devices(x: np.ndarray, y: np.ndarray, num_classes: int, alpha: float, num_devices: int, seed: int):
    """Devices (tier i % 4) with local train data, and their local test splits."""
    parts = partition(y, num_devices, "dirichlet", seed=seed, alpha=alpha, min_size=10)
    rng = np.random.default_rng(seed)
    devices, local_tests = [], {}
    for i, idx in enumerate(parts):
        idx = rng.permutation(idx)
        cut = int(round(0.8 * len(idx)))
        train, test = idx[:cut], idx[cut:]
        info = DeviceInfo(f"dev{i:03d}", len(train), TIERS[i % len(TIERS)])
        devices.append(LocalDevice(info, x[train], y[train]))
        local_tests[info.device_id] = (x[test], y[test])
    return devices, local_tests


def accuracy(spec: dict, weights: dict, data: tuple[np.ndarray, np.ndarray]) -> float:
    runtime = TorchRuntime()
    runtime.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    runtime.set_weights(weights)
    return runtime.evaluate(*data).accuracy


def train_alone(spec: dict, x: np.ndarray, y: np.ndarray, recipe: Recipe, epochs: int, seed: int) -> dict:
    """A fresh model of ``spec`` (seeded) trained ``epochs`` epochs on (x, y)."""
    runtime = TorchRuntime()
    runtime.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    from fedcore.torch_model import build_model, state_numpy

    runtime.set_weights(state_numpy(build_model(spec, seed=seed)))
    runtime.train(x, y, Recipe.from_dict({**recipe.to_dict(), "epochs": epochs, "seed": seed}))
    return runtime.get_weights()


def federated(label: str, method: Method, devices, local_tests, test, server, args) -> dict:
    started = time.perf_counter()

    def progress(row: dict) -> None:
        stages = " ".join(f"{k[7:-2]} {row[k]:.1f}s" for k in STAGES if k in row)
        print(f"    {label} round {row['round']}: accuracy {row['accuracy']:.3f} {stages}", flush=True)

    result = run_rounds(method, devices, args.rounds, test, seed=args.seed, on_round=progress,
                        server_data=server if method.server_fraction > 0 else None)
    accs = [row["accuracy"] for row in result.rows]
    client = float(np.mean([accuracy(u.instruction.spec, u.weights, local_tests[u.device_id])
                            for u in result.last_updates]))
    out = {"final": accs[-1], "last5": float(np.mean(accs[-5:])), "client": client,
           "seconds": time.perf_counter() - started}
    out.update({k: float(np.mean([row[k] for row in result.rows])) for k in STAGES if k in result.rows[0]})
    return out


def run(args) -> dict[str, dict]:
    data = load_dataset(args.dataset, args.data_dir, seed=args.seed)
    cut = take_server_slice(data.x_train, data.y_train, args.server_fraction, seed=args.seed)
    devices, local_tests = make_devices(*cut.rest, data.num_classes, args.alpha, args.devices, args.seed)
    test = (data.x_test, data.y_test)
    spec = model_spec(args.model, data.input_shape, data.num_classes)
    recipe = Recipe(epochs=args.epochs, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9, seed=args.seed)
    print(f"{args.dataset}: {len(cut.server[1])} server samples, {len(test[1])} server test samples, "
          f"{sum(len(d.y) for d in devices)} device training samples over {len(devices)} devices", flush=True)
    smallest = tier_spec(static_bn(spec), float(TIERS[-1]))
    methods: dict[str, Method] = {"FedConv": FedConv(spec, recipe, server_fraction=args.server_fraction,
                                                     seed=args.seed)}
    if args.ablations:
        methods["FedConv, plain averaging"] = FedConv(spec, recipe, server_fraction=args.server_fraction,
                                                      aggregation="average", seed=args.seed)
    methods.update({"FedAvg-S": FedAvg(smallest, recipe), "HeteroFL": HeteroFL(spec, recipe),
                    "FedRolex": FedRolex(spec, recipe)})
    results = {}
    for label, method in methods.items():
        results[label] = federated(label, method, devices, local_tests, test, cut.server, args)
        print(f"  {label}: {fmt(results[label])}", flush=True)

    started = time.perf_counter()
    alone = train_alone(static_bn(spec), *cut.server, recipe, args.server_epochs, args.seed)
    results["Serveralone"] = {"final": accuracy(static_bn(spec), alone, test), "last5": None,
                              "client": float(np.mean([accuracy(static_bn(spec), alone, t)
                                                       for t in local_tests.values()])),
                              "seconds": time.perf_counter() - started}
    print(f"  Serveralone: {fmt(results['Serveralone'])}", flush=True)
    started = time.perf_counter()
    own = []
    for d in devices:
        tier = tier_spec(static_bn(spec), float(d.info.tier))
        weights = train_alone(tier, d.x, d.y, recipe, args.rounds * args.epochs, args.seed)
        own.append(accuracy(tier, weights, local_tests[d.info.device_id]))
    results["Standalone"] = {"final": None, "last5": None, "client": float(np.mean(own)),
                             "seconds": time.perf_counter() - started}
    print(f"  Standalone: {fmt(results['Standalone'])}", flush=True)
    return results


def ladder(args) -> list[tuple[str, dict[float, float]]]:
    """Sub-model accuracy per SR for each rung of the compression ablation ladder."""
    data = load_dataset(args.dataset, args.data_dir, seed=args.seed)
    cut = take_server_slice(data.x_train, data.y_train, args.server_fraction, seed=args.seed)
    spec = static_bn(model_spec(args.model, data.input_shape, data.num_classes))
    recipe = Recipe(epochs=1, batch_size=16, optimizer="sgd", lr=0.02, momentum=0.9, seed=args.seed)
    weights = train_alone(spec, *cut.rest, recipe, args.ladder_epochs, args.seed)
    test = (data.x_test, data.y_test)
    rows = [("global model (trained centrally on all device data)", {1.0: accuracy(spec, weights, test)})]
    print(f"ladder: global model accuracy {rows[0][1][1.0]:.4f}", flush=True)
    for label, block, cosine, epochs in LADDER:
        accs = {}
        for ratio in (0.75, 0.5, 0.25):
            transform = compressor(spec, ratio, block, seed=args.seed)
            sub_spec = tier_spec(spec, ratio)
            if epochs:
                schedule = Schedule(epochs=epochs, cosine=cosine)
                train_transform(transform, weights, sub_spec, *cut.server, schedule, seed=args.seed)
            accs[ratio] = accuracy(sub_spec, transform.generate(weights), test)
        rows.append((label, accs))
        print(f"  {label}: " + ", ".join(f"SR {r}: {a:.4f}" for r, a in accs.items()), flush=True)
    return rows


def fmt(r: dict) -> str:
    def num(v):
        return "–" if v is None else f"{v:.4f}"
    extra = "".join(f", {k[7:-2]} {r[k]:.2f} s/round" for k in STAGES if k in r)
    return f"global final {num(r['final'])}, last-5 {num(r['last5'])}, client {num(r['client'])}" \
           f"{extra} ({r['seconds']:.0f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="digits", help="digits or mnist (needs --data-dir)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=5, help="local epochs per round")
    parser.add_argument("--server-fraction", type=float, default=0.05)
    parser.add_argument("--server-epochs", type=int, default=100, help="Serveralone's training epochs")
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ablations", action="store_true", help="also FedConv with plain averaging")
    parser.add_argument("--ladder", action="store_true", help="also the compression ablation ladder")
    parser.add_argument("--ladder-epochs", type=int, default=20,
                        help="epochs of central training of the ladder's global model")
    parser.add_argument("--skip-federated", action="store_true", help="only the ladder")
    args = parser.parse_args()
    torch.set_num_threads(1)  # small models: one thread is fastest, and the machine is shared
    results = {} if args.skip_federated else run(args)
    rungs = ladder(args) if args.ladder else []
    if results:
        print(f"\n{args.dataset}, {args.model}, Dirichlet alpha {args.alpha}, {args.devices} devices (SR "
              f"{'/'.join(TIERS)} round-robin, all every round), {args.rounds} rounds, {args.epochs} local "
              f"epochs, server data {args.server_fraction:.0%} of the training split, seed {args.seed}")
        print(f"{'method':<26} {'global final':>12} {'last-5':>7} {'client':>7} {'compress s':>10} "
              f"{'dilate s':>8} {'aggregate s':>11} {'total s':>7}")
        for label, r in results.items():
            cells = [("–" if r[k] is None else f"{r[k]:.4f}") for k in ("final", "last5", "client")]
            stages = [f"{r[k]:.2f}" if k in r else "–" for k in STAGES]
            print(f"{label:<26} {cells[0]:>12} {cells[1]:>7} {cells[2]:>7} {stages[0]:>10} {stages[1]:>8} "
                  f"{stages[2]:>11} {r['seconds']:>7.0f}")
        sharing = np.mean([results[m]["last5"] for m in ("HeteroFL", "FedRolex")])
        print(f"FedConv global (last-5) minus the mean of HeteroFL and FedRolex: "
              f"{100 * (results['FedConv']['last5'] - sharing):+.1f} points (paper: +13.8 on average)")
    if rungs:
        print("\ncompression ladder: sub-model accuracy on the server test set "
              "(paper, MNIST, SR not stated: 90.2 -> 93.15 -> 95.06 -> 96.8 -> 98.59 %, global 99.04 %)")
        for label, accs in rungs:
            print(f"  {label:<52} " + "  ".join(f"SR {r}: {a:.4f}" for r, a in accs.items()))


if __name__ == "__main__":
    main()
