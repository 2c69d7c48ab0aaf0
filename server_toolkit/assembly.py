"""One server assembly: dataset -> model spec -> method (and its server data), for both
``fedsdk-server run`` and ``simulate``.

The aggregation stack (``aggregation_stack``, layers in ``rounds/aggregator.py``) is built here
once from the run's options, for both commands.

Both commands then hand the method to the round loop (``rounds/loop.py``) over a grid: the
MQTT grid for a real fleet, the MQTT grid with device processes or the in-process grid for
a simulation. What differs is only where the server's own data comes from: a simulation
cuts it off the training split before partitioning it among its devices; a real fleet's
server uses ``--server-data`` or, failing that, its share of ``--dataset``'s training
split (the devices bring their own data).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fedcore.recipe import Recipe

from .data.datasets import Dataset, load_dataset
from .edge.layer import EdgeFold
from .methods import method_class
from .methods.abilities import wants_server_data
from .methods.base import Method
from .models.zoo import model_spec
from .privacy.layer import PrivateAggregate
from .privacy.settings import PrivacySettings
from .rounds.aggregator import Aggregator, MethodAggregate
from .rounds.async_loop import AsyncConfig
from .rounds.norm_bound import DEFAULT_FACTOR, NormBound
from .rounds.staleness import StalenessFold
from .secagg.layer import SecureSum


@dataclass(frozen=True)
class Assembly:
    """The server's dataset (test split for central evaluation), global model spec and method,
    and the run's tier overrides {device id: tier} for the round loop (``LoopConfig.tier_map``)."""

    data: Dataset
    spec: dict
    method: Method
    tier_map: dict[str, str] = field(default_factory=dict)


def split_tier_map(method_options: dict | None) -> tuple[dict, dict[str, str]]:
    """``(the method's options, tier overrides)``: ``tier_map`` {device id: tier} is a run
    option handled by the round loop (``methods/tiers.py``), whatever the method; ValueError
    when it is not an object."""
    options = dict(method_options or {})
    tier_map = options.pop("tier_map", None) or {}
    if not isinstance(tier_map, dict):
        raise ValueError(f"tier_map must map device ids to tiers, e.g. {{\"dev0\": \"0.5\"}}; "
                         f"got {tier_map!r}")
    return options, {str(k): str(v) for k, v in tier_map.items()}


def assemble(method: str, model: str, dataset: str, data_dir: str | Path | None, recipe: Recipe,
             method_options: dict | None = None, seed: int = 0, train_samples: int | None = None,
             test_samples: int | None = None) -> Assembly:
    """Load ``dataset`` (a stratified subset when sample counts are given), build ``model``'s
    spec for it and the method with its options. DatasetError / ValueError / TypeError with
    one-line messages on bad input (unknown method, model or option)."""
    cls = method_class(method)  # fail on a wrong name before any data is read
    data = load_dataset(dataset, data_dir, seed=seed)
    if train_samples or test_samples:
        data = data.subset(train_samples, test_samples, seed=seed)
    spec = model_spec(model, data.input_shape, data.num_classes)
    options, tier_map = split_tier_map(method_options)
    return Assembly(data, spec, cls(spec, recipe, **options), tier_map)


def attach_server_data(method: Method, data: Dataset, server_data: Path | None, seed: int) -> str | None:
    """Give a method that wants server data (``server_fraction`` > 0) the ``server_data`` npz,
    or else its share of ``data``'s training split. Returns a one-line description of what it
    got (None: the method uses none)."""
    from sdk_device.data.npz import load_npz

    from .data.server_slice import take_server_slice

    if not wants_server_data(method):
        return None
    if server_data:
        x, y = load_npz(server_data)
        source = str(server_data)
    else:
        x, y = take_server_slice(data.x_train, data.y_train, method.server_fraction, seed).server
        source = f"{method.server_fraction:.0%} of the training split of {data.name}"
    method.attach_server_data(x, y)
    return f"server data: {len(y)} samples ({source})"


def aggregation_stack(method: Method, norm_bound: float | None = DEFAULT_FACTOR,
                      privacy: PrivacySettings | None = None, secure: bool = False,
                      async_settings: AsyncConfig | None = None) -> Aggregator:
    """The run's aggregation stack over ``method``, top to bottom: ``SecureSum`` (``secure``),
    ``NormBound`` (``norm_bound``, for a method that ``bounds_updates``; not under secure
    aggregation, where no update is in the clear, nor with central DP, whose clipping bounds
    every update alone), ``PrivateAggregate`` (active ``privacy``), ``StalenessFold``
    (``async_settings``; a ``PrivateAggregate`` goes under it, on the scaled deltas),
    ``EdgeFold`` (edges forward each member's update when privacy is on, unless ``secure``: then
    the devices clip their own deltas and the edges sum them securely), ``MethodAggregate``.
    ``secure`` with ``async_settings``: only secure edges get tasks (``secagg/layer.py``).
    ``secure`` with label-histogram noise and no DP: ``PrivateAggregate`` goes on top (it counts
    the noised histograms; ``SecureSum`` makes the weights).
    Which combinations may be asked is decided before (``cli/combination_checks.py``)."""
    private = privacy is not None and privacy.active
    # DP, robust: each device's update (secure: none in the clear; the devices clip, edges sum)
    stack: Aggregator = EdgeFold(MethodAggregate(method), forward=private and not secure)
    if private and async_settings is not None:  # under the buffer: noise and accounting per version
        stack = PrivateAggregate(stack, privacy, on_deltas=True, secure=secure)
    if async_settings is not None:
        stack = StalenessFold(stack, async_settings.server_lr)
    # under secure aggregation without DP (label noise only) the layer counts the histograms
    # above SecureSum, which turns the unmasked sum into the weights
    counts_above = secure and private and not privacy.dp
    if private and async_settings is None and not counts_above:
        stack = PrivateAggregate(stack, privacy, secure=secure)
    central_dp = private and privacy.dp and privacy.mode == "central"
    if norm_bound is not None and method.bounds_updates and not secure and not central_dp:
        stack = NormBound(stack, norm_bound)
    if secure:
        stack = SecureSum(stack, edges_only=async_settings is not None)
    if counts_above and async_settings is None:
        stack = PrivateAggregate(stack, privacy, secure=secure)
    return stack
