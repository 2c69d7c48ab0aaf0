"""One reproduction per seed paper: every arm is a `fedsdk-server simulate` command.

    .venv/bin/python bench/reproduce.py FAMILY --data-dir DIR [--dataset fashion_mnist]
        [--seeds 0 1 2] [--jobs 2] [--runs-dir runs/reproduce] [--mqtt-smoke] [--list]

FAMILY is one of ``FAMILIES`` below (``--list`` prints them with their commands). For each
setting (e.g. Dirichlet α = 0.1 and 0.5), arm (the method and its baselines) and seed, the
bench runs ``fedsdk-server simulate --grid inprocess ... --run-dir RUNS/FAMILY/SETTING/ARM/seedS``
in a subprocess (``--jobs`` at a time, one torch thread each): the same code path, options and
metrics as a user's ``simulate`` (``--grid inprocess`` trains the devices in the server's
process; ``--grid mqtt`` gives the same numbers with device processes, see
``tests/integration/test_every_method.py``). A run whose directory already holds all its
rounds is not run again, so an interrupted reproduction continues where it stopped.

Printed per setting: each arm's final accuracy and the mean of its last 5 rounds, mean ± std
over seeds; then each claim of the paper: the method's last-5 mean minus the baseline's, per
seed (same seed = same partition, sampling and initial weights) and over seeds, and whether
it holds (the difference of the means exceeds both arms' std over seeds). ``--mqtt-smoke``
also runs the family's main method once over MQTT (device processes, embedded broker) for a
few rounds. ``fedsdk-server report RUNS/FAMILY --out report.html`` draws the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FEDSDK_SERVER = [sys.executable, "-m", "server_toolkit.cli"]
LAST_K = 5


@dataclass(frozen=True)
class Arm:
    """One line of a paper's comparison: a label and its ``simulate`` arguments."""

    label: str
    args: str


@dataclass(frozen=True)
class Setting:
    """A data setting the arms are compared in (e.g. a Dirichlet α)."""

    name: str
    args: str


@dataclass(frozen=True)
class Claim:
    """The paper's claim: ``method`` beats each of ``baselines`` on ``metric`` (``paper``: by how much)."""

    method: str
    baselines: tuple[str, ...]
    paper: str
    metric: str = "accuracy"


@dataclass(frozen=True)
class Family:
    """A seed paper's reproduction: common arguments, settings, arms, claims."""

    name: str
    paper: str
    common: str
    settings: tuple[Setting, ...]
    arms: tuple[Arm, ...]
    claims: tuple[Claim, ...]
    metrics: tuple[str, ...] = ("accuracy",)  # what the summary tables show (last-5 means)

    def command(self, setting: Setting, arm: Arm, seed: int, run_dir: Path, data: dict) -> list[str]:
        """The ``fedsdk-server simulate`` arguments of one run."""
        args = [*shlex.split(self.common), *shlex.split(setting.args), *shlex.split(arm.args),
                "--grid", "inprocess", "--seed", str(seed), "--run-dir", str(run_dir),
                "--label", arm.label, "--setting", f"{self.name} {data['dataset']} {setting.name}",
                "--dataset", data["dataset"]]
        if data.get("data_dir"):
            args += ["--data-dir", data["data_dir"]]
        return ["simulate", *args]


DIR = "--partition dirichlet --alpha"
WIDTH_TIERS = "--tiers 1.0,0.75,0.5,0.25"
# FedConv's server tuning (compression, dilation, learned aggregation) at 5 epochs, not the paper's
# 20/20/10: at 20 a round's dilations alone take ~70 s here (6 devices x 20 epochs), 25 min a run.
FEDCONV_EPOCHS = ("--method-option compress_epochs=5 --method-option dilate_epochs=5 "
                  "--method-option aggregate_epochs=5")
