"""Does the default recipe converge on devices of every data size? (issue 26)

Every cell is a real ``fedsdk-server simulate`` command (printed): FedAvg, small_cnn, an IID
partition of ``devices x samples`` training samples (``--train-samples``), i.e. ``samples``
per device, device processes over the embedded MQTT broker (``--grid mqtt``, the default:
the same code a fleet runs; ``--grid inprocess`` trains the same devices in one process).
``--recipe-flags`` are passed to every command (e.g. ``"--max-steps 0"``: the old, unbounded
default); nothing else about the recipe is set, so a cell measures ``simulate``'s defaults.

Digits has 1,437 training samples in all: a cell asking more than that gets
floor(1437 / devices) per device and is marked "(all)"; Fashion-MNIST has 60,000.

Reported per (dataset, devices, samples): over the seeds, the mean of the last 5 rounds'
accuracy and the best accuracy (mean ± std), the number of collapses (a run collapses when
the server's quality guard saw a divergence in it (summary.json ``divergence``: a collapse the
guard then rolled back still counts) or its last-5 mean is more than ``--collapse-drop`` (0.2)
below its best, e.g. 0.99 -> 0.27; a run whose command failed counts as a collapse), the
guard's rollbacks summed over the seeds, and the mean wall time of one run.
``--report-only`` summarises the runs already in ``--out``; a run already there (its
``bench.json``) is not run again, and a run stopped midway (a run directory without
``bench.json``) is continued with ``simulate --resume``, so a stopped grid resumes where it was.

    .venv/bin/python bench/convergence.py --data-dir /work/shared/datasets --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

TRAIN_SIZE = {"digits": 1437, "fashion_mnist": 60000}  # training split sizes (digits: 80 % of 1797)
TEST_SAMPLES = {"digits": None, "fashion_mnist": 2000}  # evaluate on a stratified 2,000 of 10,000


def per_device(dataset: str, devices: int, samples: int) -> tuple[int, bool]:
    """(samples per device, whether that is all the dataset has) for a cell."""
    most = TRAIN_SIZE[dataset] // devices
    return (most, True) if samples > most else (samples, False)


def simulate_command(args: argparse.Namespace, dataset: str, devices: int, samples: int, seed: int,
                     run_dir: Path) -> list[str]:
    """The ``fedsdk-server simulate`` command of one cell and seed."""
    cmd = [sys.executable, "-m", "server_toolkit.cli", "simulate", "--dataset", dataset,
           "--devices", str(devices), "--train-samples", str(devices * samples), "--partition", "iid",
           "--rounds", str(args.rounds), "--seed", str(seed), "--grid", args.grid,
           "--round-timeout", "900", "--run-dir", str(run_dir), "--label", f"{dataset}-{devices}x{samples}",
           "--setting", "convergence-bench", *args.recipe_flags.split()]
    if run_dir.is_dir() and any(run_dir.iterdir()):  # a run that was stopped: continue it
        cmd[cmd.index("--run-dir")] = "--resume"
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    if TEST_SAMPLES[dataset]:
        cmd += ["--test-samples", str(TEST_SAMPLES[dataset])]
    return cmd


def accuracies(run_dir: Path) -> list[float]:
    """The global test accuracy of every round of a run ([] when it wrote none)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row["accuracy"] for row in rows if "accuracy" in row]


def guard_record(run_dir: Path) -> tuple[int, int]:
    """(divergences the quality guard saw, rollbacks it made) in a run's summary.json (0, 0 without)."""
    path = run_dir / "summary.json"
    if not path.exists():
        return 0, 0
    summary = json.loads(path.read_text())
    return len(summary.get("divergence", [])), summary.get("guard", {}).get("rollbacks", 0)


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {std:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=None, help="Where fashion_mnist.npz lives.")
    parser.add_argument("--datasets", default="digits,fashion_mnist")
    parser.add_argument("--devices", default="1,2,5,10", help="Device counts, comma-separated.")
    parser.add_argument("--samples", default="100,900,5000", help="Samples per device, comma-separated.")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--grid", choices=["mqtt", "inprocess"], default="mqtt")
    parser.add_argument("--recipe-flags", default="", help='Extra simulate flags, e.g. "--max-steps 0".')
    parser.add_argument("--collapse-drop", type=float, default=0.2)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-convergence"))
    parser.add_argument("--report-only", action="store_true", help="Summarise the runs already in --out.")
    args = parser.parse_args()
    tag = "-".join(args.recipe_flags.replace("--", "").split()) or "default"
    rows = []
    for dataset in args.datasets.split(","):
        for devices in [int(d) for d in args.devices.split(",")]:
            cells = {per_device(dataset, devices, int(s)) for s in args.samples.split(",")}
            for samples, is_all in sorted(cells):
                results, walls, diverged, rollbacks = [], [], [], 0
                for seed in [int(s) for s in args.seeds.split(",")]:
                    run_dir = args.out / tag / f"{dataset}-{devices}x{samples}-s{seed}"
                    if not args.report_only and not (run_dir / "bench.json").exists():  # done runs are kept
                        cmd = simulate_command(args, dataset, devices, samples, seed, run_dir)
                        print("$", " ".join(cmd[1:]), flush=True)
                        started = time.monotonic()
                        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                              text=True)
                        wall, code = time.monotonic() - started, done.returncode
                        (run_dir / "bench.json").write_text(json.dumps({"wall_s": wall, "rc": code}))
                        if code:
                            print(f"  failed (exit {code}): {done.stderr.strip()[-300:]}", flush=True)
                    info_path = run_dir / "bench.json"
                    if not info_path.exists():
                        continue
                    info = json.loads(info_path.read_text())
                    accs = accuracies(run_dir)
                    walls.append(info["wall_s"])
                    results.append(accs if info["rc"] == 0 and len(accs) == args.rounds else None)
                    divergences, rolled = guard_record(run_dir)
                    diverged.append(divergences > 0)
                    rollbacks += rolled
                    print(f"  {dataset} {devices}x{samples} seed {seed}: {[round(a, 3) for a in accs]} "
                          f"({info['wall_s']:.0f} s; {divergences} divergence(s), {rolled} rollback(s))",
                          flush=True)
                done_runs = [r for r in results if r]
                last5 = [statistics.mean(r[-5:]) for r in done_runs]
                best = [max(r) for r in done_runs]
                collapses = sum(1 for r, fired in zip(results, diverged, strict=True) if r is None or fired or
                                max(r) - statistics.mean(r[-5:]) > args.collapse_drop)
                rows.append(f"| {dataset} | {devices} | {samples}{' (all)' if is_all else ''} | {tag} | "
                            f"{mean_std(last5)} | {mean_std(best)} | {collapses}/{len(results)} | "
                            f"{rollbacks} | {statistics.mean(walls):.0f} |" if walls else "")
    print(f"\nFedAvg, small_cnn, IID, {args.rounds} rounds, seeds {args.seeds}, grid {args.grid}")
    print("| dataset | devices | samples/device | recipe | last-5 accuracy | best accuracy | collapses | "
          "rollbacks | wall s/run |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(row for row in rows if row))


if __name__ == "__main__":
    main()
