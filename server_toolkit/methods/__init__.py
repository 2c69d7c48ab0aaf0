"""Federated methods, by name.

Adding a method = adding one file here (or to a family's package, ``methods/fedconv/``, …)
with a ``Method`` subclass that sets ``name``; nothing else (round loop, grids, CLI) changes.
``methods()`` fills its table by importing every module of this package and its subpackages
once, on first use.

Method ids are kebab-case (``mh-pfedhn``, ``fedavg-l-exit``). ``ALIASES`` maps the older
snake_case ids to them, so ``--method mh_pfedhn``, ``methods show mh_pfedhn`` and runs saved
under an old id (``config.json``, ``state.json``) still work.

Methods of other packages join through the ``fedsdk.methods`` entry-point group: an entry
``my-method = my_package.module:MyMethod`` (a ``Method`` subclass) in the package's metadata
makes ``--method my-method`` work once the package is installed (docs/byo.md).
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
        _METHODS.update(_entry_point_methods())
    return _METHODS


ENTRY_POINT_GROUP = "fedsdk.methods"


def _entry_point_methods() -> dict[str, type[Method]]:
    """The methods other packages register in the ``fedsdk.methods`` entry-point group, by id
    (the class's ``name``); one that fails to load is logged and left out."""
    from importlib.metadata import entry_points

    found = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = entry.load()
        except Exception as exc:  # noqa: BLE001 - another package's bug must not stop the others
            log.warning("method entry point %s (%s) is unavailable: %s", entry.name, entry.value, exc)
            continue
        if not (isinstance(cls, type) and issubclass(cls, Method) and cls.name):
            log.warning("method entry point %s (%s) is not a Method subclass with a name", entry.name,
                        entry.value)
            continue
        found[cls.name] = cls
    return found


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
