"""Synchronous rounds vs buffered asynchronous aggregation with stragglers (issue 17).

Setting: Fashion-MNIST, ``--devices`` device processes (default 10) over the embedded
broker, ``--slow-devices`` of them (default 0.3, drawn by the seed) ``--slowdown`` times
slower (default 10: a straggler sleeps 9x its training time after training; ``fedsdk run
--slowdown``). Every arm is a real ``fedsdk-server simulate`` command (printed), so the
numbers are what a user's command produces:

* sync: FedAvg, ``--rounds`` rounds, every device every round (a round waits for the
  stragglers);
* async: ``--mode async --buffer K --max-staleness S``, as many versions as give the same
  number of device updates (``rounds x devices / K``), every device training whenever free.

Reported per arm (mean ± std over the seeds): wall time (seconds since the loop started,
from ``metrics.jsonl``: the sync rows' ``seconds`` summed, the async rows' ``wall_s``) until
the global test accuracy first reaches ``--target``, the same counted from the first
aggregation (every device's first task is mostly the runtime's warm-up, ~70 s on a loaded
2-core machine against ~3 s for a later task, and it is alike in both arms), the final
accuracy, total wall time; and the ratios async / sync of the times to target (the issue's
goal: <= 0.6, with the final accuracy at most 1 point lower). ``--report-only`` summarises
the runs already in ``--out``.

    .venv/bin/python bench/async.py --data-dir /work/shared/datasets --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def simulate_command(arm: str, args: argparse.Namespace, seed: int, run_dir: Path) -> list[str]:
    """The ``fedsdk-server simulate`` command of one arm and seed."""
    cmd = [sys.executable, "-m", "server_toolkit.cli", "simulate", "--dataset", "fashion_mnist",
           "--data-dir", args.data_dir, "--train-samples", str(args.train_samples),
           "--test-samples", str(args.test_samples), "--devices", str(args.devices),
           "--partition", args.partition, "--local-epochs", str(args.local_epochs), "--seed", str(seed),
           "--lr", str(args.lr), "--max-steps", str(args.max_steps),
           "--slow-devices", str(args.slow_devices), "--slowdown", str(args.slowdown),
           "--round-timeout", "600", "--run-dir", str(run_dir), "--label", arm, "--setting", "async-bench"]
    if arm == "sync":
        return cmd + ["--rounds", str(args.rounds)]
    versions = args.rounds * args.devices // args.buffer  # the same number of device updates
    return cmd + ["--mode", "async", "--rounds", str(versions), "--buffer", str(args.buffer),
                  "--max-staleness", str(args.max_staleness), "--eval-every", str(args.eval_every)]


def curve(run_dir: Path) -> list[tuple[float, float]]:
    """(wall seconds since the loop started, accuracy) per metrics row."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    points, elapsed = [], 0.0
    for row in rows:
        elapsed += row["seconds"]
        if "accuracy" in row:  # (--eval-every N: only every N-th version is evaluated)
            points.append((row.get("wall_s", elapsed), row["accuracy"]))
    return points


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    """The first wall time at which the accuracy reaches ``target`` (None: never)."""
    return next((t for t, acc in points if acc >= target), None)


def mean_std(values: list[float], fmt: str = ".3f") -> str:
    """``mean ± std`` of ``values`` ("never" when empty)."""
    if not values:
        return "never"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):{fmt}} ± {std:{fmt}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", required=True, help="Where fashion_mnist.npz lives.")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--devices", type=int, default=10)
    parser.add_argument("--slow-devices", type=float, default=0.3)
    parser.add_argument("--slowdown", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=10, help="Sync rounds (async: same updates).")
    parser.add_argument("--buffer", type=int, default=5)
    parser.add_argument("--max-staleness", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=1, help="Async: evaluate every N-th version.")
    parser.add_argument("--train-samples", type=int, default=6000)
    parser.add_argument("--test-samples", type=int, default=2000)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--partition", default="iid")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="Device learning rate (0.05: the recipe of the recorded figures, 2026-11-24).")
    parser.add_argument("--max-steps", type=int, default=0, help="Local step bound (0: none, as recorded).")
    parser.add_argument("--target", type=float, default=0.70, help="Test accuracy to reach.")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-async"))
    parser.add_argument("--report-only", action="store_true", help="Summarise the runs already in --out.")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"sync": [], "async": []}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in ("sync", "async"):
            run_dir = args.out / f"{arm}-s{seed}"
            if not args.report_only:
                cmd = simulate_command(arm, args, seed, run_dir)
                print("$", " ".join(cmd[1:]), flush=True)
                started = time.monotonic()
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                print(f"{arm} seed {seed}: command took {time.monotonic() - started:.0f} s", flush=True)
            points = curve(run_dir)
            reached = time_to(points, args.target)
            result = {"seed": seed, "to_target": reached, "final": points[-1][1], "wall": points[-1][0],
                      "after_first": None if reached is None else reached - points[0][0]}
            results[arm].append(result)
            print(f"{arm} seed {seed}: {json.dumps(result)}", flush=True)
    print(f"\nFashion-MNIST, {args.devices} devices, {args.slow_devices:.0%} {args.slowdown:g}x slower, "
          f"target accuracy {args.target}")
    print("| arm | time to target (s) | after the first aggregation (s) | reached | final accuracy | "
          "run wall time (s) |")
    print("|---|---|---|---|---|---|")
    for arm, rows in results.items():
        reached = [r["to_target"] for r in rows if r["to_target"] is not None]
        after = [r["after_first"] for r in rows if r["after_first"] is not None]
        print(f"| {arm} | {mean_std(reached, '.0f')} | {mean_std(after, '.0f')} | "
              f"{len(reached)}/{len(rows)} | "
              f"{mean_std([r['final'] for r in rows])} | {mean_std([r['wall'] for r in rows], '.0f')} |")
    for key, what in (("to_target", "time to target"),
                      ("after_first", "time to target after the first aggregation")):
        pairs = [(a[key], s[key]) for a, s in zip(results["async"], results["sync"], strict=True)
                 if a[key] is not None and s[key] is not None]
        if pairs:
            ratios = [a / s for a, s in pairs]
            print(f"async / sync {what}: {mean_std(ratios)} (per seed {[round(r, 2) for r in ratios]})")
    gaps = [100 * (a["final"] - s["final"]) for a, s in zip(results["async"], results["sync"], strict=True)]
    print(f"final accuracy async - sync: {mean_std(gaps, '.1f')} points")


if __name__ == "__main__":
    main()
