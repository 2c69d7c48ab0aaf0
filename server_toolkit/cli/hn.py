"""``fedsdk-server hn``: tools for runs of the hypernetwork methods (pfedhn, mh-pfedhn,
mh-pfedhngd).

``hn adapt`` brings a new device into a trained run without retraining the hypernetwork
(MH-pFedHN's generalisation to new clients): the feature extractor and every existing head
and embedding stay frozen; the device gets its own embeddings, and a new head when none
fits its architecture yet (mh-pfedhn: no head of its tau; pfedhn: an architecture never
seen), and only those learn. What they learn from, one of:

* ``--weights FILE.safetensors``: the device's own trained model (its parameters, as the
  device saved them after training on its data). The new embedding is fitted so that the
  generated parameters approach those weights: the device's knowledge moves into the
  hypernetwork's embedding space, its data never leaves the device.
* ``--data FILE.npz`` (``x``, ``y``, as ``fedsdk run --data``): the paper's procedure, for a
  device whose data is here (a simulation, or the device itself): each step generates the
  device's parameters, trains them locally with the run's client recipe, and steps toward
  the result. ``--test-fraction`` of the data is held out to report the generated model's
  accuracy before and after.

The result is written into the run: a new checkpoint
``checkpoints/global_r<N>_adapt_<device>.safetensors`` and ``state.json`` pointing to it
(the device joins the table), and the device is registered in the run's fleet registry with
its tier, so ``fedsdk-server run --resume`` serves it its personal model from then on.
``--export`` also writes the device's generated parameters (safetensors) for deployment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import click
import numpy as np

Weights = dict[str, np.ndarray]


def load_hypernet_run(run_dir: Path):
    """(method with its hypernetwork loaded, last round, state.json) of a hypernetwork run;
    click.ClickException explains what is wrong otherwise."""
    from fedcore.recipe import Recipe

    from ..methods import method_class
    from ..methods.hypernet.hypernetwork import HypernetMethod
    from ..rounds.checkpoint import load_checkpoint

    found = load_checkpoint(run_dir)
    if found is None:
        raise click.ClickException(f"{run_dir} has no checkpoint (state.json): run some rounds first")
    rnd, weights, state = found
    name = state.get("method", "")
    try:
        cls = method_class(name)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if not issubclass(cls, HypernetMethod):
        raise click.ClickException(f"the run's method {name!r} has no hypernetwork "
                                   f"(hn adapt works on pfedhn, mh-pfedhn, mh-pfedhngd runs)")
    saved = state.get("method_state", {})
    method = cls(saved["global_spec"], Recipe.from_dict(saved["client_recipe"]), user_recipe=True,
                 **saved.get("options", {}))
    method.load_state_dict(saved)
    method.sync(weights)
    return method, rnd, state


def _fit_weights(arch, path: Path) -> np.ndarray:
    """The flat parameter vector of a device's trained weights file (extra buffers are fine)."""
    from safetensors.numpy import load_file

    try:
        weights = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise click.ClickException(f"cannot read {path} as safetensors: {exc}") from None
    unexpected = sorted(set(weights) - {n for n, _ in arch.parameters} - set(arch.buffers))
    if unexpected:
        raise click.ClickException(f"{path} has tensors the {arch.name} architecture lacks: {unexpected[:5]}")
    try:
        flat = arch.flatten(weights)
    except (KeyError, ValueError) as exc:
        raise click.ClickException(f"{path} does not fit the {arch.name} architecture: {exc}") from None
    if not np.isfinite(flat).all():
        raise click.ClickException(f"{path} contains NaN or Inf")
    return flat


