"""``--method``: its help lists the registered methods (built in and from the ``fedsdk.methods``
entry-point group), read only when the help is shown: the registry imports torch, and a
command must not pay that to start."""

from __future__ import annotations

import click


class MethodOption(click.Option):
    """An option naming a federated method; ``--help`` shows the choices."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from ..methods import methods

        record = super().get_help_record(ctx)
        if record is None:
            return None
        names = ", ".join(sorted(methods()))
        return record[0], f"{record[1]} One of: {names} (`fedsdk-server methods list`)."
