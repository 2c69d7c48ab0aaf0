"""Finding a user's function from ``pkg.module:name`` or ``path/to/file.py[:name]``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path


class UserCodeError(ValueError):
    """A reference to user code that cannot be followed (one line: what, where, what to do)."""


def is_user_ref(text: str | None) -> bool:
    """Whether ``text`` names user code (``pkg.module:name`` or a ``.py`` file), not a built-in name."""
    if not text or text.startswith("npz:"):
        return False
    return ":" in text or text.partition(":")[0].endswith(".py")


def load_user_function(ref: str, default_name: str, what: str) -> Callable:
    """The function ``ref`` names (``default_name`` when a file is given without ``:name``).
    ``what`` ("--model", "--dataset") is for the message of a UserCodeError."""
    target, _, name = ref.partition(":")
    name = name or default_name
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise UserCodeError(f"{what} {ref}: no such file {path}")
            module_name = f"fedsdk_user_{path.stem}_{abs(hash(str(path.resolve())))}"
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except UserCodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - any error in the user's module is reported in one line
        raise UserCodeError(f"{what} {ref}: importing {target} failed: {type(exc).__name__}: {exc}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UserCodeError(f"{what} {ref}: {target} has no function {name!r}")
    return function