def adapt_run(run_dir: Path, device_id: str, tier: str, weights_path: Path | None = None,
              data_path: Path | None = None, steps: int = 500, lr: float | None = None,
              test_fraction: float = 0.25, seed: int = 0, export: Path | None = None, register: bool = True,
              on_step: Callable[[int, float], None] | None = None) -> dict:
    """Adapt a new device into the run in ``run_dir`` (see the module docstring); returns a
    summary (also stored in state.json under ``adapted``)."""
    from safetensors.numpy import save_file

    from sdk_device.data.npz import load_npz
    from sdk_device.protocol.topics import check_name

    from ..methods.base import DeviceInfo
    from ..rounds.local_device import (
        LocalDevice,
        TorchRuntimePool,
        local_test_accuracy,
        local_training_target,
    )

    if (weights_path is None) == (data_path is None):
        raise click.UsageError("give exactly one of --weights and --data")
    if steps < 1:
        raise click.UsageError("--steps must be at least 1")
    try:
        check_name("device id", device_id)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    method, rnd, state = load_hypernet_run(run_dir)
    try:
        arch = method.architecture_named(tier)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if device_id in method.clients:
        raise click.ClickException(f"device {device_id!r} is already in this run's hypernetwork")
    summary: dict = {}
    device, runtimes = None, TorchRuntimePool()
    x_held = y_held = np.zeros((0,))
    if weights_path is not None:
        fixed = _fit_weights(arch, weights_path)

        def target(generated: Weights) -> np.ndarray:
            return fixed
    else:
        from sdk_device.data.npz import DataError

        try:
            x, y = load_npz(data_path)
        except DataError as exc:
            raise click.ClickException(str(exc)) from None
        if tuple(x.shape[1:]) != tuple(arch.spec["input_shape"]):
            raise click.ClickException(f"{data_path}: samples are {x.shape[1:]}, the run's models take "
                                       f"{tuple(arch.spec['input_shape'])}")
        order = np.random.default_rng(seed).permutation(len(y))
        cut = len(y) - int(round(test_fraction * len(y)))
        if cut < 1:
            raise click.UsageError("--test-fraction leaves no training data")
        own, held = order[:cut], order[cut:]
        device = LocalDevice(DeviceInfo(device_id, len(own), tier), x[own], y[own])
        x_held, y_held = x[held], y[held]
        train_locally = local_training_target(device, arch.spec, method.client_recipe, runtimes, seed,
                                              arch.flatten)

        def target(generated: Weights) -> np.ndarray:
            trained = train_locally(generated)
            if "accuracy_before" not in summary:  # the fresh embedding's model, with the device's
                summary["accuracy_before"] = held_out_accuracy(generated)  # BN statistics of this pass
            return trained

    def held_out_accuracy(params: Weights) -> float | None:
        if device is None or len(y_held) == 0:
            return None
        return local_test_accuracy(device, x_held, y_held, arch.spec, params, runtimes)

    summary.update(method.adapt_client(device_id, tier, target, steps, lr or method.hn_lr, on_step))
    summary["accuracy_after"] = held_out_accuracy(method.generated_weights(method.clients[device_id]))
    summary["source"] = str(weights_path or data_path)
    summary["steps"] = steps

    ckpt_dir = run_dir / "checkpoints"
    path = ckpt_dir / f"global_r{rnd:04d}_adapt_{device_id}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file(method.hn_weights(), str(tmp))
    os.replace(tmp, path)
    new_state = {**state, "method_state": method.state_dict(), "checkpoint": path.name,
                 "adapted": [*state.get("adapted", []), summary]}
    tmp_state = run_dir / "state.json.tmp"
    tmp_state.write_text(json.dumps(new_state, indent=2))
    os.replace(tmp_state, run_dir / "state.json")
    summary["checkpoint"] = str(path)
    if export is not None:
        export.parent.mkdir(parents=True, exist_ok=True)
        save_file(method.generated_weights(method.clients[device_id]), str(export))
        summary["exported"] = str(export)
    registry_path = run_dir / "registry.sqlite"
    if register and registry_path.exists():
        from ..fleet.fleet_info import FleetInfo
        from ..fleet.fleet_store import fleet_file
        from ..fleet.registry import FleetRegistry

        info = FleetInfo.load(run_dir)  # a fleet with a security directory keeps its devices there
        security_dir = Path(info.security_dir) if info is not None and info.security_dir else None
        registry = FleetRegistry(registry_path, fleet_file(run_dir, security_dir))
        try:
            registry.add_device(device_id, tier=tier)
        finally:
            registry.close()
        summary["registered"] = True
    return summary


@click.group()
def hn() -> None:
    """Hypernetwork tools for pfedhn / mh-pfedhn / mh-pfedhngd runs."""


@hn.command()
@click.option("--run-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="The run (its checkpoints/ and state.json) whose hypernetwork gets the new device.")
@click.option("--device-id", required=True, help="The new device's id.")
@click.option("--tier", required=True, help="Its architecture: lenet, vgg8, resnet10/12/18, mlp...")
@click.option("--weights", "weights_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The device's trained weights (safetensors): fit the new embedding to them.")
@click.option("--data", "data_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The device's data (npz with x, y): generate, train locally, step; --steps times.")
@click.option("--steps", default=500, show_default=True, help="Hypernetwork steps (the paper: 500).")
@click.option("--lr", type=float, default=None, help="Adam learning rate (default: the run's hn_lr).")
@click.option("--test-fraction", default=0.25, show_default=True,
              help="With --data: share held out to report the accuracy before and after.")
@click.option("--seed", default=0, show_default=True, help="Seed of the adaptation.")
@click.option("--export", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the device's generated parameters here (safetensors).")
@click.option("--register/--no-register", default=True, show_default=True,
              help="Register the device (with its tier) in the run's fleet registry.")
def adapt(run_dir, device_id, tier, weights_path, data_path, steps, lr, test_fraction, seed, export,
          register) -> None:
    """Add a new device to a trained hypernetwork, frozen: learn only its embedding (and a
    new head for an unseen architecture), then save the run's updated state."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task(f"adapting {device_id}", total=steps)

        def on_step(step: int, distance: float) -> None:
            progress.update(bar, completed=step, description=f"adapting {device_id}: distance {distance:.3f}")

        summary = adapt_run(run_dir, device_id, tier, weights_path, data_path, steps, lr, test_fraction, seed,
                            export, register, on_step)
    head = "a new head" if summary["new_head"] else f"the shared head {summary['head']}"
    console.print(f"{device_id} ({summary['architecture']}, K = {summary['num_params']}): learned "
                  f"{summary['trained_parameters']} parameters ({summary['embedding_rows']} embedding rows, "
                  f"{head}); distance to its target {summary['last_distance']:.4f}")
    if summary.get("accuracy_after") is not None:
        console.print(f"held-out accuracy of its generated model: {summary['accuracy_before']:.3f} -> "
                      f"{summary['accuracy_after']:.3f}")
    console.print(f"saved {summary['checkpoint']}; state.json points to it"
                  + (f"; registered {device_id} (tier {tier})" if summary.get("registered") else ""))
    if summary.get("exported"):
        console.print(f"generated parameters written to {summary['exported']}")
