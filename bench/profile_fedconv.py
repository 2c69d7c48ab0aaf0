"""Where one FedConv round's time goes at ``bench/tiers.py --families conv``'s setting.

Runs ``--rounds`` rounds (default 1) of FedConv on small_cnn, tiers 1.0 / 0.5 / 0.25, 9 devices,
Fashion-MNIST (6000 / 2000 images), through ``simulate``'s in-process path under cProfile with a
CPU-time clock (``time.process_time``: the figure does not count time other processes took
from this one on a shared machine), then prints the run's per-stage server seconds (the metrics
row's ``server_*_s``, wall clock) and the functions with the most cumulative CPU time.

    OMP_NUM_THREADS=1 python bench/profile_fedconv.py --data-dir ../shared/datasets \\
        [--method-option compress_epochs=5] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path

from server_toolkit.sim.simulate import Simulation, SimulationConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=25, help="Functions listed (by cumulative CPU time).")
    parser.add_argument("--method-option", action="append", default=[],
                        help="KEY=JSON FedConv option (repeatable), e.g. compress_epochs=5.")
    parser.add_argument("--out", type=Path, default=None, help="Also save the pstats file here.")
    args = parser.parse_args()
    options = {}
    for text in args.method_option:
        key, _, value = text.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            raise SystemExit(f"--method-option {text!r}: expected KEY=JSON, e.g. compress_epochs=5") from None
    config = SimulationConfig(method="fedconv", dataset="fashion_mnist", data_dir=args.data_dir,
                              model="small_cnn", devices=9, rounds=args.rounds, alpha=args.alpha,
                              seed=args.seed, tiers=["1.0", "0.5", "0.25"], method_options=options,
                              grid="inprocess", train_samples=6000, test_samples=2000, setting="conv")
    profile = cProfile.Profile(time.process_time)
    with tempfile.TemporaryDirectory() as tmp:
        started, cpu = time.monotonic(), time.process_time()
        profile.enable()
        rows = Simulation(config, Path(tmp) / "run").run().rows
        profile.disable()
        wall, cpu = time.monotonic() - started, time.process_time() - cpu
    print(f"{args.rounds} round(s): wall {wall:.1f} s, CPU {cpu:.1f} s")
    for row in rows:
        figures = {k: round(v, 3) for k, v in row.items()
                   if k.startswith(("server_", "accuracy", "compress_", "dilate_")) and isinstance(v, float)}
        print(f"round {row.get('round')}: {figures}")
    if args.out:
        profile.dump_stats(args.out)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
