"""``--dashboard``, ``--dashboard-token`` and ``--log-to`` of ``run`` and ``simulate``, and opening
what they ask for (``observe/``)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import click

from ..report.run_status import record_status
from .options import console


def observe_options(f):
    """The watching options of a command that runs rounds."""
    for opt in reversed([
        click.option("--dashboard", "dashboard", metavar="HOST:PORT", default=None,
                     help="Serve a live dashboard and Prometheus /metrics here, e.g. 127.0.0.1:8080. "
                     "Off loopback a token is required."),
        click.option("--dashboard-token", default=None, envvar="FEDSDK_DASHBOARD_TOKEN",
                     help="The dashboard's token (?token=... or Authorization: Bearer ...); default off "
                     "loopback: generated and printed once. Env: FEDSDK_DASHBOARD_TOKEN."),
        click.option("--dashboard-hold", default=0.0, show_default=True, metavar="SECONDS",
                     help="Keep serving the dashboard this long after the run ends (Ctrl-C stops it)."),
        click.option("--log-to", "log_to", multiple=True, metavar="KIND:TARGET",
                     help="Track the run in tensorboard:DIR or mlflow:URI (repeatable; "
                     "pip install 'fedsdk[tracking]')."),
    ]):
        f = opt(f)
    return f


def open_observers(dashboard: str | None, token: str | None, log_to: tuple[str, ...], run_name: str):
    """The ``RunObservers`` the options ask for, started (ClickException with one line if not)."""
    from ..observe.access import DashboardError, decide_token, parse_bind
    from ..observe.log_to import open_tracker
    from ..observe.observers import RunObservers
    from ..observe.server import DashboardServer
    from ..observe.state import DashboardState
    from ..observe.tracking import TrackingError

    try:
        trackers = [open_tracker(spec, run_name) for spec in log_to]
        state = server = None
        if dashboard:
            bind = parse_bind(dashboard)
            state = DashboardState()
            server = DashboardServer(state, bind, decide_token(bind, token)).start()
    except (DashboardError, TrackingError) as exc:
        raise click.ClickException(str(exc)) from None
    if server:
        console.print(f"dashboard: {server.url()}  (metrics: /metrics)", soft_wrap=True)
        if server.token and not token:
            console.print(f"dashboard token (shown once): {server.token}; open {server.url(with_token=True)}",
                          soft_wrap=True)
    return RunObservers(state, server, trackers)


def hold_dashboard(observers, seconds: float) -> None:
    """Keep the dashboard up ``seconds`` after the run (Ctrl-C ends the wait), then stop it."""
    try:
        if observers.server and seconds > 0:
            console.print(f"dashboard stays up for {seconds:g} s (Ctrl-C stops it)")
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(seconds)
    finally:
        observers.close()


@contextlib.contextmanager
def observed(observers, run_dir: Path):
    """Run the body; record how it ended (finished / stopped / failed, or the quality guard's
    finished_after_rollback / finished_without_learning / diverged: ``report/run_status.py``) in
    ``run_dir``'s summary.json and tell the observers. Unless the body got through the dashboard
    stops too (else ``hold_dashboard`` does)."""
    status = "failed"
    try:
        yield observers
        status = "finished"
    except KeyboardInterrupt:
        status = "stopped"
        raise
    finally:
        recorded = record_status(run_dir, status)
        observers.finish(recorded)
        if status != "finished":
            observers.close()
