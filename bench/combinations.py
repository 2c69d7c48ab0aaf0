"""The combination matrix: every supported pair of the seven aggregation features over a real
mosquitto, with real device processes (and edge processes where edges are in the pair), on
digits; every refused pair refused in one line with its reason.

Features (``server_toolkit/cli/combination_checks.py``): edges, async, secagg, central DP,
local DP, label noise, robust. FedAvg runs every supported pair except those with label noise
(FedAvg asks devices for no label histograms: a method-level refusal), which run HeteroFL;
HeteroFL also runs edges + SecAgg, edges + central DP, async + central DP, async + SecAgg
(behind edges) and robust + edges. Each run: 3 device processes (behind 1 edge process when
edges are in the pair), 2 rounds (versions in async mode) of 2 local epochs, IID; it must end
above ``Case.threshold`` and report the accountant's epsilon (central DP, local DP) or the
label epsilon in every row. Prints one table: pair, method, rounds, accuracy, seconds.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/combinations.py            # the whole matrix
    PYTHONPATH=. python bench/combinations.py --only "secagg+local DP/fedavg"

CI runs every case in ``tests/integration/test_combination_matrix.py`` (20 runs, 4 min 14 s on
an idle 2-core machine; BENCHMARKS.md, "Combination matrix").
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fedcore.recipe import Recipe
from server_toolkit.broker.mosquitto import MosquittoBroker
from server_toolkit.cli.combination_checks import (
    ASYNC,
    CENTRAL_DP,
    EDGES,
    FEATURES,
    LABEL_NOISE,
    LOCAL_DP,
    NEEDS_EDGES,
    REFUSED,
    ROBUST,
    SECAGG,
)
from server_toolkit.privacy.accountant import epsilon
from server_toolkit.sim.simulate import Simulation, SimulationConfig

CLIP, DELTA, LABEL_EPSILON = 1.0, 1e-5, 1.0
Z = {CENTRAL_DP: 0.02, LOCAL_DP: 0.02}  # noise multipliers (central: one draw on the sum; local: per device)
DEVICES, ROUNDS = 3, 2
RECIPE = Recipe(epochs=2, batch_size=16, lr=0.05, momentum=0.9)
SECAGG_SETTINGS = {"threshold": 0.5, "neighbours": None, "stage_timeout_s": 30.0}
HETEROFL_EXTRA = [(EDGES, SECAGG), (EDGES, CENTRAL_DP), (ASYNC, CENTRAL_DP), (ASYNC, SECAGG), (EDGES, ROBUST)]
FLAGS = {EDGES: ["--edges", "1"], ASYNC: ["--mode", "async"], SECAGG: ["--secagg"],
         CENTRAL_DP: ["--dp-clip", "1.0"], LOCAL_DP: ["--dp-clip", "1.0", "--dp-mode", "local"],
         LABEL_NOISE: ["--method", "heterofl", "--label-noise-epsilon", "1.0"],
         ROBUST: ["--robust", "median"]}


@dataclass(frozen=True)
class Case:
    """One run: the ``features`` on (``combination_checks`` names) and the method; it must end
    at accuracy >= ``threshold``."""

    features: tuple[str, ...]
    method: str
    threshold: float

    @property
    def name(self) -> str:
        return f"{'+'.join(self.features)}/{self.method}"

    def config(self, broker_url: str) -> SimulationConfig:
        on = set(self.features)
        privacy: dict = {"delta": DELTA}
        if CENTRAL_DP in on or LOCAL_DP in on:
            dp = LOCAL_DP if LOCAL_DP in on else CENTRAL_DP
            privacy.update(clip=CLIP, noise_multiplier=Z[dp], mode="local" if dp == LOCAL_DP else "central")
        if LABEL_NOISE in on:
            privacy["label_epsilon"] = LABEL_EPSILON
        if ROBUST in on:
            privacy["robust"] = "median"
        edges = 1 if EDGES in on or {ASYNC, SECAGG} <= on else 0  # async + SecAgg runs behind edges
        return SimulationConfig(
            method=self.method, devices=DEVICES, rounds=ROUNDS, edges=edges, partition="iid", seed=0,
            recipe=RECIPE.to_dict(), tiers=["1.0", "0.5"] if self.method == "heterofl" else None,
            device_runtime="torch", broker_url=broker_url, fleet="lab", round_timeout_s=60.0,
            privacy=privacy if len(privacy) > 1 else None, secagg=SECAGG_SETTINGS if SECAGG in on else None,
            mode="async" if ASYNC in on else "sync", buffer=DEVICES if ASYNC in on else None,
            max_staleness=4 if ASYNC in on else None)


def supported_pairs() -> list[tuple[str, str]]:
    """Every pair of ``FEATURES`` that is not refused (in ``FEATURES`` order)."""
    return [p for p in itertools.combinations(FEATURES, 2) if frozenset(p) not in REFUSED]


def cases() -> list[Case]:
    """The whole matrix (module docstring); thresholds from the measured runs (BENCHMARKS.md)."""
    out = [Case(p, "heterofl" if LABEL_NOISE in p else "fedavg", _threshold(p)) for p in supported_pairs()]
    out += [Case(p, "heterofl", _threshold(p)) for p in HETEROFL_EXTRA]
    return out


def _threshold(pair: tuple[str, ...]) -> float:
    """Digits after 2 rounds: 0.3 under DP noise (0.48 measured for edges + central DP, FedAvg)
    and for a median over an async buffer of 3 (0.44 measured), 0.5 otherwise (0.81 measured for
    edges + async, FedAvg); chance is 0.1."""
    slow = CENTRAL_DP in pair or LOCAL_DP in pair or {ASYNC, ROBUST} <= set(pair)
    return 0.3 if slow else 0.5


def problems(case: Case, rows: list[dict], summary: dict) -> list[str]:
    """What is wrong with a finished run of ``case`` (empty: nothing)."""
    on, found = set(case.features), []
    if len(rows) != ROUNDS:
        found.append(f"{len(rows)} rounds, not {ROUNDS}")
    if not rows or (rows[-1].get("accuracy") or 0.0) < case.threshold:
        found.append(f"accuracy {rows[-1].get('accuracy') if rows else None} < {case.threshold}")
    for i, row in enumerate(rows, start=1):
        if CENTRAL_DP in on or LOCAL_DP in on:
            dp = LOCAL_DP if LOCAL_DP in on else CENTRAL_DP
            want = epsilon("local" if dp == LOCAL_DP else "central", Z[dp], [1.0] * i, DELTA)
            if row.get("dp_epsilon") is None or abs(row["dp_epsilon"] - want) > 1e-9 * want:
                found.append(f"row {i}: dp_epsilon {row.get('dp_epsilon')} != the accountant's {want}")
        if LABEL_NOISE in on and row.get("label_epsilon") != i * LABEL_EPSILON:
            found.append(f"row {i}: label_epsilon {row.get('label_epsilon')} != {i * LABEL_EPSILON}")
    if (EDGES in on or {ASYNC, SECAGG} <= on) and summary.get("edges") != 1:
        found.append(f"summary says {summary.get('edges')} edges, not 1")
    return found


def run_case(case: Case, broker_url: str, run_dir: Path) -> dict:
    """Run ``case``; its table row (pair, method, rounds, accuracy, seconds) and its problems."""
    started = time.perf_counter()
    try:
        rows = Simulation(case.config(broker_url), run_dir).run().rows
        summary = json.loads((run_dir / "summary.json").read_text())
        found = problems(case, rows, summary)
    except RuntimeError as exc:  # e.g. no device came online: the case failed, the matrix goes on
        rows, found = [], [f"{type(exc).__name__}: {exc}"]
    return {"pair": "+".join(case.features), "method": case.method, "rounds": len(rows),
            "accuracy": rows[-1].get("accuracy") if rows else None, "seconds": time.perf_counter() - started,
            "problems": found}


def refused_flags() -> list[tuple[str, list[str], str]]:
    """Per refused pair (and async + SecAgg without edges): its name, ``simulate`` flags, reason.
    Central + local DP is left out: one ``--dp-mode`` flag cannot say both."""
    out = []
    for pair, why in [*REFUSED.items(), *NEEDS_EDGES.items()]:
        if pair != {CENTRAL_DP, LOCAL_DP}:
            names = [name for name in FEATURES if name in pair]
            out.append(("+".join(names), [f for name in names for f in FLAGS[name]], why))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[],
                        help="run only this case (pair/method, e.g. 'secagg+local DP/fedavg'); repeat")
    args = parser.parse_args()
    chosen = [c for c in cases() if not args.only or c.name in args.only]
    table = []
    with tempfile.TemporaryDirectory() as tmp, MosquittoBroker(workdir=Path(tmp) / "mosquitto") as broker:
        for case in chosen:
            row = run_case(case, broker.url, Path(tmp) / case.name.replace("/", "-").replace(" ", "_"))
            table.append(row)
            print(f"{row['pair']:<28} {row['method']:<9} {row['rounds']:>2} {row['accuracy'] or 0:.3f} "
                  f"{row['seconds']:6.1f} s  {'; '.join(row['problems']) or 'ok'}", flush=True)
    print("\n| pair | method | rounds | accuracy | seconds |\n|---|---|---|---|---|")
    for row in table:
        print(f"| {row['pair']} | {row['method']} | {row['rounds']} | {row['accuracy'] or 0:.3f} | "
              f"{row['seconds']:.1f} |")
    total = sum(r["seconds"] for r in table)
    bad = [r for r in table if r["problems"]]
    print(f"\n{len(table)} runs, {total:.0f} s, {len(bad)} with problems")


if __name__ == "__main__":
    main()
