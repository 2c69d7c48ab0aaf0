"""Hypernetwork cost: LRF (k = 25, 50, 100, 200, all) vs the naive full-weight hypernetwork.

Model: HypeMeFed's VGG on 32x32x3 input (channels 32-64-128-256, exits after blocks 2, 3,
4): four hypernetworks (block 2's two convs -> block 3's, block 3's -> block 4's), hidden
width 512 for both kinds (``--naive-hidden`` to change the naive one). Training data of a
round as on the paper's testbed (4 devices per tier): 8 clients trained blocks 2-3 and 4
of them block 4 too, so the stage-1 networks see 8 pairs and the stage-2 ones 4. Client
weights are seeded random VGG weights: cost does not depend on their values.

Measured, each configuration in a fresh subprocess (one after the other):

* peak memory = the process's peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) at
  the end minus its peak just before the hypernetworks were built: the hypernetworks,
  their gradients, the Adam state and the activations (the client weights, torch itself
  and the SVD inputs' sources are in the baseline);
* time per epoch = wall time of ``--epochs`` epochs over all four hypernetworks (one
  optimizer step per pair, the method's training loop) / epochs, after one warm-up epoch.

Paper anchors: 98.22 % less memory and 1.86x faster per round (testbed, k = 100);
2.46x faster per epoch (Table 1, k = 100 vs all). Run:

    .venv/bin/python bench/hypernet_cost.py
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CONFIGS = [("lrf", "25"), ("lrf", "50"), ("lrf", "100"), ("lrf", "200"), ("lrf", "all"), ("naive", "-")]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def worker(kind: str, rank: str, hidden: int, epochs: int) -> dict:
    """Measure one configuration in this (fresh) process; returns the figures."""
    import torch

    from fedcore.torch_model import build_model, state_numpy
    from server_toolkit.methods.exit.hypemefed import parse_rank
    from server_toolkit.methods.exit.hypernet_bank import HypernetBank
    from server_toolkit.models.zoo import vgg_multi_exit
    from server_toolkit.submodels.exit_split import conv_segments

    torch.set_num_threads(1)  # a steady figure on a shared 2-core machine
    spec = vgg_multi_exit((3, 32, 32), 10, channels=(32, 64, 128, 256))
    clients = [(2 if i < 4 else 3, state_numpy(build_model(spec, seed=i))) for i in range(8)]
    baseline = _peak_mb()
    bank = HypernetBank(conv_segments(spec), kind=kind, rank=parse_rank(rank if kind == "lrf" else None),
                        hidden=hidden, epochs=1, seed=0)
    bank.train_round(clients, round_number=0)  # warm-up epoch (allocations, first Adam state)
    bank.epochs = epochs
    started = time.perf_counter()
    bank.train_round(clients, round_number=1)
    per_epoch = (time.perf_counter() - started) / epochs
    params = bank.num_parameters()
    return {"kind": kind, "rank": rank, "params": params, "param_mb": params * 4 / 2**20,
            "peak_mb": _peak_mb() - baseline, "epoch_s": per_epoch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="Timed epochs per configuration.")
    parser.add_argument("--hidden", type=int, default=512, help="LRF hidden width.")
    parser.add_argument("--naive-hidden", type=int, default=512, help="Naive hidden width.")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "RANK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, rank = args.worker
        hidden = args.naive_hidden if kind == "naive" else args.hidden
        print(json.dumps(worker(kind, rank, hidden, args.epochs)))
        return
    rows = []
    for kind, rank in CONFIGS:
        cmd = [sys.executable, __file__, "--worker", kind, rank, "--epochs", str(args.epochs),
               "--hidden", str(args.hidden), "--naive-hidden", str(args.naive_hidden)]
        done = subprocess.run(cmd, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1",
                                                                        **__import__("os").environ})
        if done.returncode != 0:
            print(f"{kind} k={rank}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"measured {kind} k={rank}", file=sys.stderr, flush=True)
    naive = next((r for r in rows if r["kind"] == "naive"), None)
    print("\nHypernetwork cost, VGG 32-64-128-256 on 32x32x3, 4 hypernetworks, 8+4 training pairs, "
          f"LRF hidden {args.hidden}, naive hidden {args.naive_hidden}, 1 thread, {args.epochs} timed epochs")
    print(f"{'hypernet':<10} {'k':>4} {'params':>12} {'param MB':>9} {'peak MB':>9} {'s/epoch':>8} "
          f"{'memory vs naive':>16} {'speed-up':>9}")
    for r in rows:
        mem = f"{100 * (1 - r['peak_mb'] / naive['peak_mb']):.2f}% less" if naive and r is not naive else "-"
        speed = f"{naive['epoch_s'] / r['epoch_s']:.2f}x" if naive and r is not naive else "1.00x"
        print(f"{r['kind']:<10} {r['rank']:>4} {r['params']:>12,} {r['param_mb']:>9.1f} {r['peak_mb']:>9.1f} "
              f"{r['epoch_s']:>8.3f} {mem:>16} {speed:>9}")
    lrf_all = next((r for r in rows if r["kind"] == "lrf" and r["rank"] == "all"), None)
    lrf_100 = next((r for r in rows if r["kind"] == "lrf" and r["rank"] == "100"), None)
    if lrf_all and lrf_100:
        print(f"LRF k=100 vs LRF k=all: {lrf_all['epoch_s'] / lrf_100['epoch_s']:.2f}x per epoch "
              "(Table 1's comparison: 2.46x)")
    print("Paper anchors (k=100 vs naive): 98.22% less memory, 1.86x faster per round (testbed).")


if __name__ == "__main__":
    main()
