"""The common engine of the hypernetwork methods (pFedHN, MH-pFedHN, MH-pFedHNGD, seed 002).

The server holds one ``PersonalHypernet`` (``methods.hypernet.personal_hypernet``) and a table
of clients: each device seen gets its own embedding matrix and uses a head chosen by the
subclass (``head_key``/``make_head``). A round:

* ``configure_train``: generate each selected device's K parameters, unpack them in its
  architecture's parameter order and send them (BatchNorm running statistics are not
  generated and not sent: they stay on the device).
* ``aggregate_train``: in an order shuffled each round (seeded), one step per accepted
  update: regenerate that client's parameters, VJP with grad_outputs = generated - trained
  (``reconstruct.hypernet_step``), clip the total norm at ``max_norm`` (50), one Adam step
  (lr ``hn_lr`` 1e-2) on the extractor, the client's head and its embedding. The paper
  prints the opposite sign (Algorithm 1); that sign moves the generated weights away from
  the trained ones (``tests/unit/test_personal_hypernet.py`` shows both).

Where the paper is silent: devices train in parallel, so every device of a round starts
from parameters generated at round start; its step regenerates them from the hypernetwork
as already updated by the steps before it (the target is its trained weights, so
grad_outputs uses the fresh generation). The hypernetwork is the method's "global
weights": its tensors (``hn.<name>``) go into the run's safetensors checkpoints; the client
table goes into ``state.json``. Adam's moments are not saved: after ``--resume`` they
start again from zero.

Options (``--method-option key=value``, ``HypernetOptions``; ``fedsdk-server methods show
mh-pfedhn`` prints the table): ``embed_dim`` (64), ``hidden`` (128), ``hn_layers`` (3),
``chunk`` (3072, MH heads), ``hn_lr`` (1e-2), ``max_norm`` (50), ``embed_std`` (0.002),
``hn_optimizer`` (adam; sgd = momentum 0.9, the pFedHN authors' choice, whose step scales
with generated - trained where Adam's is ~hn_lr per element however small a device's update;
issue 32: neither lifts pFedHN off one class with 2 local steps per round,
``bench/pfedhn_reference.py``), plus the client recipe of ``methods.hypernet.personalized``.
A device's architecture comes from its tier (``DeviceInfo.tier``). The shape options
(embed_dim, hidden, hn_layers, embed_std, chunk) are checkpointed and a resumed run takes
them from its checkpoint.

``hn_lr``: the paper's 2e-4 goes with its client lr 1e-3; with the user's recipe (SGD lr
0.05, 5 epochs: the default when this was measured, lr 0.02 since issue 26) devices move their
weights ~50x further per round and the hypernetwork must follow: 2e-3 left MH-pFedHN at 0.59
and MH-pFedHNGD at 0.16 after 10 rounds on digits (4 devices), 1e-2 (the pFedHN authors'
released default) gave 0.96 / 0.94.
"""

from __future__ import annotations

import dataclasses
import random
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from fedcore.recipe import Recipe

from ...models.architectures import Architecture
from ...reconstruct.hypernet_step import hypernet_step
from ..base import ClientUpdate, DeviceInfo, TrainInstruction, Weights
from ..options import option
from .personal_hypernet import CHUNK, EMBED_DIM, EMBED_INIT_STD, HIDDEN, PersonalHypernet
from .personalized import PersonalizedMethod, PersonalOptions

PREFIX = "hn."
HN_OPTIMIZERS = ("adam", "sgd")


def make_optimizer(kind: str, params, lr: float) -> torch.optim.Optimizer:
    """The server's hypernetwork optimiser (``hn_optimizer``, module docstring)."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, foreach=True)
    # fused: one kernel for all of a step's tensors, 5x faster than the default on CPU
    return torch.optim.Adam(params, lr=lr, fused=True)


@dataclass(frozen=True)
class HnClient:
    """One device in the hypernetwork's table: its tier, embedding, head and K."""

    device_id: str
    tier: str
    embedding: str
    head: str
    num_params: int


