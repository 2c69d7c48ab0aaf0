"""Waiting for a broker that is not up yet: exponential backoff with jitter.

A device often boots before its server (a board on the same power strip, a laptop that
wakes first): the agent keeps trying instead of exiting. Waits double from 1 s up to a
60 s cap; each is drawn uniformly from [0.5, 1] x the current step, so a fleet that lost
its broker together does not come back in lockstep. Only an unreachable broker is retried:
``BrokerRefused`` (a refused login, an untrusted certificate) passes through at once —
waiting would not fix a bad password or a wrong CA.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from .mqtt_link import BrokerRefused

log = logging.getLogger(__name__)

FIRST_WAIT_S = 1.0
MAX_WAIT_S = 60.0
ATTEMPT_TIMEOUT_S = 15.0  # how long one attempt waits for the broker's CONNACK


class Backoff:
    """Successive waits in seconds: 1, 2, 4, ... capped at ``cap_s``, each times U(0.5, 1)."""

    def __init__(self, first_s: float = FIRST_WAIT_S, cap_s: float = MAX_WAIT_S,
                 rng: random.Random | None = None) -> None:
        self.first_s, self.cap_s = first_s, cap_s
        self._step = 0.0
        self._rng = rng or random.Random()

    def next_wait(self) -> float:
        self._step = self.first_s if self._step == 0 else min(self.cap_s, 2 * self._step)
        return self._step * self._rng.uniform(0.5, 1.0)


def connect_patiently(connect: Callable[[float], object], stop: threading.Event,
                      timeout_s: float | None = None, backoff: Backoff | None = None) -> bool:
    """Call ``connect(attempt_timeout_s)`` until it returns (True) or ``stop`` is set (False).

    Each failed attempt logs one line with the next wait. With ``timeout_s`` (seconds, for
    scripts) a ConnectionError is raised once that much time has passed without a
    connection; None waits forever. ``BrokerRefused`` is never retried.
    """
    backoff = backoff or Backoff()
    started = time.monotonic()
    attempt = 0
    while not stop.is_set():
        attempt += 1
        left = None if timeout_s is None else timeout_s - (time.monotonic() - started)
        try:
            connect(ATTEMPT_TIMEOUT_S if left is None else max(1.0, min(ATTEMPT_TIMEOUT_S, left)))
            return True
        except BrokerRefused:
            raise
        except ConnectionError as exc:
            wait = backoff.next_wait()
            if timeout_s is not None:
                left = timeout_s - (time.monotonic() - started)
                if left <= 0:
                    raise ConnectionError(f"{exc} (gave up after {attempt} attempt"
                                          f"{'s' if attempt > 1 else ''} in {timeout_s:g} s)") from exc
                wait = min(wait, left)
            log.warning("%s (attempt %d); next attempt in %.1f s", exc, attempt, wait)
            if stop.wait(wait):
                break
    return False
