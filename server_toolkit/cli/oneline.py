"""Errors of ``fedsdk-server`` as one line on stderr, with documented exit codes.

Click prints a usage error as four lines (usage, a hint, a blank, the error); a newcomer
reads the last one only. ``OneLineGroup`` prints every error as ``Error: <what> (see
<command> --help)`` and exits with:

====  ==========================================================================
code  meaning
====  ==========================================================================
0     done
1     the command failed (a broker down, a damaged checkpoint, a run that failed)
2     bad usage: an option, a combination of options or a file given is wrong
130   stopped by Ctrl-C
====  ==========================================================================
"""

from __future__ import annotations

import sys

import click


def one_line(text: str) -> str:
    """``text`` with its lines joined (an error message must stay one line)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


class OneLineGroup(click.Group):
    """A click group whose errors are one line on stderr (see the module docstring)."""

    def main(self, args=None, prog_name=None, **extra):  # noqa: ANN001, ANN201 - click's signature
        try:
            return super().main(args, prog_name, standalone_mode=False, **extra)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else (prog_name or "fedsdk-server")
            click.echo(f"Error: {one_line(exc.format_message())} (see {where} --help)", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"Error: {one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except (click.Abort, KeyboardInterrupt):
            click.echo("stopped (Ctrl-C)", err=True)
            sys.exit(130)
