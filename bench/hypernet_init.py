"""What a personalised hypernetwork hands out before any training (issue 32).

For the issue-32 setting (Fashion-MNIST, lenet, 50 devices, k-classes with 2 classes each,
1,000 training samples) prints, per generated tensor of the first device's model: its std
and mean, the std of the same tensor in lenet's default (torch) initialisation, and the
spread of that tensor across the 50 devices (std over devices, averaged over elements);
then the generated model's logit std and predicted classes on 200 test images.

    PYTHONPATH=. python bench/hypernet_init.py --data-dir /work/shared/datasets --method pfedhn
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model
from server_toolkit.assembly import assemble
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.hypernet.personalized import fresh_parameters
from server_toolkit.sim.partition import partition


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="Directory holding fashion_mnist.npz.")
    parser.add_argument("--method", default="pfedhn", help="pfedhn, mh-pfedhn or mh-pfedhngd.")
    parser.add_argument("--devices", type=int, default=50, help="Devices in the fleet.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    setup = assemble(args.method, "lenet", "fashion_mnist", args.data_dir, Recipe(epochs=2), {}, 0,
                     1000, 1000)
    data, method = setup.data, setup.method
    parts = partition(data.y_train, args.devices, "k-classes", seed=0, classes_per_client=2, min_size=10)
    infos = [DeviceInfo(f"dev{i:03d}", len(idx), "lenet") for i, idx in enumerate(parts)]
    generated = [i.weights for i in method.configure_train(1, method.initial_weights(0), infos)]
    arch = method.architecture_named("lenet")
    fresh = fresh_parameters(arch, 0, "reference")
    print(f"{'tensor':22s} {'gen std':>8s} {'gen mean':>9s} {'init std':>9s} {'across devices':>15s}")
    for name, _ in arch.parameters:
        across = float(np.std(np.stack([g[name] for g in generated]), axis=0).mean())
        g = generated[0][name]
        print(f"{name:22s} {g.std():8.4f} {g.mean():+9.4f} {fresh[name].std():9.4f} {across:15.6f}")
    model = build_model(arch.spec, seed=0)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in generated[0].items()}, strict=False)
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(data.x_test[:200]))[-1]
    print(f"logit std {logits.std().item():.4f}; predicted classes on 200 test images:",
          np.bincount(logits.argmax(1).numpy(), minlength=10).tolist())


if __name__ == "__main__":
    main()
