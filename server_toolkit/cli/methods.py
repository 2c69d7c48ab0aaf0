"""``fedsdk-server methods``: the federated methods this server knows, and their options."""

from __future__ import annotations

import inspect

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()


@click.group()
def methods() -> None:
    """The federated methods: `methods list`, `methods show NAME`."""


@methods.command("list")
def methods_list() -> None:
    """Every method with its family and example arguments."""
    from ..methods import methods as registry

    table = Table("method", "family", "example: fedsdk-server simulate --method NAME …")
    for name, cls in sorted(registry().items(), key=lambda item: (item[1].family, item[0])):
        table.add_row(name, cls.family or "-", cls.example or "")
    console.print(table)


@methods.command("show")
@click.argument("name")
def methods_show(name: str) -> None:
    """One method: what it does (its module's documentation), its options and their defaults."""
    from ..methods import canonical_name, method_class
    from ..methods import methods as registry
    from ..methods.abilities import abilities
    from .method_choice import unknown_choice

    if canonical_name(name) not in registry():
        raise click.ClickException(unknown_choice("method", name, sorted(registry())))
    cls = method_class(name)
    alias = f" (old id {name!r})" if cls.name != name else ""
    console.print(f"[bold]{cls.name}[/]{alias} ({cls.family}); example: "
                  f"fedsdk-server simulate --method {cls.name} {cls.example}")
    console.print(inspect.getdoc(inspect.getmodule(cls)) or "", markup=False, highlight=False)
    console.print(f"abilities: {', '.join(abilities(cls)) or 'none beyond the Method interface'}")
    rows = cls.Options.describe()
    if not rows:
        console.print("options: none")
        return
    table = Table("option (--method-option KEY=VALUE)", "type", "default", "what it sets", title="options")
    for row in rows:
        table.add_row(*(escape(cell) for cell in (row.name, row.type, row.default, row.help)))
    console.print(table)