@dataclass(frozen=True)
class HypernetOptions(PersonalOptions):
    """The hypernetwork's shape and update step (see the module docstring)."""

    embed_dim: int = option(EMBED_DIM, "Length of each client embedding vector (values).", minimum=1)
    hidden: int = option(HIDDEN, "Width of the shared feature extractor's layers (units).", minimum=1)
    hn_layers: int = option(3, "Linear+ReLU layers in the shared feature extractor.", minimum=1)
    chunk: int = option(CHUNK, "Parameters per chunk of an MH head: a client of K parameters gets "
                        "ceil(K / chunk) embedding rows (mh-pfedhn, mh-pfedhngd; pfedhn ignores it).",
                        minimum=1)
    hn_lr: float = option(1e-2, "Adam learning rate (> 0) of the server's hypernetwork step per update.",
                          minimum=0.0)
    max_norm: float = option(50.0, "Clip of the total gradient norm (> 0) of each hypernetwork step.",
                             minimum=0.0)
    embed_std: float = option(EMBED_INIT_STD, "Standard deviation of the N(0, std) initial client "
                              "embeddings.", minimum=0.0)
    hn_optimizer: str = option("adam", "The server's hypernetwork optimiser: adam (a step of ~hn_lr "
                               "per element whatever the update's size) or sgd (momentum 0.9, a step "
                               "proportional to generated - trained, the pFedHN authors' code).",
                               choices=HN_OPTIMIZERS)


