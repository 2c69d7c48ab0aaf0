"""How evenly each width-sharing rule covers the global layers over many rounds.

Plays ``--rounds`` rounds of HeteroFL (fixed top-left), FedDM's four-corner scheme,
FedRolex (rolling) and FedDM (balanced rule) over ``--devices`` devices with the tiers
given round-robin, through the methods' own ``configure_train`` / ``aggregate_train``
(untrained weights: only the windows matter), and counts per weight element how many
client-rounds covered it. Prints, per layer, coverage statistics (min, mean, max,
max/min, coefficient of variation) and a text histogram of coverage / mean. "r<1" counts
only the sub-model clients (full-model clients add the same constant everywhere).

    .venv/bin/python bench/feddm_coverage.py [--model small_cnn] [--rounds 100]
"""

from __future__ import annotations

import argparse

import numpy as np

from fedcore.recipe import Recipe
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.width.coverage import coverage_counts
from server_toolkit.methods.width.feddm import FedDM
from server_toolkit.methods.width.fedrolex import FedRolex
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.zoo import model_spec

SCHEMES = {
    "heterofl": lambda spec: HeteroFL(spec, Recipe()),
    "four-corner": lambda spec: FedDM(spec, Recipe(), tree=False, rule="four_corner"),
    "fedrolex": lambda spec: FedRolex(spec, Recipe()),
    "feddm": lambda spec: FedDM(spec, Recipe(), tree=False),
}
BINS = [0.0, 0.5, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0, np.inf]


def coverage(method, devices: list[DeviceInfo], rounds: int, layers: list[str],
             partial_only: bool) -> dict[str, np.ndarray]:
    """Per layer: client-rounds covering each (out, in) element (kernel positions alike)."""
    weights = method.initial_weights(0)
    counts = {name: np.zeros(weights[name].shape[:2]) for name in layers}
    for rnd in range(1, rounds + 1):
        instructions = method.configure_train(rnd, weights, devices)
        for instruction in instructions:
            if partial_only and instruction.context["ratio"] >= 1.0:
                continue
            for name in layers:
                rows, cols = method.index_map(instruction.context)[name][:2]
                counts[name] += coverage_counts(counts[name].shape, [((rows, cols), 1.0)])
        updates = [ClientUpdate(i.device_id, 1, i.weights, {}, i) for i in instructions]
        weights = method.aggregate_train(rnd, weights, updates)  # FedDM assigns slots here
    return counts


def histogram(values: np.ndarray) -> str:
    relative = values.ravel() / values.mean()
    shares = np.histogram(relative, bins=BINS)[0] / relative.size
    return " ".join(f"{100 * s:5.1f}" for s in shares)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--tiers", default="1.0,0.75,0.5,0.25")
    args = parser.parse_args()
    spec = model_spec(args.model, (1, 8, 8), 10)
    tiers = args.tiers.split(",")
    devices = [DeviceInfo(f"dev{i:03d}", 100, tiers[i % len(tiers)]) for i in range(args.devices)]
    layout = HeteroFL(spec, Recipe()).layout
    layers = [f"{unit}.weight" for unit in layout.units]
    print(f"# coverage over {args.rounds} rounds, {args.devices} devices, tiers {args.tiers}, "
          f"model {args.model}")
    edges = "  ".join(f"[{lo:g},{hi:g})" for lo, hi in zip(BINS[:-1], BINS[1:], strict=True))
    print(f"# histogram: % of elements with coverage/mean in {edges}")
    header = f"{'layer':<22} {'clients':<7} {'scheme':<12} {'min':>6} {'mean':>7} {'max':>6} " \
             f"{'max/min':>8} {'cv':>6}   histogram %"
    print(header)
    print("-" * (len(header) + 40))
    for partial_only in (False, True):
        results = {name: coverage(make(spec), devices, args.rounds, layers, partial_only)
                   for name, make in SCHEMES.items()}
        for layer in layers:
            shape = "x".join(str(d) for d in results["heterofl"][layer].shape)
            for name, counts in results.items():
                c = counts[layer]
                ratio = c.max() / c.min() if c.min() > 0 else np.inf
                print(f"{layer + ' ' + shape:<22} {'r<1' if partial_only else 'all':<7} {name:<12} "
                      f"{c.min():6.0f} {c.mean():7.1f} {c.max():6.0f} {ratio:8.2f} {c.std() / c.mean():6.3f}"
                      f"   {histogram(c)}")
        print()


if __name__ == "__main__":
    main()
