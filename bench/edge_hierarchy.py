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

from fedcore import modelspec
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.fedconv.relay import TRAIN, WARMUP, EdgeOptions, EdgeRelay, ForwardedTask
from server_toolkit.models.zoo import model_spec
from server_toolkit.reconstruct.average import weighted_average
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.partition import partition
from server_toolkit.sim.simulate import DEFAULT_RECIPE


def train(runtime: TorchRuntime, device: LocalDevice, instruction, seed: int) -> ClientUpdate:
    """One device's task, as the agent runs it: train, then smashed data when asked."""
    runtime.set_weights(instruction.weights)
    recipe = dataclasses.replace(instruction.recipe, seed=seed)
    stats = runtime.train(device.x, device.y, recipe)
    smashed = None
    if instruction.smashed is not None:
        pick = np.sort(np.random.default_rng(seed).permutation(len(device.y))[: instruction.smashed.samples])
        _, features = runtime.predict(device.x[pick])
        smashed = {"x": features.astype(np.float32), "y": device.y[pick].astype(np.int64)}
    return ClientUpdate(device.info.device_id, len(device.y), runtime.get_weights(),
                        {"samples": stats.samples, "loss": stats.loss}, instruction, smashed)


def edge_round(relay: EdgeRelay, runtime, devices: list[LocalDevice], weights, programs, seed: int):
    """What one edge does with one server task; returns (its model, its samples)."""
    relay.forward(ForwardedTask(programs, weights, DEFAULT_RECIPE))
    phases = [WARMUP, TRAIN] if relay.needs_warmup() else [TRAIN]
    by_id = {d.info.device_id: d for d in devices}
    for phase in phases:
        relay.phase = phase
        updates = [train(runtime, by_id[i.device_id], i, seed) for i in
                   relay.configure_train(0, weights, [d.info for d in devices])]
        out = relay.aggregate_train(0, weights, updates)
    return out, sum(len(d.y) for d in devices)


def run(variant: str, args, data, parts, spec) -> list[float]:
    method = FedAvg(spec, DEFAULT_RECIPE)
    weights = method.initial_weights(args.seed)
    devices = [LocalDevice(DeviceInfo(f"dev{i:02d}", len(idx)), data.x_train[idx], data.y_train[idx])
               for i, idx in enumerate(parts)]
    groups = [devices[e::args.edges] for e in range(args.edges)]
    options = EdgeOptions(smashed_samples=0 if variant == "clusters" else args.smashed, seed=args.seed)
    relays = [EdgeRelay(options) for _ in groups]
    runtime = TorchRuntime()
    runtime.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    programs = ((modelspec.FORMAT, modelspec.dumps(spec)),)
    accuracies, pairs = [], 0
    for rnd in range(1, args.rounds + 1):
        seed = args.seed * 1000 + rnd
        if variant == "flat":
            instructions = method.configure_train(rnd, weights, [d.info for d in devices])
            updates = [train(runtime, d, i, seed) for d, i in zip(devices, instructions, strict=True)]
            weights = method.aggregate_train(rnd, weights, updates)
        else:
            answers = [edge_round(relay, runtime, group, weights, programs, seed)
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
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_dataset("digits", seed=0)
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    print(f"digits, small_cnn, Dirichlet({args.alpha}), {args.devices} devices, {args.edges} edges, "
          f"{args.rounds} rounds, recipe {DEFAULT_RECIPE}")
    results: dict[str, list[tuple[float, float]]] = {}
    for seed in args.seeds:
        args.seed = seed
        parts = partition(data.y_train, args.devices, "dirichlet", seed=seed, alpha=args.alpha)
        for variant in ("flat", "clusters", "projection"):
            started = time.perf_counter()
            acc = run(variant, args, data, parts, spec)
            early = acc[min(4, len(acc) - 1)]
            results.setdefault(variant, []).append((early, acc[-1], float(np.mean(acc[-5:]))))
            print(f"seed {seed} {variant:>10}: round 5 {early:.3f}, final {acc[-1]:.3f}, "
                  f"last-5 mean {np.mean(acc[-5:]):.3f} ({time.perf_counter() - started:.0f} s)")
    print("\nvariant     round 5   final   last-5 mean   ratio to flat (round 5, last-5)   (mean over seeds)")
    flat = np.mean([r for r in results["flat"]], axis=0)
    for variant, rows in results.items():
        early, final, last5 = np.mean(rows, axis=0)
        print(f"{variant:>10}   {early:.3f}   {final:.3f}   {last5:.3f}   "
              f"{early / flat[0]:.3f}, {last5 / flat[2]:.3f}")


if __name__ == "__main__":
    main()
