"""A federated run on fused pte/1 programs equals the torch runtime's, round by round (issue 29).

The same ``simulate`` run three times over a real mosquitto, with real device processes:
digits, small_cnn, 4 devices (IID), 10 rounds of 2 local epochs (SGD momentum 0.9, batch 32),
seed 0. Arms: the torch runtime (``--programs torchspec/1 --device-runtime torch``), fused
``pte/1`` programs on the torch-free native runtime (``--programs pte/1 --device-runtime
executorch-native``, ``--pte-kernels fused``, the default) and the portable ``pte/1`` programs
(``--pte-kernels portable``). Prints each arm's per-round accuracy and the largest per-round
difference from the torch arm; exits 1 when a difference exceeds 0.01 or a round accepted fewer
than all devices, or when a device of the fused arm refused its program (the registry's
``rejections``: a refusal would mean that arm trained on portable kernels).
Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. python bench/fused_federated.py``.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from fedcore.recipe import Recipe
from server_toolkit.broker.mosquitto import MosquittoBroker
from server_toolkit.rounds.checkpoint import load_checkpoint
from server_toolkit.sim.simulate import Simulation, SimulationConfig

DEVICES, ROUNDS, SEED, TOLERANCE = 4, 10, 0, 0.01
RECIPE = Recipe(epochs=2, batch_size=32, optimizer="sgd", lr=0.05, momentum=0.9)
ARMS = {  # name: (program formats, device runtime, pte kernel set)
    "torch": (["torchspec/1"], "torch", "fused"),
    "pte/1 fused, executorch-native": (["pte/1"], "executorch-native", "fused"),
    "pte/1 portable, executorch-native": (["pte/1"], "executorch-native", "portable"),
}


def run_arm(name: str, broker_url: str, run_dir: Path) -> tuple[list[dict], float]:
    """One simulate run of ``name``'s arm: (its round rows, wall seconds)."""
    formats, runtime, kernels = ARMS[name]
    config = SimulationConfig(method="fedavg", model="small_cnn", dataset="digits", devices=DEVICES,
                              rounds=ROUNDS, partition="iid", recipe=RECIPE.to_dict(), seed=SEED,
                              broker_url=broker_url, fleet=run_dir.name, round_timeout_s=600.0,
                              program_formats=formats, device_runtime=runtime, pte_kernels=kernels)
    started = time.monotonic()
    rows = Simulation(config, run_dir).run().rows
    return rows, time.monotonic() - started


def refusals(run_dir: Path) -> list[tuple]:
    """The (device, code) of every task refusal the server recorded in ``run_dir``."""
    with sqlite3.connect(run_dir / "registry.sqlite") as db:
        return db.execute("SELECT device_id, code FROM rejections WHERE code LIKE 'device:%'").fetchall()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-portable", action="store_true", help="skip the portable pte/1 arm")
    args = parser.parse_args()
    arms = [a for a in ARMS if not (args.no_portable and "portable" in a)]
    results, finals, failed = {}, {}, False
    with tempfile.TemporaryDirectory() as tmp, MosquittoBroker(workdir=Path(tmp) / "mosquitto") as broker:
        for index, name in enumerate(arms):
            rows, seconds = run_arm(name, broker.url, Path(tmp) / f"arm{index}")
            results[name] = rows
            finals[name] = load_checkpoint(Path(tmp) / f"arm{index}")[1]
            accuracies = [round(r["accuracy"], 4) for r in rows]
            losses = [round(r["device_loss"], 6) for r in rows]
            print(f"{name}: accuracy per round {accuracies}, devices' training loss {losses} "
                  f"({seconds:.0f} s)", flush=True)
            refused = refusals(Path(tmp) / f"arm{index}")
            if refused:
                print(f"  {name}: devices refused their programs: {refused}")
                failed = True
            if len(rows) != ROUNDS or any(r["accepted"] != DEVICES for r in rows):
                print(f"  {name}: not every round accepted {DEVICES} updates: {rows}")
                failed = True
    reference = [r["accuracy"] for r in results["torch"]]
    for name in arms[1:]:
        diff = max(abs(r["accuracy"] - want) for r, want in zip(results[name], reference, strict=True))
        weights = max(float(abs(finals[name][k] - finals["torch"][k]).max()) for k in finals["torch"])
        print(f"{name} vs torch: largest per-round accuracy difference {diff:.4f}; final global "
              f"weights' largest absolute difference {weights:.2e}")
        failed |= diff > TOLERANCE
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