STANDALONE_TIERS = "small_cnn@1.0,small_cnn@0.75,small_cnn@0.5,small_cnn@0.25"  # each device alone, own width
# MH-pFedHN (seed 002): the personalised hypernetworks and their baselines. Fashion-MNIST,
# k-classes with 3 classes per device (the paper's non-IID_1: a few classes per client), 10
# devices of ~300 samples (~100 per class, the paper's CIFAR-100 / 50 clients has ~90).
# Settings: homogeneous (every device the LeNet-style CNN, the paper's Table 1) and
# heterogeneous (lenet, vgg8, resnet10, resnet12, resnet18 round-robin, 2 devices each, its
# Table 2). MH-pFedHNGD gets twice the rounds: its two stages (global model, then personal
# models with distillation) are one paper round and one round each here (methods/hypernet/mh_pfedhngd.py),
# so 2R rounds = the R paper rounds the other arms get; its last-5 are its last 5 stages.
# FedAvg = FedAvg within each architecture (the paper runs it per model type).
# Size: 15 rounds with 2 local epochs, chosen for <= 45 min on an idle 2-core machine (BENCHMARKS.md).
PERSONAL_TIERS = "lenet,vgg8,resnet10,resnet12,resnet18"
PERSONAL_ROUNDS = 15
# HypeMeFed (seed 000): 3 tiers of the multi-exit VGG (exits after blocks 2, 3, 4), 9 devices round-robin;
# FedAvg-S: everybody trains the tier-1 prefix; FedAvg-L here: everybody trains the whole model (an upper
# bound ignoring device limits); the multi-exit ablation without hypernetwork; HeteroFL at matched sizes.
# Sized for the 2-core machine: 2000 training images, 12 rounds, 2 local epochs (the paper: 5).
HYPEMEFED_COMMON = ("--model vgg_multi_exit --tiers 1,2,3 --devices 9 --rounds 12 --train-samples 2000 "
                    "--test-samples 1000 --local-epochs 2")
