"""Federated methods, by name. Adding one: a file here and an entry in METHODS."""

from __future__ import annotations

from .base import ClientUpdate, DeviceInfo, Method, TrainInstruction
from .fedavg import FedAvg

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (FedAvg,)}


def method_class(name: str) -> type[Method]:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(METHODS))}")
    return METHODS[name]


__all__ = ["METHODS", "ClientUpdate", "DeviceInfo", "Method", "TrainInstruction", "method_class"]
