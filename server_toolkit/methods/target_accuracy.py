"""``accuracy_strong`` / ``accuracy_weak``: RecipFL's measure, reported by every method of the
resource-skew family (RecipFL, AllSmall, ExclusiveFL) and by HeteroFL and DepthFL when their
tiers are named ``strong`` and ``weak``.

The measure. Every device has a *target* model: the one it is meant to run (a strong device:
the large model; a weak one: the small model; AllSmall: the small model for everybody;
HeteroFL: the device's width-r sub-model; DepthFL: the prefix through the device's last
exit), as the method would send it now. It is scored on the server's test set re-weighted to
the device's label histogram (the ``label_counts`` its results report), the personalised
methods' measure (``models.personal_eval``): sum_c p(c) * accuracy on the test samples of
class c. ``accuracy_strong`` and ``accuracy_weak`` are the means over the strong and over the
weak devices seen so far (a key is left out when no device of that role was seen); a device
that has not reported its labels yet is scored on the test set as it is.
Departure from the paper: no device fine-tunes the received model for an epoch before it is
scored (the server cannot do that without the device's data; ``bench/accuracy_recipfl.py``
measures that variant on digits).

Where it lives (decision): ``TargetAccuracy`` is an object the method owns and feeds from
three of its own hooks: ``see`` in ``configure_train`` (each selected device and its role),
``report`` in ``aggregate_evaluate`` (the label histograms the results carry) and
``evaluate`` in ``evaluate`` (with a function giving a device's target model); ``state`` /
``load`` go into the method's checkpointed state. Not a mixin: RecipFL, ExclusiveFL and
DepthFL override the very hooks a mixin would hook into, and one explicit line in each is
easier to follow than a chain of ``super()`` calls. Models without BatchNorm that several
devices share (AllSmall's global model, ExclusiveFL's two) are run over the test set once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable

import numpy as np

from ..models.architectures import Architecture, from_spec
from ..models.personal_eval import correct_samples, label_weights
from .base import ClientUpdate, DeviceInfo, Weights, label_histogram

STRONG, WEAK = "strong", "weak"
ROLES = (STRONG, WEAK)

# (device, its role) -> (spec, parameters) of its target model, or None to skip the device
TargetModel = Callable[[DeviceInfo, str], "tuple[dict, Weights] | None"]


def role_by_tier_name(device: DeviceInfo) -> str | None:
    """``strong`` / ``weak`` when the device's tier is named so (HeteroFL, DepthFL), else None."""
    return device.tier if device.tier in ROLES else None


class TargetAccuracy:
    """Roles and label histograms of the devices a method has seen; their target models'
    accuracy (see the module docstring)."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.devices: dict[str, tuple[str, DeviceInfo]] = {}  # device id -> (role, what it was)
        self.label_counts: dict[str, list[int]] = {}
        self._architectures: dict[str, Architecture] = {}

    def see(self, devices: Iterable[DeviceInfo], role_of: Callable[[DeviceInfo], str | None]) -> None:
        """Remember the role of each device (``role_of`` None: the device has no role)."""
        for device in devices:
            role = role_of(device)
            if role is not None:
                self.devices[device.device_id] = (role, DeviceInfo(device.device_id, device.num_samples,
                                                                   device.tier))

    def report(self, updates: Iterable[ClientUpdate]) -> None:
        """Remember the label histograms the results carry (bad reports are ignored)."""
        for update in updates:
            counts = label_histogram(update.metrics.get("label_counts"), self.num_classes)
            if counts is not None and counts.sum() > 0:
                self.label_counts[update.device_id] = [int(c) for c in counts]

    def evaluate(self, target: TargetModel, x: np.ndarray, y: np.ndarray) -> dict:
        """{"accuracy_strong": ..., "accuracy_weak": ...} of the devices seen so far."""
        per_role: dict[str, list[float]] = {}
        shared: dict[str, np.ndarray] = {}  # BatchNorm-free model -> which test samples it gets right
        for device_id, (role, device) in sorted(self.devices.items()):
            found = target(device, role)
            if found is None:
                continue
            spec, params = found
            arch = self._architecture(spec)
            weights = label_weights(y, self.label_counts.get(device_id))
            if arch.buffers:  # statistics re-estimated for this device's labels: nothing to share
                correct = correct_samples(arch, params, x, y, weights)
            else:
                key = _fingerprint(spec, params)
                if key not in shared:
                    shared[key] = correct_samples(arch, params, x, y)
                correct = shared[key]
            per_role.setdefault(role, []).append(float((weights * correct).sum()))
        return {f"accuracy_{role}": float(np.mean(values)) for role, values in sorted(per_role.items())}

    def _architecture(self, spec: dict) -> Architecture:
        key = json.dumps(spec, sort_keys=True)
        if key not in self._architectures:
            self._architectures[key] = from_spec("target", spec)
        return self._architectures[key]

    def state(self) -> dict:
        """JSON-ready, for the method's ``state_dict``."""
        devices = {d: [role, info.tier, info.num_samples] for d, (role, info) in self.devices.items()}
        return {"devices": devices, "label_counts": dict(self.label_counts)}

    def load(self, state: dict) -> None:
        """Restore what ``state`` returned."""
        for device_id, (role, tier, samples) in state.get("devices", {}).items():
            self.devices[device_id] = (role, DeviceInfo(device_id, int(samples), tier))
        for device_id, counts in state.get("label_counts", {}).items():
            self.label_counts[str(device_id)] = [int(c) for c in counts]


def _fingerprint(spec: dict, params: Weights) -> str:
    """The same for the same architecture with the same parameter values."""
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode())
    for name in sorted(params):
        value = np.ascontiguousarray(params[name], np.float32)
        digest.update(name.encode() + str(value.shape).encode() + value.tobytes())
    return digest.hexdigest()
