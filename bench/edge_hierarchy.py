"""Does FedConv's edge hierarchy help? Flat FedAvg vs edges with clustering only vs edges with
clustering and the cross-cluster projection stage, in one process (no broker).

Digits, small_cnn, Dirichlet(alpha) over ``--devices`` devices dealt to ``--edges`` edges;
every device trains the full model (so the server side is plain FedAvg over the edges'
answers and the only difference between the variants is what the edges do). Each edge is
the real ``EdgeRelay``: warm-up round and clustering before its first round, per-cluster
averages, projection stage on smashed data computed by the torch runtime's ``predict``.
Prints the global accuracy (digits test split) per variant: final and mean of the last
five rounds, and the edges' cluster / pair counts.

    OMP_NUM_THREADS=1 nice -n 10 python bench/edge_hierarchy.py --rounds 15
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from fedcore.recipe import Recipe
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.fedconv.relay import TRAIN, WARMUP, EdgeOptions, EdgeRelay, ForwardedTask
from server_toolkit.methods.records import FEATURES
from server_toolkit.models.zoo import model_spec
from server_toolkit.reconstruct.average import weighted_average
from server_toolkit.rounds.local_device import LocalDevice, TorchRuntimePool, train_on_device
from server_toolkit.sim.partition import partition
from server_toolkit.sim.simulate import DEFAULT_RECIPE
from server_toolkit.torch_utils import one_torch_thread


def train(pool: TorchRuntimePool, device: LocalDevice, instruction, seed: int, recipe) -> ClientUpdate:
    """One device's task, as the agent runs it (the shared task runner: training, then the
    ``features`` output = smashed data when the edge asks for it), by ``recipe`` with ``seed``."""
    reports = dict(instruction.reports)
    if FEATURES in reports:  # the relay leaves the model to the device's default, as a task does
        reports[FEATURES] = {"model": "model", **reports[FEATURES]}
    recipe = dataclasses.replace(recipe, seed=seed)
    instruction = dataclasses.replace(instruction, recipe=recipe, reports=reports)
    with one_torch_thread():
        return train_on_device(device, instruction, pool)


def edge_round(relay: EdgeRelay, pool, devices: list[LocalDevice], weights, spec, seed: int, recipe):
    """What one edge does with one server task; returns (its model, its samples)."""
    relay.forward(ForwardedTask(TrainInstruction("", spec, weights, recipe)))
    phases = [WARMUP, TRAIN] if relay.needs_warmup() else [TRAIN]
    by_id = {d.info.device_id: d for d in devices}
    for phase in phases:
        relay.phase = phase
        updates = [train(pool, by_id[i.device_id], i, seed, recipe) for i in
                   relay.configure_train(0, weights, [d.info for d in devices])]
        out = relay.aggregate_train(0, weights, updates)
    return out, sum(len(d.y) for d in devices)


def bench_recipe(args) -> Recipe:
    """``simulate``'s default recipe with this bench's learning rate and step bound."""
    return dataclasses.replace(DEFAULT_RECIPE, lr=args.lr, momentum=0.9, max_steps=args.max_steps)


def run(variant: str, args, data, parts, spec) -> list[float]:
    recipe = bench_recipe(args)
    method = FedAvg(spec, recipe)
    weights = method.initial_weights(args.seed)
    devices = [LocalDevice(DeviceInfo(f"dev{i:02d}", len(idx)), data.x_train[idx], data.y_train[idx])
               for i, idx in enumerate(parts)]
    groups = [devices[e::args.edges] for e in range(args.edges)]
    options = EdgeOptions(smashed_samples=0 if variant == "clusters" else args.smashed, seed=args.seed)
    relays = [EdgeRelay(options) for _ in groups]
    pool = TorchRuntimePool()
    accuracies, pairs = [], 0
    for rnd in range(1, args.rounds + 1):
        seed = args.seed * 1000 + rnd
        if variant == "flat":
            instructions = method.configure_train(rnd, weights, [d.info for d in devices])
            updates = [train(pool, d, i, seed, recipe) for d, i in zip(devices, instructions, strict=True)]
            weights = method.aggregate_train(rnd, weights, updates)
        else:
            answers = [edge_round(relay, pool, group, weights, spec, seed, recipe)
                       for relay, group in zip(relays, groups, strict=True)]
            weights = weighted_average(answers)
            pairs += sum(r.summary.get("edge_pairs", 0) for r in relays)
        accuracies.append(method.evaluate(weights, data.x_test, data.y_test)["accuracy"])
    if variant != "flat":
        print(f"  {variant}: clusters per edge {[r.summary.get('edge_clusters') for r in relays]}, "
              f"linked cluster pairs summed over edges and rounds: {pairs}")
    return accuracies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=12)
    parser.add_argument("--edges", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--smashed", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=["flat", "clusters", "projection"])
    parser.add_argument("--lr", type=float, default=0.05,
                        help="Device SGD learning rate (0.05: the recipe of the figures of 2026-11-22).")
    parser.add_argument("--max-steps", type=int, default=0,
                        help="Bound on local steps per round (0: none, as in the recorded figures).")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_dataset("digits", seed=0)
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    print(f"digits, small_cnn, Dirichlet({args.alpha}), {args.devices} devices, {args.edges} edges, "
          f"{args.rounds} rounds, recipe {bench_recipe(args)}")
    results: dict[str, list[tuple[float, float]]] = {}
    for seed in args.seeds:
        args.seed = seed
        parts = partition(data.y_train, args.devices, "dirichlet", seed=seed, alpha=args.alpha)
        for variant in args.variants:
            started = time.perf_counter()
            acc = run(variant, args, data, parts, spec)
            early = acc[min(4, len(acc) - 1)]
            results.setdefault(variant, []).append((early, acc[-1], float(np.mean(acc[-5:]))))
            print(f"seed {seed} {variant:>10}: round 5 {early:.3f}, final {acc[-1]:.3f}, "
                  f"last-5 mean {np.mean(acc[-5:]):.3f} ({time.perf_counter() - started:.0f} s)")
    print("\nvariant     round 5   final   last-5 mean   ratio to flat (round 5, last-5)   (mean over seeds)")
    if "flat" not in results:
        return
    flat = np.mean([r for r in results["flat"]], axis=0)
    for variant, rows in results.items():
        early, final, last5 = np.mean(rows, axis=0)
        print(f"{variant:>10}   {early:.3f}   {final:.3f}   {last5:.3f}   "
              f"{early / flat[0]:.3f}, {last5 / flat[2]:.3f}")


if __name__ == "__main__":
    main()