class HypernetMethod(PersonalizedMethod):
    """Base of pFedHN and MH-pFedHN; subclasses choose the heads."""

    Options = HypernetOptions
    options: HypernetOptions

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        o = self.options
        if not (o.hn_lr > 0 and o.max_norm > 0):
            raise ValueError(f"{self.name} needs hn_lr > 0 and max_norm > 0 (got {o.hn_lr}, {o.max_norm})")
        self.settings = {"embed_dim": o.embed_dim, "hidden": o.hidden, "layers": o.hn_layers,
                         "init_std": o.embed_std}
        self.chunk, self.hn_lr, self.max_norm = o.chunk, o.hn_lr, o.max_norm
        self.clients: dict[str, HnClient] = {}
        self.seed = 0
        self._build(seed=0)
        self.last_round: dict = {}

    # -- what subclasses decide ----------------------------------------------------------
    @abstractmethod
    def head_key(self, arch: Architecture) -> str:
        """The key of the head generating ``arch``'s parameters (equal keys share a head)."""

    @abstractmethod
    def make_head(self, key: str, arch: Architecture) -> None:
        """Add head ``key`` for ``arch`` to ``self.hypernet``."""

    @abstractmethod
    def embedding_rows(self, arch: Architecture) -> int:
        """How many embedding vectors a client of ``arch`` has."""

    # -- the hypernetwork and its clients ------------------------------------------------
    def _build(self, seed: int) -> None:
        self.seed = seed
        self.hypernet = PersonalHypernet(seed=seed, **self.settings)
        self.optimizer = make_optimizer(self.options.hn_optimizer, self.hypernet.parameters(), self.hn_lr)
        for client in list(self.clients.values()):
            self._add_parts(client, self.architecture_named(client.tier))
        self._synced: Weights | None = None

    def _add_parts(self, client: HnClient, arch: Architecture) -> list[torch.nn.Parameter]:
        """Create ``client``'s embedding and (if new) head; returns the new parameters."""
        new: list[torch.nn.Parameter] = []
        if client.head not in self.hypernet.heads:
            self.make_head(client.head, arch)
            new += list(self.hypernet.heads[client.head].parameters())
        if client.embedding not in self.hypernet.embeddings:
            new.append(self.hypernet.add_embedding(client.embedding, self.embedding_rows(arch)))
        return new

    def add_client(self, device_id: str, tier: str) -> HnClient:
        """The table entry of ``device_id`` (created, with its parameters, on first sight)."""
        if device_id in self.clients:
            return self.clients[device_id]
        arch = self.architecture_named(tier)
        client = HnClient(device_id, tier, f"e{len(self.clients)}", self.head_key(arch), arch.num_params)
        self.clients[device_id] = client
        self.architectures[device_id] = tier
        new = self._add_parts(client, arch)
        if new:
            self.optimizer.add_param_group({"params": new})
        return client

    def generate(self, client: HnClient) -> torch.Tensor:
        """``client``'s flat (K,) parameter vector, with the autograd graph."""
        return self.hypernet.generate(client.embedding, client.head, client.num_params)

    def generated_weights(self, client: HnClient) -> Weights:
        """``client``'s generated parameters by name (numpy float32), buffers excluded."""
        with torch.no_grad():
            return self.unpack(client, self.generate(client).numpy())

    def unpack(self, client: HnClient, flat: np.ndarray) -> Weights:
        """A flat (K,) vector of ``client``'s architecture as parameters by name (float32)."""
        arch = self.architecture_named(client.tier)
        return {name: np.array(t, np.float32) for name, t in arch.unpack(flat).items()}

    def step_toward(self, client: HnClient, trained: np.ndarray, weight: float = 1.0,
                    train_extractor: bool = True, generated: torch.Tensor | None = None) -> None:
        """One clipped Adam step pulling ``client``'s generated vector toward ``trained`` (K,)."""
        params = self.hypernet.parameters_of(client.embedding, client.head, train_extractor)
        hypernet_step([self.generate(client) if generated is None else generated],
                      [torch.from_numpy(np.asarray(trained, np.float32))], params, self.optimizer,
                      max_norm=self.max_norm, weight=weight)

    # -- global weights = the hypernetwork's tensors -------------------------------------
    def hn_weights(self) -> Weights:
        """The checkpointed state: the hypernetwork's tensors as ``hn.<name>`` numpy arrays
        (plus a subclass's ``extra_weights``)."""
        weights = {PREFIX + k: v.detach().numpy().copy() for k, v in self.hypernet.state_dict().items()}
        weights.update(self.extra_weights())
        self._synced = weights
        return weights

    def extra_weights(self) -> Weights:
        """Tensors a subclass checkpoints besides the hypernetwork (names without ``hn.``)."""
        return {}

    def load_extra_weights(self, global_weights: Weights) -> None:
        """Restore what ``extra_weights`` returned."""

    def sync(self, global_weights: Weights) -> None:
        """Load ``global_weights`` into the hypernetwork unless they are what it returned last
        (they differ after ``--resume``)."""
        if global_weights is self._synced:
            return
        own = {k[len(PREFIX):]: torch.from_numpy(np.array(v)) for k, v in global_weights.items()
               if k.startswith(PREFIX)}
        self.hypernet.load_state_dict(own, strict=True)
        self.load_extra_weights(global_weights)
        self._synced = global_weights

    def initial_weights(self, seed: int) -> Weights:
        self.clients.clear()
        self._build(seed)
        return self.hn_weights()

    # -- the Method interface ------------------------------------------------------------
    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        return [TrainInstruction(device.device_id, arch.spec, self.generated_weights(client),
                                 self.client_recipe, {"architecture": arch.name})
                for device, arch, client in self.register(global_weights, devices)]

    def register(self, global_weights: Weights,
                 devices: list[DeviceInfo]) -> list[tuple[DeviceInfo, Architecture, HnClient]]:
        """Load the hypernetwork from ``global_weights`` and add the devices not yet in the
        client table; each device with its architecture and table entry."""
        self.sync(global_weights)
        registered = []
        for device in devices:
            arch = self.architecture_of(device)
            client = self.add_client(device.device_id, self.architectures[device.device_id])
            registered.append((device, arch, client))
        return registered

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        self.sync(global_weights)
        order = sorted(updates, key=lambda u: u.device_id)
        random.Random(self.seed * 100_003 + round_number).shuffle(order)
        distances = []
        for update in order:
            client = self.clients[update.device_id]
            arch = self.architecture_named(client.tier)
            trained = arch.flatten(update.weights)
            generated = self.generate(client)
            distances.append(float(torch.linalg.vector_norm(generated.detach() - torch.from_numpy(trained))))
            self.step_toward(client, trained, generated=generated)
        self.last_round = {"hn_distance": float(np.mean(distances)) if distances else None}
        return self.hn_weights()

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        out = super().aggregate_evaluate(round_number, updates)
        out.update({k: v for k, v in self.last_round.items() if v is not None})
        out.update({f"hn_{k}": v for k, v in self.hypernet.memory().items()})
        return out

    def personal_model(self, device_id: str) -> tuple[Architecture, Weights] | None:
        client = self.clients.get(device_id)
        if client is None:
            return None
        return self.architecture_named(client.tier), self.generated_weights(client)

    # -- new clients (``fedsdk-server hn adapt``) ----------------------------------------
    def adapt_client(self, device_id: str, tier: str, target: Callable[[Weights], np.ndarray], steps: int,
                     lr: float, on_step: Callable[[int, float], None] | None = None) -> dict:
        """Add ``device_id`` (architecture ``tier``) to a trained hypernetwork, frozen: only
        its new embedding, and a new head when no head fits its architecture yet, learn.

        Each of ``steps`` steps asks ``target(generated weights)`` for the trained flat (K,)
        vector to move toward (a fixed vector: fit the device's trained weights; local
        training from the generated weights: the paper's generalisation procedure), then
        makes one clipped VJP step with Adam(``lr``) on the new parameters only.
        ``on_step(step, distance)`` reports progress. Returns a summary dict.
        """
        if device_id in self.clients:
            raise ValueError(f"device {device_id!r} is already in the hypernetwork's table")
        arch = self.architecture_named(tier)
        new_head = self.head_key(arch) not in self.hypernet.heads
        client = self.add_client(device_id, tier)
        params = self.hypernet.parameters_of(client.embedding, client.head, train_extractor=False)
        if not new_head:
            params = params[:1]  # the embedding alone; the shared head stays frozen
        optimizer = torch.optim.Adam(params, lr=lr)
        distance = float("nan")
        for step in range(1, steps + 1):
            generated = self.generate(client)
            flat = generated.detach().numpy()
            trained = np.asarray(target(self.unpack(client, flat)), np.float32)
            distance = float(np.linalg.norm(flat - trained))
            hypernet_step([generated], [torch.from_numpy(trained)], params, optimizer, max_norm=self.max_norm)
            if on_step:
                on_step(step, distance)
        self.hn_weights()
        return {"device_id": device_id, "architecture": arch.name, "num_params": arch.num_params,
                "head": client.head, "new_head": new_head, "embedding_rows": self.embedding_rows(arch),
                "trained_parameters": sum(p.numel() for p in params), "last_distance": distance}

    # -- checkpoint state ----------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "seed": self.seed,
                "clients": [asdict(c) for c in self.clients.values()],
                "global_spec": self.global_spec, "client_recipe": self.client_recipe.to_dict(),
                "options": {"embed_dim": self.settings["embed_dim"], "hidden": self.settings["hidden"],
                            "hn_layers": self.settings["layers"], "embed_std": self.settings["init_std"],
                            "chunk": self.chunk, "hn_lr": self.hn_lr, "max_norm": self.max_norm}}

    def load_state_dict(self, state: dict) -> None:
        """Restore the client table and rebuild the hypernetwork's structure; its shape
        settings (embedding and hidden sizes, layers, chunk) come from the checkpoint, so a
        run resumed without its ``--method-option``s still fits its tensors."""
        super().load_state_dict(state)
        saved = state.get("options", {})
        shape = {"embed_dim": saved.get("embed_dim"), "hidden": saved.get("hidden"),
                 "layers": saved.get("hn_layers"), "init_std": saved.get("embed_std")}
        self.settings.update({k: v for k, v in shape.items() if v is not None})
        self.chunk = int(saved.get("chunk", self.chunk))
        settings = self.settings  # the options now name what the method runs with
        self.options = dataclasses.replace(
            self.options, embed_dim=int(settings["embed_dim"]), hidden=int(settings["hidden"]),
            hn_layers=int(settings["layers"]), embed_std=float(settings["init_std"]), chunk=self.chunk)
        self.clients = {c["device_id"]: HnClient(**c) for c in state.get("clients", [])}
        self._build(int(state.get("seed", self.seed)))
