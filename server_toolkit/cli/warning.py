"""One-line warnings of the command line (the run goes on); shared by the checks
(``run_checks``) and the validator hook (``validate``) without either importing the other."""

from __future__ import annotations

import click


def warn(text: str) -> None:
    """A one-line warning on stderr (the run goes on)."""
    click.echo(f"Warning: {text}", err=True)