# RecipFL (Table 3, MNIST/LeNet-5): 2 strong devices hold half the data IID, the weak ones share the
# rest with Dir(α) label mixes. Small model = LeNet-5 at width 0.3 (6.1k of 61.7k parameters on 28x28,
# HeteroFL's weak sub-model); DepthFL's weak model is LeNet-5's conv trunk + an exit (6.6k).
RECIPFL_WEAK = 10
RECIPFL_TIERS = ",".join(["strong"] * 2 + ["weak"] * RECIPFL_WEAK)
RECIPFL_SMALL = "--model lenet5 --method-option small_model=width:0.3"
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family(
        "fedconv", "FedConv: +13.8 pts global accuracy over parameter sharing (HeteroFL, FedRolex), α = 0.1",
        "--model small_cnn --devices 8 --rounds 15 --train-samples 6000 --test-samples 2000 "
        "--local-epochs 2",
        (Setting("Dir(0.1)", f"{DIR} 0.1"), Setting("Dir(0.5)", f"{DIR} 0.5")),
        (Arm("FedConv", f"--method fedconv {WIDTH_TIERS} {FEDCONV_EPOCHS}"),
         Arm("HeteroFL", f"--method heterofl {WIDTH_TIERS}"),
         Arm("FedRolex", f"--method fedrolex {WIDTH_TIERS}"),
         Arm("FedAvg-S", "--method fedavg --model small_cnn@0.25"),
         Arm("Standalone", f"--method local --tiers {STANDALONE_TIERS}")),
        (Claim("FedConv", ("HeteroFL", "FedRolex"), "+13.8 pts (mean over both, α = 0.1)"),
         Claim("FedConv", ("FedAvg-S",), "FedConv > FedAvg (which trains the smallest model)")),
    ),
    Family(
        "feddm", "FedDM: moving windows + tree cooperation beat HeteroFL / FedRolex (no number given)",
        "--model small_cnn --devices 20 --rounds 20 --train-samples 8000 --test-samples 2000 "
        f"--local-epochs 2 {WIDTH_TIERS}",
        (Setting("Dir(0.1)", f"{DIR} 0.1"), Setting("Dir(0.5)", f"{DIR} 0.5")),
        (Arm("FedDM + tree", "--method feddm"),
         Arm("FedDM, no tree", "--method feddm --method-option tree=false"),
         Arm("HeteroFL", "--method heterofl"),
         Arm("FedRolex", "--method fedrolex")),
        (Claim("FedDM + tree", ("HeteroFL", "FedRolex"), "no number (2-page work in progress)"),
         Claim("FedDM, no tree", ("HeteroFL", "FedRolex"), "coverage balance alone")),
    ),
    Family(
        "hypemefed",
        "HypeMeFed: +5.12 pts over FedAvg-S (UniMiB, α = 0.5); generated deep layers beat the no-HN ablation",
        HYPEMEFED_COMMON,
        (Setting("Dir(0.1)", f"{DIR} 0.1"), Setting("Dir(0.5)", f"{DIR} 0.5")),
        (Arm("HypeMeFed", "--method hypemefed"),
         Arm("multi-exit, no HN", "--method depthfl"),
         Arm("FedAvg-S", "--method fedavg-s-exit"),
         Arm("FedAvg-L", "--method fedavg-l-exit"),
         # capacities balanced as the paper did: width 0.25 / 0.5 / 1.0 ~ the tier-1 / 2 / 3 prefixes
         Arm("HeteroFL", """--method heterofl --method-option 'tier_ratios={"1":0.25,"2":0.5,"3":1.0}'""")),
        (Claim("HypeMeFed", ("FedAvg-S",), "+5.12 pts (UniMiB, α = 0.5, Table 3)"),
         Claim("HypeMeFed", ("FedAvg-L",), "informative: FedAvg-L is the upper bound here"),
         Claim("HypeMeFed", ("multi-exit, no HN",), "the hypernetwork helps (ablation, Fig. 9)"),
         Claim("HypeMeFed", ("HeteroFL",), "HypeMeFed > HeteroFL (Table 3)")),
    ),
    Family(
        "personalised", "MH-pFedHN: MH-pFedHNGD > MH-pFedHN > pFedHN, all above Local and FedAvg",
        f"--model lenet --devices 10 --rounds {PERSONAL_ROUNDS} --train-samples 3000 --test-samples 1000 "
        "--partition k-classes --classes-per-client 3 --local-epochs 2",
        (Setting("homogeneous", "--tiers lenet"), Setting("heterogeneous", f"--tiers {PERSONAL_TIERS}")),
        (Arm("MH-pFedHNGD", f"--method mh-pfedhngd --rounds {2 * PERSONAL_ROUNDS}"),
         Arm("MH-pFedHN", "--method mh-pfedhn"),
         Arm("pFedHN", "--method pfedhn"),
         Arm("Local", "--method local"),
         Arm("FedAvg", "--method fedavg-groups")),
        (Claim("MH-pFedHNGD", ("MH-pFedHN", "pFedHN"),
               "hom +3.6 / +4.6, het +3.0 / +9.2 pts (CIFAR-100, 50 clients, non-IID_1, Tables 1-2)"),
         Claim("MH-pFedHN", ("pFedHN",), "hom +1.0, het +6.2 pts (same cells)"),
         Claim("MH-pFedHNGD", ("Local", "FedAvg"), "informative: hom +18.0 / +45.4, het +9.4 / +37.3 pts"),
         Claim("MH-pFedHN", ("Local", "FedAvg"), "informative: hom +14.4 / +41.8, het +6.4 / +34.3 pts")),
    ),
    Family(
        "recipfl", "RecipFL: +3.6 pts on strong devices, +8.7 pts on weak ones over the best baseline",
        f"--devices {2 + RECIPFL_WEAK} --partition quantity-skew --num-strong 2 --strong-share 0.5 "
        f"--tiers {RECIPFL_TIERS} --train-samples 6000 --test-samples 2000 --rounds 25 --local-epochs 2 "
        "--lr 0.01",
        (Setting("Dir(0.1)", "--alpha 0.1"), Setting("Dir(0.5)", "--alpha 0.5")),
        (Arm("RecipFL", f"--method recipfl {RECIPFL_SMALL}"),
         Arm("RecipFL w/o KT", f"--method recipfl {RECIPFL_SMALL} --method-option kt=false"),
         Arm("AllSmall", f"--method allsmall {RECIPFL_SMALL}"),
         Arm("ExclusiveFL", f"--method exclusivefl {RECIPFL_SMALL}"),
         Arm("HeteroFL", "--method heterofl --model lenet5 "
             """--method-option 'tier_ratios={"strong":1.0,"weak":0.3}'"""),
         Arm("DepthFL", "--method depthfl --model lenet5_multi_exit --method-option user_recipe=true "
             """--method-option 'tier_exits={"strong":2,"weak":1}'""")),
        (Claim("RecipFL", ("AllSmall", "ExclusiveFL", "HeteroFL", "DepthFL"),
               "+3.6 pts over the best baseline (mean over 4 tasks; MNIST +1.1)", "accuracy_strong"),
         Claim("RecipFL", ("AllSmall", "ExclusiveFL", "HeteroFL", "DepthFL"),
               "+8.7 pts over the best baseline (mean over 4 tasks; MNIST +2.5)", "accuracy_weak"),
         Claim("RecipFL", ("RecipFL w/o KT",), "KT helps (Fig. 6, no number)", "accuracy_weak"),
         Claim("RecipFL w/o KT", ("AllSmall",), "w/o KT beats AllSmall on weak devices (Fig. 6)",
               "accuracy_weak")),
        ("accuracy_strong", "accuracy_weak"),
    ),
)}


