"""Where a FedConv tier loses accuracy: its model right after the server's compression vs after
the devices' training, against the width sub-model the compressor starts from (issue 32).

For a FedConv run of ``bench/tiers.py`` / ``simulate`` (``--run-dir``, read: its config.json
and the global weights a checkpoint holds, ``--checkpoint``, default the newest), on the run's
own test split and device data, per tier ratio r < 1:

* ``block``: the top-left block of the global weights (an untrained delta compressor: what
  HeteroFL would send);
* ``compressed``: the model the next round sends (the tier's compressor tuned on the server data
  as in the run, ``FedConv.deployable``), i.e. right after the server stage;
* ``... trained``: that model after one round of the tier's devices' training (the run's
  recipe, each device from the same start, sample-weighted average) — what the dilation stage
  then receives;

plus the global model (tier 1.0). All accuracies on the run's test split.

    OMP_NUM_THREADS=1 python bench/fedconv_stages.py --run-dir runs/tiers/conv/alpha0.1/fedconv/seed0
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, load_numpy, state_numpy
from fedcore.torch_train import train_model
from server_toolkit.assembly import assemble
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.tier_accuracy import model_accuracy
from server_toolkit.reconstruct.average import weighted_average
from server_toolkit.sim.simulate import Simulation, SimulationConfig
from server_toolkit.submodels.width import extract
from server_toolkit.torch_utils import one_torch_thread


def trained(spec: dict, weights: dict, devices: list, recipe: Recipe) -> dict:
    """``weights`` of ``spec`` trained by each of ``devices`` (one round of ``recipe``), averaged
    by sample counts."""
    results = []
    for device in devices:
        model = build_model(spec)
        load_numpy(model, weights)
        train_model(model, device.x, device.y, recipe)
        results.append((state_numpy(model), float(len(device.y))))
    return weighted_average(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="Global weights (safetensors; default: the run's newest global_r*.safetensors).")
    args = parser.parse_args()
    config_path = args.run_dir / "config.json"
    if not config_path.exists():
        raise SystemExit(f"--run-dir {args.run_dir}: no config.json (not a run directory)")
    config = SimulationConfig(**json.loads(config_path.read_text()))
    if config.method != "fedconv":
        raise SystemExit(f"--run-dir {args.run_dir}: a {config.method} run, not fedconv")
    newest = max((args.run_dir / "checkpoints").glob("global_r*.safetensors"), default=None)
    checkpoint = args.checkpoint or newest
    if checkpoint is None:
        raise SystemExit(f"--run-dir {args.run_dir}: no checkpoints/global_r*.safetensors yet")
    round_number = int(checkpoint.stem.rpartition("_r")[2]) if "_r" in checkpoint.stem else 0
    setup = assemble(config.method, config.model, config.dataset, config.data_dir, config.device_recipe(),
                     config.method_options, config.seed, config.train_samples, config.test_samples)
    method = setup.method
    with tempfile.TemporaryDirectory() as tmp:
        simulation = Simulation(config, Path(tmp) / "run")
        devices, server = simulation.prepare_data(setup.data, method.server_fraction)
    method.attach_server_data(*server)
    weights = {k: np.asarray(v) for k, v in load_file(checkpoint).items()}
    test = (setup.data.x_test, setup.data.y_test)
    method._start_round(round_number)  # deployable() then tunes what round + 1 sends, with its seed
    print(f"{args.run_dir} {checkpoint.name}: global (tier 1.0) "
          f"{model_accuracy(method.global_spec, weights, *test):.3f}", flush=True)
    with one_torch_thread():
        for tier in dict.fromkeys(config.tiers):
            ratio = float(tier)
            if ratio == 1.0:
                continue
            spec = method.spec_of(ratio)
            block = extract(weights, method.plan(ratio).index_map)
            _, compressed = method.deployable(weights, DeviceInfo("probe", 1, tier))
            group = [d for d in devices if d.info.tier == tier]
            figures = {"block": block, "compressed": compressed}
            figures["block trained"] = trained(spec, block, group, method.recipe)
            figures["compressed trained"] = trained(spec, compressed, group, method.recipe)
            print(f"  tier {tier} ({len(group)} devices): " + ", ".join(
                f"{name} {model_accuracy(spec, w, *test):.3f}" for name, w in figures.items()), flush=True)


if __name__ == "__main__":
    main()
