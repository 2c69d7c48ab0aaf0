"""A small pFedHN written from the paper's algorithm (Shamsian et al., ICML 2021, Alg. 1),
to find where fedsdk's pFedHN departs from it (issue 32).

Same data and target net as the issue-32 setting: Fashion-MNIST (1,000 training / 1,000 test
images), 50 devices of 2 classes each (``sim.partition`` k-classes, 75 % of each part for
training: 15 samples), the hetero-zoo ``lenet``. The reference's own hypernetwork: an
``nn.Embedding`` per device (N(0, ``--embed-std``)), an MLP (Linear+ReLU x ``--layers``, width
``--hidden``) and one Linear(hidden, numel) per lenet tensor. One hypernetwork step:

    theta = h(v_i)                     (sample device i; generate its weights)
    theta~ = k SGD steps from theta     (--inner-steps, --inner-lr, --inner-batch, momentum 0.9)
    grads = d theta / d phi ^T (theta - theta~)   (autograd.grad, grad_outputs = theta - theta~)
    phi <- optimiser step               (--hn-opt sgd: SGD momentum 0.9 as the authors' code; adam)

``--clients-per-round C`` > 1 runs fedsdk's schedule instead: C devices train in parallel from
weights generated at round start, then C sequential steps (each regenerates its device's
weights first). Reported every ``--eval-every`` steps: the mean over the 50 devices of the
accuracy of each device's generated model on the test set re-weighted to its label counts
(fedsdk's personal ``accuracy``), and the fraction of devices whose model predicts one class.

    PYTHONPATH=. python bench/pfedhn_reference.py --data-dir /work/shared/datasets --hn-opt sgd
    PYTHONPATH=. python bench/pfedhn_reference.py --data-dir DIR --hn-opt adam   # fedsdk's step
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from torch import nn

from fedcore.torch_model import build_model
from server_toolkit.data.datasets import load_dataset
from server_toolkit.models.architectures import architecture
from server_toolkit.sim.partition import partition


class Hyper(nn.Module):
    """embedding -> MLP -> one linear head per target tensor."""

    def __init__(self, devices: int, shapes: dict[str, tuple[int, ...]], embed_dim: int, hidden: int,
                 layers: int, embed_std: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(devices, embed_dim)
        nn.init.normal_(self.embed.weight, std=embed_std)
        blocks: list[nn.Module] = []
        for i in range(layers):
            blocks += [nn.Linear(embed_dim if i == 0 else hidden, hidden), nn.ReLU()]
        self.mlp = nn.Sequential(*blocks)
        self.shapes = shapes
        self.heads = nn.ModuleList(nn.Linear(hidden, math.prod(s)) for s in shapes.values())

    def forward(self, device: int) -> dict[str, torch.Tensor]:
        f = self.mlp(self.embed.weight[device])
        pairs = zip(self.shapes.items(), self.heads, strict=True)
        return {name: head(f).view(shape) for (name, shape), head in pairs}


def local_train(net: nn.Module, weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                steps: int, lr: float, batch: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``steps`` SGD (momentum 0.9) steps of cross-entropy from ``weights``; the trained tensors."""
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(weights[name])
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    for _ in range(steps):
        pick = torch.randint(len(y), (min(batch, len(y)),), generator=gen)
        loss = nn.functional.cross_entropy(net(x[pick])[-1], y[pick])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {name: p.detach().clone() for name, p in net.named_parameters()}


