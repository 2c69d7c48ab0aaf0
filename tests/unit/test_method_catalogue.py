"""The method catalogue: every module of ``server_toolkit.methods`` and of its family
packages (``methods/fedconv/``, …) imports, and every method it defines is listed (the
catalogue skips a module that fails to import, so a broken import would otherwise only show
as a method missing from ``methods list``)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import server_toolkit.methods as package
from server_toolkit.methods import methods
from server_toolkit.methods.base import Method


def test_every_method_module_imports_and_its_methods_are_listed():
    listed = set(methods().values())
    seen = 0
    for module in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.", onerror=_raise):
        loaded = importlib.import_module(module.name)  # raises if broken
        seen += 1
        defined = {v for v in vars(loaded).values()
                   if isinstance(v, type) and issubclass(v, Method) and v.__module__ == loaded.__name__
                   and v.name}
        assert defined <= listed, (module.name, defined - listed)
    assert seen >= 20


def _raise(name: str) -> None:
    raise ImportError(f"package {name} does not import")


def test_every_method_that_scores_devices_by_their_labels_asks_for_them():
    # methods reading label_counts from results must ask devices for them (protocol v2:
    # a device reports only the outputs its task asks for)
    scoring = [name for name, cls in methods().items()
               if "TargetAccuracy" in vars(sys.modules[cls.__module__])]
    assert {"recipfl", "allsmall", "exclusivefl", "heterofl", "depthfl"} <= set(scoring)
    for name in scoring:
        assert "label_counts" in methods()[name].asks, name


def test_every_method_family_package_says_what_it_is():
    families = [m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg]
    assert {"exit", "fedconv", "hypernet", "recipfl", "width"} <= set(families)
    for name in families:
        doc = importlib.import_module(f"{package.__name__}.{name}").__doc__ or ""
        assert len(doc.split()) >= 10, name
