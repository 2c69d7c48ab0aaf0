"""Federated methods, by name.

Adding a method = adding one file here (or to a family's package, ``methods/fedconv/``, …)
with a ``Method`` subclass that sets ``name``; nothing else (round loop, grids, CLI) changes.
``methods()`` fills its table by importing every module of this package and its subpackages
once, on first use.

Method ids are kebab-case (``mh-pfedhn``, ``fedavg-l-exit``). ``ALIASES`` maps the older
snake_case ids to them, so ``--method mh_pfedhn``, ``methods show mh_pfedhn`` and runs saved
under an old id (``config.json``, ``state.json``) still work.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

from .base import ClientUpdate, DeviceInfo, Method, ModelRecord, TrainInstruction

log = logging.getLogger(__name__)
_METHODS: dict[str, type[Method]] = {}

ALIASES: dict[str, str] = {  # old id -> its id now
    "mh_pfedhn": "mh-pfedhn",
    "mh_pfedhngd": "mh-pfedhngd",
    "fedavg_groups": "fedavg-groups",
}


def canonical_name(name: str) -> str:
    """The method id ``name`` stands for now (an old alias -> its kebab-case id; else ``name``)."""
    return ALIASES.get(name, name)


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def _unavailable(name: str) -> None:
    log.warning("method package %s is unavailable", name)


def methods() -> dict[str, type[Method]]:
    """Every available method, once, by its (kebab-case) id."""
    if not _METHODS:
        for module in pkgutil.walk_packages(__path__, prefix=f"{__name__}.", onerror=_unavailable):
            try:
                importlib.import_module(module.name)
            except ImportError as exc:  # e.g. an optional dependency: the other methods still work
                log.warning("method module %s is unavailable: %s", module.name, exc)
        _METHODS.update({cls.name: cls for cls in _subclasses(Method) if cls.name})
    return _METHODS


def method_class(name: str) -> type[Method]:
    """The method called ``name`` (or an old alias of it); ValueError listing the available ones otherwise."""
    available = methods()
    if canonical_name(name) not in available:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(available))}")
    return available[canonical_name(name)]


__all__ = [
    "ALIASES", "ClientUpdate", "DeviceInfo", "Method", "ModelRecord", "TrainInstruction", "canonical_name",
    "method_class", "methods",
]