# -- running ----------------------------------------------------------------------------------
def run_dir_of(root: Path, family: Family, setting: Setting, arm: Arm, seed: int) -> Path:
    return root / family.name / _slug(setting.name) / _slug(arm.label) / f"seed{seed}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in text).strip("_")


def rounds_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def wanted_rounds(command: list[str]) -> int:
    """The run's rounds: the last ``--rounds`` wins (an arm may override the common one)."""
    values = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == "--rounds"]
    return int(values[-1]) if values else 20


def set_option(command: list[str], flag: str, value: str) -> None:
    """Set every occurrence of ``flag`` in ``command`` to ``value``."""
    for i, arg in enumerate(command[:-1]):
        if arg == flag:
            command[i + 1] = value


def run_one(command: list[str], run_dir: Path, log: Path) -> tuple[float, int, float]:
    """Run one simulate command (fresh directory); (wall seconds, exit code, CPU seconds).
    CPU seconds (user + system of the run's process) are what the run costs an idle machine;
    wall seconds grow with whatever else runs."""
    if run_dir.exists():
        for path in sorted(run_dir.rglob("*"), reverse=True):  # an interrupted run starts again
            path.unlink() if path.is_file() else path.rmdir()
        run_dir.rmdir()
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(["nice", "-n", "5", *FEDSDK_SERVER, *command], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # nice execs the server: same process
        proc.returncode = code = os.waitstatus_to_exitcode(status)
    return time.monotonic() - started, code, usage.ru_utime + usage.ru_stime


def reproduce(family: Family, seeds: list[int], root: Path, data: dict, jobs: int) -> None:
    todo = []
    for setting in family.settings:
        for arm in family.arms:
            for seed in seeds:
                run_dir = run_dir_of(root, family, setting, arm, seed)
                command = family.command(setting, arm, seed, run_dir, data)
                if rounds_done(run_dir) >= wanted_rounds(command) and (run_dir / "summary.json").is_file():
                    continue
                todo.append((command, run_dir))
    print(f"{family.name}: {len(todo)} run(s) to do, {jobs} at a time", flush=True)

    def one(item: tuple[list[str], Path]) -> None:
        command, run_dir = item
        seconds, code, cpu = run_one(command, run_dir, run_dir.parent / f"{run_dir.name}.log")
        status = "ok" if code == 0 else f"FAILED (exit {code}, see {run_dir.parent / run_dir.name}.log)"
        print(f"  {seconds:7.1f} s ({cpu:7.1f} s CPU)  {status}  fedsdk-server {shlex.join(command)}",
              flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, todo))


def mqtt_smoke(family: Family, root: Path, data: dict) -> None:
    """The family's main method once over MQTT (device processes, embedded broker), 3 rounds, 5 devices."""
    setting, arm = family.settings[0], family.arms[0]
    run_dir = root / family.name / "mqtt-smoke"
    command = family.command(setting, arm, 0, run_dir, data)
    command[command.index("--grid") + 1] = "mqtt"
    for flag, value in (("--rounds", "3"), ("--devices", "5")):
        set_option(command, flag, value)
    seconds, code, _ = run_one(command, run_dir, root / family.name / "mqtt-smoke.log")
    rows = read_rows(run_dir)
    accuracy = rows[-1].get("accuracy") if rows else None
    print(f"MQTT smoke ({arm.label}, {setting.name}, 5 device processes, 3 rounds): exit {code}, "
          f"{seconds:.0f} s, final accuracy {accuracy}", flush=True)


# -- the summary --------------------------------------------------------------------------------
def read_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_k(rows: list[dict], key: str, k: int = LAST_K) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return float(np.mean(values[-k:])) if values else None


