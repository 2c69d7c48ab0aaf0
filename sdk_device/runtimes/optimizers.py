"""SGD (momentum, weight decay) and Adam over named numpy arrays, updated in place; both
add FedProx's proximal gradient mu * (w - w_start) when ``prox_mu`` > 0 (``Proximal``).

For runtimes whose engine only computes gradients (ExecuTorch, ONNX Runtime training
without an optimizer model): the update rules are torch.optim's single-tensor ones, so
every runtime follows the same trajectory as the torch runtime. Arrays may be views of
an engine's own parameter memory; ``step`` writes into them without reallocating.
Numpy only: no torch needed.
"""

from __future__ import annotations

import math

import numpy as np

from fedcore.recipe import Recipe

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam defaults
ADAM_EPS = 1e-8


class Proximal:
    """mu * (w - w_start) added to a gradient; w_start = a parameter's value the first time
    the optimiser sees it (the start of the step). Mirrors ``fedcore.torch_train``."""

    def __init__(self, mu: float) -> None:
        self.mu = mu
        self.start: dict[str, np.ndarray] = {}

    def __call__(self, name: str, param: np.ndarray, grad: np.ndarray) -> np.ndarray:
        if not self.mu:
            return grad
        start = self.start.setdefault(name, np.array(param, copy=True))
        return grad + self.mu * (param - start)


class SGD:
    """torch.optim.SGD with dampening 0 and no Nesterov: g += wd * p;
    buf = g on the first step, else momentum * buf + g; p -= lr * buf."""

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 prox_mu: float = 0.0) -> None:
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.proximal = Proximal(prox_mu)
        self.buffers: dict[str, np.ndarray] = {}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        for name, param in params.items():
            grad = self.proximal(name, param, grads[name])
            if self.weight_decay:
                grad = grad + self.weight_decay * param
            if self.momentum:
                buf = self.buffers.get(name)
                if buf is None:
                    buf = self.buffers[name] = np.array(grad, dtype=param.dtype, copy=True)
                else:
                    buf *= self.momentum
                    buf += grad
                grad = buf
            param -= self.lr * grad


class Adam:
    """torch.optim.Adam (no AMSGrad): g += wd * p; m = lerp(m, g, 1 - b1);
    v = b2 * v + (1 - b2) * g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""

    def __init__(self, lr: float, weight_decay: float = 0.0, betas: tuple[float, float] = ADAM_BETAS,
                 eps: float = ADAM_EPS, prox_mu: float = 0.0) -> None:
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.proximal = Proximal(prox_mu)
        self.steps = 0
        self.first: dict[str, np.ndarray] = {}
        self.second: dict[str, np.ndarray] = {}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        beta1, beta2 = self.betas
        self.steps += 1
        step_size = self.lr / (1.0 - beta1 ** self.steps)
        correction2_sqrt = math.sqrt(1.0 - beta2 ** self.steps)
        for name, param in params.items():
            grad = self.proximal(name, param, grads[name])
            if self.weight_decay:
                grad = grad + self.weight_decay * param
            m = self.first.setdefault(name, np.zeros_like(param))
            v = self.second.setdefault(name, np.zeros_like(param))
            m += (1.0 - beta1) * (grad - m)
            v *= beta2
            v += (1.0 - beta2) * grad * grad
            denom = np.sqrt(v) / correction2_sqrt + self.eps
            param -= step_size * (m / denom)


def make_optimizer(recipe: Recipe) -> SGD | Adam:
    """The optimizer a recipe asks for."""
    if recipe.optimizer == "adam":
        return Adam(recipe.lr, recipe.weight_decay, prox_mu=recipe.prox_mu)
    return SGD(recipe.lr, recipe.momentum, recipe.weight_decay, prox_mu=recipe.prox_mu)
