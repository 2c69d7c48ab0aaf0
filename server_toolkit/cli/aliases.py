"""Old option spellings kept working but not shown: one name per concept across commands
(``--run-dir`` for a run directory, ``--runs-dir`` for their parent, ``--security-dir`` for
a broker security directory), the old names as hidden aliases.

    @click.option("--security-dir", "--security", "security_dir", cls=Aliased, aliases=["--security"])
"""

from __future__ import annotations

import click


class Aliased(click.Option):
    """An option whose ``aliases`` parse as usual but are left out of ``--help``."""

    def __init__(self, *args, aliases: list[str] | tuple[str, ...] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = tuple(aliases)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        shown = [o for o in self.opts if o not in self.aliases]
        saved, self.opts = self.opts, shown
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = saved