@torch.no_grad()
def personal_accuracy(hn: Hyper, net: nn.Module, x: torch.Tensor, y: np.ndarray,
                      counts: np.ndarray) -> tuple[float, float]:
    """(mean label-weighted accuracy over devices, fraction of devices predicting one class)."""
    accs, constant = [], 0
    net.eval()
    for i in range(len(counts)):
        for name, p in net.named_parameters():
            p.copy_(hn(i)[name])
        pred = net(x)[-1].argmax(1).numpy()
        per_class = np.array([(pred[y == c] == c).mean() for c in range(counts.shape[1])])
        accs.append(float((counts[i] / counts[i].sum() * per_class).sum()))
        constant += len(np.unique(pred)) == 1
    return float(np.mean(accs)), constant / len(counts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True, help="Directory holding fashion_mnist.npz.")
    p.add_argument("--devices", type=int, default=50, help="Devices (each gets an embedding).")
    p.add_argument("--train-samples", type=int, default=1000, help="Training images in all.")
    p.add_argument("--classes", type=int, default=2, help="Classes per device (k-classes).")
    p.add_argument("--steps", type=int, default=1000, help="Hypernetwork steps in all.")
    p.add_argument("--clients-per-round", type=int, default=1, help="1: the paper; C: fedsdk's schedule.")
    p.add_argument("--inner-steps", type=int, default=50, help="Local SGD steps per device visit.")
    p.add_argument("--inner-lr", type=float, default=0.02, help="Local SGD learning rate.")
    p.add_argument("--inner-batch", type=int, default=16, help="Local batch size (samples).")
    p.add_argument("--hn-opt", choices=("sgd", "adam"), default="sgd", help="Hypernetwork optimiser.")
    p.add_argument("--hn-lr", type=float, default=1e-2, help="Hypernetwork learning rate.")
    p.add_argument("--embed-dim", type=int, default=64, help="Embedding length.")
    p.add_argument("--hidden", type=int, default=128, help="MLP width.")
    p.add_argument("--layers", type=int, default=3, help="MLP layers.")
    p.add_argument("--embed-std", type=float, default=1.0, help="Initial embedding std.")
    p.add_argument("--eval-every", type=int, default=100, help="Hypernetwork steps between evaluations.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the data split and initialisation.")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    data = load_dataset("fashion_mnist", a.data_dir, seed=a.seed).subset(a.train_samples, 1000, seed=a.seed)
    arch = architecture("lenet", data.input_shape, data.num_classes)
    parts = partition(data.y_train, a.devices, "k-classes", seed=a.seed, classes_per_client=a.classes,
                      min_size=10)
    rng = np.random.default_rng(a.seed)
    shards = []
    for idx in parts:
        idx = rng.permutation(idx)[:int(round(0.75 * len(idx)))]
        shards.append((torch.from_numpy(data.x_train[idx]), torch.from_numpy(data.y_train[idx]).long()))
    counts = np.stack([np.bincount(y.numpy(), minlength=data.num_classes) for _, y in shards])
    net = build_model(arch.spec, seed=a.seed)
    hn = Hyper(a.devices, dict(arch.parameters), a.embed_dim, a.hidden, a.layers, a.embed_std)
    opt = (torch.optim.SGD(hn.parameters(), lr=a.hn_lr, momentum=0.9) if a.hn_opt == "sgd"
           else torch.optim.Adam(hn.parameters(), lr=a.hn_lr))
    x_test, y_test = torch.from_numpy(data.x_test), data.y_test
    gen = torch.Generator().manual_seed(a.seed)
    started, step = time.perf_counter(), 0
    print(f"step 0: accuracy {personal_accuracy(hn, net, x_test, y_test, counts)}", flush=True)
    while step < a.steps:
        chosen = torch.randperm(a.devices, generator=gen)[:a.clients_per_round].tolist()
        with torch.no_grad():
            start = {i: hn(i) for i in chosen}
        trained = {i: local_train(net, start[i], *shards[i], a.inner_steps, a.inner_lr, a.inner_batch, gen)
                   for i in chosen}
        for i in chosen:
            theta = hn(i)
            names = list(theta)
            grads = torch.autograd.grad([theta[n] for n in names], list(hn.parameters()),
                                        grad_outputs=[theta[n].detach() - trained[i][n] for n in names],
                                        allow_unused=True)
            opt.zero_grad()
            for param, g in zip(hn.parameters(), grads, strict=True):
                param.grad = g
            nn.utils.clip_grad_norm_(hn.parameters(), 50.0)
            opt.step()
            step += 1
            if step % a.eval_every == 0:
                acc, constant = personal_accuracy(hn, net, x_test, y_test, counts)
                print(f"step {step}: accuracy {acc:.3f}, one-class devices {constant:.2f}, "
                      f"{time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
