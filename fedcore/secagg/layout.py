"""Global coordinates: where each tensor of a device's sub-model sits in the flat vector of
the whole global model, so that windows of different tiers add up element by element.

The vector a device masks has two parts, both in global coordinates:
``values`` (D = every global element, tensors in name order): weight * value on the
device's window, zero elsewhere; ``cover`` (D elements when ``per_element``, else one):
the weight on the window. The server divides the two sums after unmasking: per element
``sum_i w_i x_i / sum_i w_i``, FedAvg's, HeteroFL's and DepthFL's average alike. A weight
is the device's sample count, or for a ``classes`` tensor (a classifier, axis 0 = class)
the device's own count of each row's class.

A layout travels as JSON: per sub-model tensor, its global tensor's offset and shape and,
per leading axis, the global indices as ``[start, length]`` runs (axes not listed: whole).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SAMPLES, CLASSES = "samples", "classes"


@dataclass(frozen=True)
class Placement:
    """One sub-model tensor: its global tensor's ``offset`` (elements) and ``shape``, the
    global ``indices`` of its leading axes, and how it is weighted."""

    offset: int
    shape: tuple[int, ...]
    indices: tuple[np.ndarray, ...]
    weight: str = SAMPLES

    def flat_indices(self) -> np.ndarray:
        """The global flat positions of the sub-tensor's elements, in its C order."""
        axes = list(self.indices) + [np.arange(n) for n in self.shape[len(self.indices):]]
        return self.offset + np.ravel_multi_index(np.ix_(*axes), self.shape).ravel()


@dataclass(frozen=True)
class Layout:
    """The placements of one device's sub-model; ``size`` = D; ``per_element``: whether the
    cover part has D elements (windows differ between devices) or one (all cover all)."""

    size: int
    placements: dict[str, Placement]
    per_element: bool

    @property
    def vector_length(self) -> int:
        return self.size + (self.size if self.per_element else 1)

    def to_json(self) -> dict:
        return {"size": self.size, "per_element": self.per_element, "tensors": {
            name: {"offset": p.offset, "shape": list(p.shape), "index": [_runs(i) for i in p.indices],
                   "weight": p.weight} for name, p in self.placements.items()}}

    @classmethod
    def from_json(cls, data: dict) -> Layout:
        """The layout of ``to_json``; ValueError on anything malformed or out of range."""
        try:
            size = int(data["size"])
            placements = {}
            for name, entry in data["tensors"].items():
                shape = tuple(int(n) for n in entry["shape"])
                indices = tuple(_unruns(runs) for runs in entry["index"])
                offset = int(entry["offset"])
                if (len(indices) > len(shape) or entry["weight"] not in (SAMPLES, CLASSES)
                        or offset < 0 or offset + int(np.prod(shape)) > size
                        or any(len(i) and (i.min() < 0 or i.max() >= n)
                               for i, n in zip(indices, shape, strict=False))):
                    raise ValueError(f"tensor {name!r} does not fit the layout")
                placements[str(name)] = Placement(offset, shape, indices, entry["weight"])
            return cls(size, placements, bool(data["per_element"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed secagg layout: {exc}") from None

    def scatter(self, tensors: dict[str, np.ndarray], samples: int, class_counts: np.ndarray | None,
                clip: float) -> tuple[np.ndarray, np.ndarray]:
        """(values, cover) float64 in global coordinates (see the module docstring); values
        clipped to +-``clip`` first. ValueError when a tensor is missing or misshapen."""
        values = np.zeros(self.size, np.float64)
        cover = np.zeros(self.size if self.per_element else 1, np.float64)
        if set(tensors) != set(self.placements):
            raise ValueError(f"the update's tensors {sorted(tensors)} are not the layout's")
        for name, p in self.placements.items():
            tensor = np.clip(np.asarray(tensors[name], np.float64), -clip, clip)
            idx = p.flat_indices()
            if tensor.size != idx.size:
                raise ValueError(f"{name}: {tensor.shape} does not fit its window of {idx.size} elements")
            weight = self._weight(p, tensor.shape, samples, class_counts)
            values[idx] = (tensor * weight).ravel()
            if self.per_element:
                cover[idx] = np.broadcast_to(weight, tensor.shape).ravel()
        if not self.per_element:
            cover[0] = samples
        return values, cover

    @staticmethod
    def _weight(p: Placement, shape: tuple[int, ...], samples: int, class_counts: np.ndarray | None):
        if p.weight == SAMPLES:
            return float(samples)
        counts = np.zeros(shape[0]) if class_counts is None else np.asarray(class_counts, np.float64)
        counts = np.pad(counts[: shape[0]], (0, max(0, shape[0] - len(counts))))
        return counts.reshape(-1, *[1] * (len(shape) - 1))


def _runs(indices: np.ndarray) -> list[list[int]]:
    """Indices as [start, length] runs of consecutive values."""
    runs: list[list[int]] = []
    for i in np.asarray(indices, np.int64).tolist():
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
    return runs


def _unruns(runs: list) -> np.ndarray:
    parts = [np.arange(int(start), int(start) + int(length)) for start, length in runs]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
