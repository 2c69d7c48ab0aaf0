"""The conformance kit: plays the server of a fleet against one device client and drives it
through every path of docs/protocol.md (``fedsdk-server conformance``, docs/conformance.md).

``run_checks`` runs ``checks.CHECKS`` in order and reports pass / fail per check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .checks import CHECKS, CheckFailed, Context
from .peer import ServerPeer
from .tasks import TaskFactory


@dataclass(frozen=True)
class Outcome:
    name: str
    passed: bool
    reason: str
    seconds: float


def run_checks(
    broker_url: str,
    fleet: str,
    device_id: str,
    formats: list[str],
    *,
    ca_file: str | None = None,
    ready: Callable[[], None] | None = None,
    only: list[str] | None = None,
    report: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Connect as the server, call ``ready()`` (e.g. start the device), run the checks.

    ``formats``: the program formats offered (the device picks one it runs). ``only``: check
    names (without ``check_``) to run. Each outcome goes to ``report`` as it is known.
    """
    tasks = TaskFactory(formats)
    peer = ServerPeer(broker_url, fleet, device_id, ca_file).start()
    outcomes = []
    try:
        if ready:
            ready()
        ctx = Context(peer, tasks)
        for check in CHECKS:
            name = check.__name__.removeprefix("check_")
            if only and name not in only:
                continue
            started = time.monotonic()
            try:
                check(ctx)
                outcome = Outcome(name, True, "", time.monotonic() - started)
            except CheckFailed as exc:
                outcome = Outcome(name, False, str(exc), time.monotonic() - started)
            except Exception as exc:  # a crash of the kit itself is a failure too, with its reason
                outcome = Outcome(name, False, f"{type(exc).__name__}: {exc}", time.monotonic() - started)
            outcomes.append(outcome)
            if report:
                report(outcome)
    finally:
        peer.close()
    return outcomes


def check_names() -> list[str]:
    return [c.__name__.removeprefix("check_") for c in CHECKS]


__all__ = ["Outcome", "run_checks", "check_names", "CheckFailed"]
