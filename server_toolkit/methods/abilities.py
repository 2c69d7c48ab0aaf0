"""The optional abilities of a method, declared and checked here, in one place.

Every method has the ``Method`` interface (configure_train, aggregate_train, evaluate, ...).
Some can do more, and whoever drives them asks this module instead of probing attributes:

* ``PersonalModels`` — it holds one model per device (the personalised methods):
  ``personal_model(device_id)`` gives that device's architecture and weights, or None.
  Used by the personalised evaluation (``sim/personalized.py``).
* server data — it trains something on labelled data the server keeps (FedConv):
  ``server_fraction`` > 0 says which share of the training split, ``attach_server_data``
  takes it (``assembly.attach_server_data``, ``sim``).
* a weighted sum — ``Method.weighted_sum`` (``methods/capability.py``): its aggregate is a
  weighted mean of per-element contributions (``Method.summands``). It is the one declaration
  edges (pre-added sums), ``--mode async`` (``rounds/staleness.py``; ``async_refusal`` is the
  one-line error for the others), DP / robust aggregation (``privacy/windows.py``) and
  ``--secagg`` (``secagg/aggregate.py``) read; each serves the declarations it can.
* ``tier_plan`` — every method has it (default: the global model); methods whose tiers train
  different models override it, and pairing sizes a device's tier with it.

* label-histogram noise — it asks devices for ``label_counts``, which
  ``--label-noise-epsilon`` noises (``docs/privacy.md``).

``abilities(method)`` names what a method declares; ``fedsdk-server methods show`` prints it.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

from .base import Method, Weights
from .capability import ASYNC, EDGES, PRIVACY, SECAGG, accepting, why_not

PERSONAL_MODELS = "personal models"
SERVER_DATA = "server data"
TIER_PLANS = "per-tier models"
EDGE_SUMS = "edge sums (--edges, aggregates: sums)"
ASYNCHRONOUS = "asynchronous (--mode async)"
PRIVATE_AGGREGATION = "DP and robust aggregation (--dp-*, --robust)"
SECURE_AGGREGATION = "secure aggregation (--secagg)"
LABEL_NOISE = "label-histogram noise (--label-noise-epsilon)"


@runtime_checkable
class PersonalModels(Protocol):
    """A method with one model per device."""

    def personal_model(self, device_id: str) -> tuple[object, Weights] | None:
        """(architecture with ``.spec`` and ``.name``, weights) of ``device_id``'s model, or None."""


def has_personal_models(method: Method | type[Method]) -> bool:
    """Whether ``method`` (an instance or a class) holds one model per device."""
    return callable(getattr(method, "personal_model", None))


def wants_server_data(method: Method | type[Method]) -> bool:
    """Whether ``method`` trains on data the server keeps (``server_fraction`` > 0)."""
    return float(getattr(method, "server_fraction", 0.0)) > 0.0


def abilities(method: Method | type[Method]) -> list[str]:
    """The optional abilities ``method`` (an instance or a class) declares."""
    cls = method if isinstance(method, type) else type(method)
    found = []
    if has_personal_models(cls):
        found.append(PERSONAL_MODELS)
    declared = "server_fraction" in {f.name for f in dataclasses.fields(cls.Options)}  # one of its options
    if wants_server_data(method) or declared:
        found.append(SERVER_DATA)
    if "tier_plan" in _own_members(cls):
        found.append(TIER_PLANS)
    for feature, ability in ((EDGES, EDGE_SUMS), (ASYNC, ASYNCHRONOUS), (PRIVACY, PRIVATE_AGGREGATION),
                             (SECAGG, SECURE_AGGREGATION)):
        if why_not(method, feature) is None:
            found.append(ability)
    if "label_counts" in cls.asks:
        found.append(LABEL_NOISE)
    return found


def async_refusal(method: Method | type[Method]) -> str | None:
    """Why ``method`` cannot run with ``--mode async`` (one line), or None when it can."""
    why = why_not(method, ASYNC)
    if why is None:
        return None
    from . import methods

    able = accepting(methods(), ASYNC)
    return (f"method {method.name} does not support --mode async ({why}; see docs/async.md); "
            f"methods that do: {', '.join(able)}")


def _own_members(cls: type) -> set[str]:
    """Members defined by ``cls`` or a base below ``Method``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is Method:
            break
        names |= set(vars(klass))
    return names
