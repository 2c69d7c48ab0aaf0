"""RecipFL vs its baselines in a resource-skew fleet: strong and weak accuracy, separately.

Setting (RecipFL's MNIST set-up scaled to digits): all 1797 digits images are split by
quantity skew: ``--strong`` strong devices (default 2) hold 50% of them, IID; ``--weak``
weak devices (default 12) share the other half equally in count, each with a Dir(alpha)
label mix (alpha 0.5 as the paper, and 0.1). Each device's part is split 80/20 into local
train / local test, so a device is tested on its own distribution. Large model: LeNet-5
(21.4k parameters on 8x8). Small model, one table per scaling (as the paper's Table 3):
"width": LeNet-5 cut to width 0.3 (2.3k parameters; the paper's small/large ratio on MNIST
is 13%); "depth": LeNet-5's two conv blocks and a linear classifier (3.2k).
``--clients-per-round`` devices per round
(default min(M, 10), the paper's), ``--rounds`` rounds; every method trains with the same
recipe (SGD lr 0.01 as the authors' code, momentum 0.9, batch 16, ``--epochs`` local epochs;
lr 0.05 made the 2-channel small model collapse under AllSmall after ~40 rounds).

Methods:
* AllSmall: FedAvg of the small model on every device (strong devices too).
* ExclusiveFL: FedAvg of the large model among strong devices, of the small among weak.
* HeteroFL (width only): width-shared large model; strong devices ratio 1.0, weak 0.3 (the
  same small architecture as the others).
* DepthFL (depth only): LeNet-5 with an exit after its second conv block; weak devices train
  the prefix through it (the same small architecture as the others), strong devices
  everything (``depthfl``: sum of CE over exits, no self-distillation).
* RecipFL (GHN Adam lr 1e-3, the authors' code), RecipFL w/o KT (the strong device's small
  model trained with CE only), and RecipFL with GHN lr 1e-2 (sensitivity).

Measure (the paper's): in each of the last 20% of rounds, every device takes the model the
method would send it next round, its *target* model (strong: the large one; weak: the small
one; AllSmall: the small one for everybody; DepthFL: the weak device's prefix, evaluated at
its exit), fine-tunes it one epoch on its local train split (all methods, as the paper), and
is scored on its local test split. Reported: mean over strong devices and over weak
devices, averaged over those rounds; RecipFL's gain over the best of ExclusiveFL/AllSmall;
the hypernetwork's parameter memory (+ Adam state) and the server time per round (the
method's configure_train + aggregate_train, one thread).
Paper anchor: RecipFL +3.6 (strong) / +8.7 (weak) points over the best of those two.

    nice -n 10 .venv/bin/python bench/accuracy_recipfl.py                  # alpha 0.5 and 0.1, seed 0
    nice -n 10 .venv/bin/python bench/accuracy_recipfl.py --seeds 0,1,2 --alphas 0.5 --settings width
    nice -n 10 .venv/bin/python bench/accuracy_recipfl.py --rounds 10 --alphas 0.5 --methods recipfl,allsmall
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods.base import DeviceInfo, Method
from server_toolkit.methods.exit.depthfl import DepthFL
from server_toolkit.methods.recipfl.allsmall import AllSmall
from server_toolkit.methods.recipfl.exclusivefl import ExclusiveFL
from server_toolkit.methods.recipfl.recipfl import RecipFL
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.multi_exit import lenet5_multi_exit
from server_toolkit.models.zoo import lenet5
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds
from server_toolkit.sim.partition import partition
from server_toolkit.submodels.exit_split import prefix_spec

SMALL_RATIO = 0.3
METHODS = ("allsmall", "exclusivefl", "heterofl", "depthfl", "recipfl", "recipfl-nokt", "recipfl-lr1e-2")
APPLIES = {"heterofl": "width", "depthfl": "depth"}  # the baselines that need one kind of small model
LABELS = {"allsmall": "AllSmall", "exclusivefl": "ExclusiveFL", "heterofl": "HeteroFL", "depthfl": "DepthFL",
          "recipfl": "RecipFL", "recipfl-nokt": "RecipFL w/o KT", "recipfl-lr1e-2": "RecipFL lr 1e-2"}


@dataclasses.dataclass
class Fleet:
    devices: list[LocalDevice]  # tier "strong" / "weak"
    tests: dict[str, tuple[np.ndarray, np.ndarray]]
    strong: set[str]


def make_fleet(alpha: float, num_strong: int, num_weak: int, seed: int) -> tuple[Fleet, object]:
    data = load_dataset("digits", seed=seed)
    x = np.concatenate([data.x_train, data.x_test])
    y = np.concatenate([data.y_train, data.y_test])
    parts = partition(y, num_strong + num_weak, "quantity-skew", seed=seed, alpha=alpha,
                      num_strong=num_strong, strong_share=0.5)
    rng = np.random.default_rng(seed)
    devices, tests, strong = [], {}, set()
    for i, idx in enumerate(parts):
        idx = rng.permutation(idx)
        cut = int(round(0.8 * len(idx)))
        train, test = idx[:cut], idx[cut:]
        tier = "strong" if i < num_strong else "weak"
        info = DeviceInfo(f"dev{i:03d}", len(train), tier)
        devices.append(LocalDevice(info, x[train], y[train]))
        tests[info.device_id] = (x[test], y[test])
        if tier == "strong":
            strong.add(info.device_id)
    return Fleet(devices, tests, strong), data


def build(key: str, setting: str, input_shape, num_classes: int, recipe: Recipe,
          fleet: Fleet) -> tuple[Method, list[LocalDevice]]:
    """The method and the devices as it sees them (DepthFL's tiers are exit counts)."""
    spec = lenet5(input_shape, num_classes)
    with_exit = lenet5_multi_exit(input_shape, num_classes)
    small = f"width:{SMALL_RATIO}" if setting == "width" else prefix_spec(with_exit, 1)
    devices = fleet.devices
    if key == "allsmall":
        method: Method = AllSmall(spec, recipe, small_model=small)
    elif key == "exclusivefl":
        method = ExclusiveFL(spec, recipe, small_model=small)
    elif key == "heterofl":
        method = HeteroFL(spec, recipe, tier_ratios={"strong": 1.0, "weak": SMALL_RATIO})
    elif key == "depthfl":
        method = DepthFL(with_exit, recipe, user_recipe=True)
        devices = [dataclasses.replace(d, info=dataclasses.replace(d.info, tier="2" if d.info.tier == "strong"
                                                                     else "1")) for d in devices]
    else:
        method = RecipFL(spec, recipe, small_model=small, kt=key != "recipfl-nokt",
                         hn_lr=1e-2 if key == "recipfl-lr1e-2" else 1e-3)
    return method, devices


def target_model(instruction) -> tuple[dict, dict]:
    """(spec, weights) a device is evaluated on: the trainable teacher (a strong device's
    large model) when there is one, else what it trains."""
    teacher = getattr(instruction, "teacher", None)
    if teacher is not None and teacher.train:
        return teacher.spec, teacher.weights
    return instruction.spec, instruction.weights


def personal_accuracy(spec: dict, weights: dict, device: LocalDevice, test, recipe: Recipe) -> float:
    """Fine-tune one epoch on the device's train split (CE), score on its test split."""
    runtime = TorchRuntime()
    runtime.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    runtime.set_weights(weights)
    runtime.train(device.x, device.y, dataclasses.replace(recipe, epochs=1, loss="ce"))
    return runtime.evaluate(*test).accuracy


def run_method(key: str, setting: str, fleet: Fleet, data, args, seed: int) -> dict:
    recipe = Recipe(epochs=args.epochs, batch_size=16, optimizer="sgd", lr=0.01, momentum=0.9, seed=seed)
    method, devices = build(key, setting, data.input_shape, data.num_classes, recipe, fleet)
    by_id = {d.info.device_id: d for d in devices}
    first_scored = args.rounds - max(1, round(0.2 * args.rounds)) + 1
    strong_scores, weak_scores, server_s = [], [], []
    configure, aggregate = method.configure_train, method.aggregate_train

    def timed_configure(round_number, global_weights, infos):
        started = time.perf_counter()
        instructions = configure(round_number, global_weights, infos)
        server_s.append(time.perf_counter() - started)
        return instructions

    def timed_aggregate(round_number, global_weights, updates):
        started = time.perf_counter()
        new = aggregate(round_number, global_weights, updates)
        server_s[-1] += time.perf_counter() - started  # server time of the round: configure + aggregate
        if round_number >= first_scored:  # score every device on what it would get next round
            for instruction in configure(round_number + 1, new, [d.info for d in devices]):
                device = by_id[instruction.device_id]
                spec, weights = target_model(instruction)
                acc = personal_accuracy(spec, weights, device, fleet.tests[instruction.device_id], recipe)
                (strong_scores if instruction.device_id in fleet.strong else weak_scores).append(acc)
        return new

    method.configure_train, method.aggregate_train = timed_configure, timed_aggregate
    torch.manual_seed(seed)
    started = time.perf_counter()
    per_round = min(len(devices), args.clients_per_round)
    run_rounds(method, devices, args.rounds, seed=seed, clients_per_round=per_round)
    hn = getattr(method, "hypernet", None)
    return {"strong": float(np.mean(strong_scores)), "weak": float(np.mean(weak_scores)),
            "seconds": time.perf_counter() - started, "server_s": float(np.mean(server_s)),
            "hn_mb": hn.memory_bytes() * 3 / 2**20 if hn is not None else None}


def combine(results: list[dict]) -> dict:
    """Mean (and std over seeds) of one method's per-seed results."""
    out = {key: float(np.mean([r[key] for r in results])) for key in ("strong", "weak", "server_s")}
    out.update(strong_std=float(np.std([r["strong"] for r in results])),
               weak_std=float(np.std([r["weak"] for r in results])),
               seconds=float(sum(r["seconds"] for r in results)), hn_mb=results[0]["hn_mb"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alphas", default="0.5,0.1")
    parser.add_argument("--settings", default="width,depth", help="small model: width and/or depth scaling")
    parser.add_argument("--strong", type=int, default=2)
    parser.add_argument("--weak", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", default="0", help="comma-separated; each seed re-partitions and re-runs")
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny models; the machine is shared
    seeds = [int(v) for v in args.seeds.split(",")]
    tables = {}
    for setting in args.settings.split(","):
        for alpha in [float(a) for a in args.alphas.split(",")]:
            print(f"{setting} scaling, alpha {alpha}:", flush=True)
            runs: dict[str, list[dict]] = {}
            for seed in seeds:
                fleet, data = make_fleet(alpha, args.strong, args.weak, seed)
                for key in args.methods.split(","):
                    if APPLIES.get(key, setting) != setting:
                        continue
                    r = run_method(key, setting, fleet, data, args, seed)
                    runs.setdefault(key, []).append(r)
                    print(f"  seed {seed} {LABELS[key]:<15} strong {r['strong']:.4f}  weak {r['weak']:.4f}  "
                          f"server {r['server_s'] * 1000:.0f} ms/round  ({r['seconds']:.0f} s)", flush=True)
            tables[(setting, alpha)] = {key: combine(results) for key, results in runs.items()}
    print(f"\ndigits, quantity skew: {args.strong} strong devices (50% of the data, IID) + {args.weak} weak "
          f"(Dir(alpha)), {args.clients_per_round} per round, {args.rounds} rounds, {args.epochs} local "
          f"epochs, "
          f"LeNet-5 large, seeds {args.seeds}; accuracy = mean over the last 20% of rounds after 1 epoch "
          f"of local fine-tuning, on each device's own test split (± = std over seeds)")
    print(f"{'small':<6} {'alpha':>5}  {'method':<15} {'strong':>13} {'weak':>13} {'server ms/rd':>12} "
          f"{'HN MB':>6} {'time s':>7}")
    for (setting, alpha), rows in tables.items():
        for key, r in rows.items():
            mb = f"{r['hn_mb']:.1f}" if r["hn_mb"] is not None else "-"
            strong = f"{100 * r['strong']:.2f} ±{100 * r['strong_std']:.2f}"
            weak = f"{100 * r['weak']:.2f} ±{100 * r['weak_std']:.2f}"
            print(f"{setting:<6} {alpha:>5}  {LABELS[key]:<15} {strong:>13} {weak:>13} "
                  f"{1000 * r['server_s']:>12.0f} {mb:>6} {r['seconds']:>7.0f}")
        base = [rows[k] for k in ("allsmall", "exclusivefl") if k in rows]
        if "recipfl" in rows and base:
            best_strong, best_weak = max(b["strong"] for b in base), max(b["weak"] for b in base)
            print(f"{setting:<6} {alpha:>5}  RecipFL - best of ExclusiveFL/AllSmall: strong "
                  f"{100 * (rows['recipfl']['strong'] - best_strong):+.2f} pt, weak "
                  f"{100 * (rows['recipfl']['weak'] - best_weak):+.2f} pt (paper: +3.6 / +8.7)")
    print("HN MB = hypernetwork parameters + Adam moments (float32).")


if __name__ == "__main__":
    main()
