"""Typed method options: each method declares its options as one frozen dataclass.

A method's ``Options`` class lists every option it takes, with its type, default and a
one-line help (``option(default, help, ...)``); ``fedsdk-server methods show NAME`` prints
that table and ``Method.__init__`` parses the user's ``--method-option KEY=VALUE`` pairs
(already JSON-decoded: numbers, booleans, lists, objects) into it, in one place:

* an unknown key, a value of the wrong type, a value outside ``choices`` or below
  ``minimum`` raise ``OptionError`` with one line naming the method, the option and what
  it accepts;
* values are converted by the annotated type: ``float`` takes an integer, ``bool`` takes
  ``true``/``false`` (also as text), ``dict[str, float]`` converts keys and values, a union
  tries its members in order; ``object`` takes anything (a Python caller's array).

Options of a method family inherit from each other like their methods (``WidthOptions`` →
``FedDMOptions``); decisions about an option's value belong in its help or in the method's
module docstring.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self


class OptionError(ValueError, TypeError):
    """A bad method option (unknown key, wrong type, out of range); the message is one line."""


def option(default: Any, help: str, *, choices: tuple = (), minimum: float | None = None) -> Any:
    """A dataclass field of a method's ``Options``: its default, help text, allowed values
    (``choices``, empty: any of its type) and smallest allowed number (``minimum``)."""
    metadata = {"help": help, "choices": tuple(choices), "minimum": minimum}
    if isinstance(default, dict | list):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class OptionDoc:
    """One row of ``methods show``: the option's name, type, default and help, as text."""

    name: str
    type: str
    default: str
    help: str


@dataclass(frozen=True)
class MethodOptions:
    """The options of a method that takes none."""

    @classmethod
    def parse(cls, method: str, values: Mapping[str, Any]) -> Self:
        """``values`` (``{option: value}``, as given) checked and converted; OptionError otherwise."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            takes = ", ".join(sorted(known)) or "none"
            raise OptionError(f"method {method!r} has no option {', '.join(map(repr, unknown))}; "
                              f"its options: {takes} (see `fedsdk-server methods show {method}`)")
        hints = typing.get_type_hints(cls)
        return cls(**{name: _checked(method, known[name], hints[name], value)
                      for name, value in values.items()})

    @classmethod
    def describe(cls) -> list[OptionDoc]:
        """Every option of the class, in declaration order."""
        hints = typing.get_type_hints(cls)
        rows = []
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            text = f.metadata.get("help", "")
            if f.metadata.get("choices"):
                text += f" One of: {', '.join(map(str, f.metadata['choices']))}."
            rows.append(OptionDoc(f.name, _type_name(hints[f.name]), repr(default), text))
        return rows

    def as_dict(self) -> dict[str, Any]:
        """The options as ``{name: value}`` (JSON-ready when the values are)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _checked(method: str, f: dataclasses.Field, kind: Any, value: Any) -> Any:
    try:
        converted = _convert(kind, value)
    except (TypeError, ValueError):
        raise OptionError(f"method {method!r} option {f.name}: expected {_type_name(kind)}, "
                          f"got {value!r}") from None
    choices, minimum = f.metadata.get("choices"), f.metadata.get("minimum")
    if choices and converted not in choices:
        raise OptionError(f"method {method!r} option {f.name}: expected one of "
                          f"{', '.join(map(repr, choices))}, got {value!r}")
    if minimum is not None and isinstance(converted, int | float) and converted < minimum:
        raise OptionError(f"method {method!r} option {f.name}: expected a number >= {minimum}, got {value!r}")
    return converted


def _convert(kind: Any, value: Any) -> Any:
    """``value`` as type ``kind``; TypeError / ValueError when it is not one."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any or kind is object:
        return value
    if origin in (types.UnionType, typing.Union):
        for member in args:
            try:
                return _convert(member, value)
            except (TypeError, ValueError):
                continue
        raise TypeError(value)
    if kind is type(None):
        if value is None:
            return None
        raise TypeError(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise TypeError(value)
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError(value)
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise TypeError(value)
    if kind is str:
        if isinstance(value, str):
            return value
        raise TypeError(value)
    if origin is dict or kind is dict:
        if not isinstance(value, Mapping):
            raise TypeError(value)
        key_kind, value_kind = args or (Any, Any)
        return {_convert(key_kind, str(k) if key_kind is str else k): _convert(value_kind, v)
                for k, v in value.items()}
    if origin is list or kind is list:
        if not isinstance(value, list | tuple):
            raise TypeError(value)
        (item_kind,) = args or (Any,)
        return [_convert(item_kind, v) for v in value]
    raise TypeError(f"unsupported option type {kind!r}")


def _type_name(kind: Any) -> str:
    """How ``methods show`` writes a type: ``int``, ``dict[str, float]``, ``str | None``."""
    if typing.get_origin(kind) in (types.UnionType, typing.Union):
        return " | ".join(_type_name(k) for k in typing.get_args(kind))
    if kind is type(None):
        return "None"
    if kind is Any or kind is object:
        return "any"
    if typing.get_args(kind):
        members = ", ".join(_type_name(k) for k in typing.get_args(kind))
        return f"{typing.get_origin(kind).__name__}[{members}]"
    return getattr(kind, "__name__", str(kind))