def summarise(family: Family, seeds: list[int], root: Path) -> dict:
    """Print the tables and claims; returns {setting: {arm: {metric: [per-seed last-5]}}}."""
    out: dict = {}
    print(f"\n# {family.name}: {family.paper}")
    for setting in family.settings:
        print(f"\n## {setting.name} ({len(seeds)} seeds; last-{LAST_K} = mean of the last {LAST_K} rounds)")
        columns = " | ".join(f"last-{LAST_K} {m}" for m in family.metrics)
        print(f"| arm | final accuracy | {columns} | runs |")
        print("|---|---|" + "---|" * len(family.metrics) + "---|")
        table = out.setdefault(setting.name, {})
        for arm in family.arms:
            runs = [read_rows(run_dir_of(root, family, setting, arm, s)) for s in seeds]
            runs = [r for r in runs if r]
            finals = [last_k(r, "accuracy", 1) for r in runs]
            cells = [_mean_std([v for v in finals if v is not None])]
            table[arm.label] = {}
            for metric in family.metrics:
                values = [last_k(r, metric) for r in runs]
                table[arm.label][metric] = values
                cells.append(_mean_std([v for v in values if v is not None]))
            print(f"| {arm.label} | " + " | ".join(cells) + f" | {len(runs)} |")
        for claim in family.claims:
            ours = table.get(claim.method, {}).get(claim.metric, [])
            for baseline in claim.baselines:
                theirs = table.get(baseline, {}).get(claim.metric, [])
                print(f"claim {claim.method} > {baseline} ({claim.metric}; paper: {claim.paper}): "
                      + verdict(ours, theirs))
    return out


def verdict(ours: list, theirs: list) -> str:
    """Per-seed differences, their mean ± std, and whether the claim holds."""
    pairs = [(a, b) for a, b in zip(ours, theirs, strict=False) if a is not None and b is not None]
    if not pairs:
        return "no runs"
    diffs = [100 * (a - b) for a, b in pairs]
    a, b = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    margin = 100 * max(a.std(ddof=1) if len(a) > 1 else 0.0, b.std(ddof=1) if len(b) > 1 else 0.0)
    gap = 100 * (a.mean() - b.mean())
    holds = "holds" if gap > margin and gap > 0 else "does not hold"
    return (f"{gap:+.2f} pts (per seed {', '.join(f'{d:+.1f}' for d in diffs)}; std over seeds "
            f"≤ {margin:.2f}) -> {holds}")


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{np.mean(values):.4f} ± {np.std(values, ddof=1):.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", nargs="?", choices=sorted(FAMILIES))
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="Runs at a time (one torch thread each).")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/reproduce"))
    parser.add_argument("--mqtt-smoke", action="store_true", help="Also one short run over MQTT.")
    parser.add_argument("--summary-only", action="store_true", help="Print the tables of the runs there.")
    parser.add_argument("--list", action="store_true", help="Print the families and their commands.")
    parser.add_argument("--settings", nargs="+", default=None,
                        help="Only these settings of the family (names as --list prints them).")
    args = parser.parse_args()
    data = {"dataset": args.dataset, "data_dir": args.data_dir}
    if args.list or args.family is None:
        for family in FAMILIES.values():
            print(f"{family.name}: {family.paper}")
            for setting in family.settings:
                for arm in family.arms:
                    run_dir = run_dir_of(args.runs_dir, family, setting, arm, 0)
                    print("  fedsdk-server " + shlex.join(family.command(setting, arm, 0, run_dir, data)))
        return
    family = FAMILIES[args.family]
    if args.settings:
        unknown = sorted(set(args.settings) - {s.name for s in family.settings})
        if unknown:
            parser.error(f"{family.name} has no setting {', '.join(unknown)}; it has "
                         f"{', '.join(s.name for s in family.settings)}")
        chosen = tuple(s for s in family.settings if s.name in args.settings)
        family = dataclasses.replace(family, settings=chosen)
    started = time.monotonic()
    if not args.summary_only:
        reproduce(family, args.seeds, args.runs_dir, data, args.jobs)
        if args.mqtt_smoke:
            mqtt_smoke(family, args.runs_dir, data)
    summarise(family, args.seeds, args.runs_dir)
    print(f"\nwall time {time.monotonic() - started:.0f} s; "
          f"report: fedsdk-server report {args.runs_dir / family.name} --out {family.name}.html")


if __name__ == "__main__":
    main()
