"""``fedsdk-server run``: serve a real fleet (and pair new devices meanwhile); the options are in
``run_options.py``, the configuration in ``server_config.py``, the serving in ``serve.py``."""

from __future__ import annotations

import click

from .config_build import build_config
from .observe_options import hold_dashboard, observed, open_observers
from .options import console
from .progress import RoundProgress, print_outcome
from .run_options import run_options
from .validate import validated


@click.command()
@run_options
@validated
def run(**options) -> None:
    """Serve a real fleet, and pair new devices meanwhile (`fedsdk-server pair-code`).

    Devices join with `fedsdk pair` (or, registered by hand, `fedsdk run --broker ... --fleet ...
    --device-id ...`)."""
    from ..serve import FleetServer, ServeError
    from ..server_config import RunConfig

    config, observe, _ = build_config(RunConfig, options)
    try:
        server = FleetServer(config, say=lambda text: console.print(text, soft_wrap=True))
        observers = open_observers(observe.dashboard, observe.dashboard_token, observe.log_to,
                                   config.run_dir.name)
        server.connect()
    except ServeError as exc:
        raise click.ClickException(str(exc)) from None
    progress = RoundProgress(config.rounds, f"waiting for {config.min_devices} device(s)")
    server.prepare(observers, on_round=lambda row: progress.round(row))
    with observed(observers, config.run_dir), progress:
        try:
            server.serve(progress.note)
        except ServeError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            print_outcome(server.report, f"{config.method} on fleet {config.fleet}", config.run_dir,
                          stopped=server.stopped)
    hold_dashboard(observers, observe.dashboard_hold)
