"""Federated methods, by name.

Adding a method = adding one file here with a ``Method`` subclass that sets ``name``;
nothing else (round loop, grids, CLI) changes. ``methods()`` fills its table by importing
every module of this package once, on first use.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

from .base import ClientUpdate, DeviceInfo, Method, ModelRecord, TrainInstruction

log = logging.getLogger(__name__)
_METHODS: dict[str, type[Method]] = {}


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def methods() -> dict[str, type[Method]]:
    """Every available method, by name."""
    if not _METHODS:
        for module in pkgutil.iter_modules(__path__):
            try:
                importlib.import_module(f"{__name__}.{module.name}")
            except ImportError as exc:  # e.g. an optional dependency: the other methods still work
                log.warning("method module %s is unavailable: %s", module.name, exc)
        _METHODS.update({cls.name: cls for cls in _subclasses(Method) if cls.name})
    return _METHODS


def method_class(name: str) -> type[Method]:
    """The method called ``name``; ValueError listing the available ones otherwise."""
    available = methods()
    if name not in available:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(available))}")
    return available[name]


__all__ = [
    "ClientUpdate", "DeviceInfo", "Method", "ModelRecord", "TrainInstruction", "method_class", "methods",
]
