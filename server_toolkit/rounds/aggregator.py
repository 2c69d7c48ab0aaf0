"""The aggregation stack: how a round's updates become the next global model.

The round loop (``rounds/loop.py``, ``rounds/async_loop.py``) holds one ``Aggregator`` and
calls it; it knows no feature by name. An ``Aggregator`` is a layer wrapping the layer below
(``inner``), after Flower's strategy wrappers: each call a layer does not change goes down
unchanged, and the bottom (``MethodAggregate``) is the method itself. The run's options pick
the layers once, in the server assembly (``assembly.py:aggregation_stack``); top to bottom:

* ``SecureSum`` (``secagg/layer.py``): ``--secagg``;
* ``NormBound`` (``rounds/norm_bound.py``): ``--norm-bound`` (not with central DP);
* ``PrivateAggregate`` (``privacy/layer.py``): ``--dp-*``, ``--label-noise-epsilon``, ``--robust``;
* ``StalenessFold`` (``rounds/staleness.py``): ``--mode async``;
* ``EdgeFold`` (``edge/layer.py``): always (edges say hello themselves);
* ``MethodAggregate`` (here): always, the bottom.

The calls, in the order a round makes them: ``admit`` (may the round run at this sampling
rate: ``StopRun`` ends the run cleanly), ``configure`` (the devices' instructions),
``finish`` (each instruction's last stamps), ``unpack`` (results standing for several
updates, as those updates), ``aggregate``, then ``state_dict`` with every checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..methods.base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from .grid import Exchange


class StopRun(Exception):
    """A layer's reason to end the run before a round (e.g. a spent privacy budget); the
    rounds so far stand."""


@dataclass
class RoundInput:
    """What a layer may read of the round it aggregates: ``rate`` = devices asked / devices
    online (the privacy accountant's sampling rate); ``row`` = the round's metrics row, where a
    layer writes its own metrics; ``exchange`` = the grid's exchange (a secure sum rides on it);
    ``staleness`` / ``bases``: per update (async mode), versions it lags and the version its
    task was made from."""

    rate: float = 1.0
    row: dict = field(default_factory=dict)
    exchange: Exchange | None = None
    staleness: list[int] | None = None
    bases: list[int] | None = None


Finish = Callable[[TrainInstruction], TrainInstruction]


class Aggregator:
    """One layer of the stack; every call goes down to ``inner`` unless the layer overrides it."""

    def __init__(self, inner: Aggregator) -> None:
        self.inner = inner

    @property
    def method(self) -> Method:
        return self.inner.method

    def layers(self) -> list[str]:
        """The stack's layer names, top to bottom."""
        return [type(self).__name__, *self.inner.layers()]

    def admit(self, rnd: int, rate: float) -> None:
        """Raise ``StopRun`` when round ``rnd`` must not run at sampling ``rate``."""
        self.inner.admit(rnd, rate)

    def configure(self, rnd: int, global_weights: Weights,
                  devices: list[DeviceInfo]) -> list[TrainInstruction]:
        return self.inner.configure(rnd, global_weights, devices)

    def finish(self, instruction: TrainInstruction, again: Finish) -> TrainInstruction:
        """``instruction`` with the layers' stamps; ``again`` = the loop's whole finish, for
        instructions nested in it (an edge bundle's members)."""
        return self.inner.finish(instruction, again)

    def unpack(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        return self.inner.unpack(updates)

    def aggregate(self, rnd: int, global_weights: Weights, updates: list[ClientUpdate],
                  info: RoundInput) -> Weights:
        """The next global weights from ``updates`` (not empty)."""
        return self.inner.aggregate(rnd, global_weights, updates, info)

    def carried(self, update: ClientUpdate) -> int:
        """Device updates ``update`` stands for (an edge's partial aggregate: its group's)."""
        return self.inner.carried(update)

    def is_partial(self, update: ClientUpdate) -> bool:
        """Whether ``update`` is an aggregate of several devices' updates."""
        return self.inner.is_partial(update)

    def state_dict(self) -> dict:
        """Checkpoint entries (top-level keys of the checkpoint's state)."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def summary(self) -> dict:
        """Entries of the run's summary.json."""
        return self.inner.summary()


class MethodAggregate(Aggregator):
    """The bottom of every stack: the method's own ``configure_train`` and ``aggregate_train``."""

    def __init__(self, method: Method) -> None:  # noqa: D107 - no inner layer
        self._method = method

    @property
    def method(self) -> Method:
        return self._method

    def layers(self) -> list[str]:
        return [type(self).__name__]

    def admit(self, rnd: int, rate: float) -> None:
        return None

    def configure(self, rnd: int, global_weights: Weights,
                  devices: list[DeviceInfo]) -> list[TrainInstruction]:
        return self._method.configure_train(rnd, global_weights, devices)

    def finish(self, instruction: TrainInstruction, again: Finish) -> TrainInstruction:
        return instruction

    def unpack(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        return updates

    def aggregate(self, rnd: int, global_weights: Weights, updates: list[ClientUpdate],
                  info: RoundInput) -> Weights:
        if info.exchange is not None and info.exchange.secure is not None:  # metrics-only updates
            raise RuntimeError("a secure round's sum reached the method's own aggregate: the stack lacks "
                               "its secure-sum layer (assembly.py:aggregation_stack(secure=True))")
        return self._method.aggregate_train(rnd, global_weights, updates)

    def carried(self, update: ClientUpdate) -> int:
        return 1

    def is_partial(self, update: ClientUpdate) -> bool:
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None

    def summary(self) -> dict:
        return {}
