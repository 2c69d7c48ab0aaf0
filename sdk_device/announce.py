"""When a device says hello again and re-offers its result (docs/protocol.md §3.1, §9.5).

The ``Announcer`` watches the server's retained epoch and status and the device's own MQTT
connection (``Endpoint.on_server_event``, paho's thread) and sends from its own timer
thread, so a device busy training still answers a server restart:

* **hello**: the agent sends one at start. A server epoch different from the one this device
  last said hello to (a restarted server) -> hello again after a uniformly random delay in
  ``[0, window]``: ``window`` is the device's own setting if given, else the epoch's
  ``announce_window_s``. The first epoch seen after start needs none when it is a retained
  copy (the start hello went to that server, or waits in its session); arriving live, it is a
  server that started after the start hello, which it may never have received: hello again.
  A server publishing no epoch (before this protocol addition): hello when its status turns
  ``online`` live (not a retained copy).
* **result re-offer**: the result waiting for the server's ``ack``/``error`` is sent again
  after the device's own reconnect, after the server's status turns ``online`` live (it
  reconnected: a broker restart may have lost what was in flight) and after the hello to a
  new epoch.
* **server_online**: False while the server's status is ``offline`` (the agent then sends
  no heartbeats).
* **status request** (§3.2): after the start hello and after each reconnect, a
  ``status_request``; the server's ``server_status`` answer counts as a retained epoch and
  status would, so a broker without retained messages (or a cluster whose retained copies are
  per node, or stale) still tells the device who the server is. Repeated after
  ``STATUS_RETRY_S`` seconds while no epoch of any kind has arrived since, at most
  ``STATUS_ATTEMPTS`` times per connection (the server, when it starts, broadcasts its epoch
  live anyway).

The delayed hello runs on a ``threading.Timer`` unless ``schedule(delay_s, fn)`` is given: a
function that calls ``fn()`` after ``delay_s`` seconds and returns something with ``cancel()``
(the device swarm passes its event loop's, so thousands of devices need no thread each).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Protocol

from .protocol import messages as msgs
from .protocol.epoch import ServerEpoch

log = logging.getLogger(__name__)

STATUS_RETRY_S = (10.0, 30.0)  # seconds after the previous status_request, while unanswered
STATUS_ATTEMPTS = 1 + len(STATUS_RETRY_S)  # status_requests per connection at most


class Cancellable(Protocol):
    def cancel(self) -> None: ...


Schedule = Callable[[float, Callable[[], None]], Cancellable]


def thread_timer(delay_s: float, fn: Callable[[], None]) -> Cancellable:
    """Call ``fn()`` after ``delay_s`` seconds on a daemon timer thread (the agent's scheduler)."""
    timer = threading.Timer(delay_s, fn)
    timer.daemon = True
    timer.start()
    return timer


class Announcer:
    """Hello and result re-offer on server restarts and reconnects (module docstring)."""

    def __init__(self, send: Callable[[msgs.Message], None], hello: msgs.Hello,
                 window_s: float | None = None, rng: random.Random | None = None,
                 schedule: Schedule = thread_timer) -> None:
        self._send = send
        self._schedule = schedule
        self.hello = hello
        self.window_s = window_s  # None: the server's announce_window_s
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._announced: str | None = None  # epoch of the server the last hello went to
        self._target: str | None = None  # epoch a scheduled hello is for
        self._timer: Cancellable | None = None
        self._result: msgs.Result | None = None
        self._closed = False
        self.server_online = True  # until the server's status says otherwise
        self.hellos = 0
        self.reoffers = 0
        self.status_requests = 0
        self._connection = 0  # counts the connects we asked the server's status for
        self._epochs_seen = 0  # epochs received (retained, live or answered): ends the retries

    @property
    def announced(self) -> str | None:
        """The epoch of the server the last hello went to (or that answered us first)."""
        return self._announced

    # -- the agent's side -------------------------------------------------------------------
    def say_hello(self) -> None:
        """Send the hello now (the agent's start hello), then ask for the server's status."""
        self._send_hello()
        self.request_status()

    def request_status(self) -> None:
        """Send a ``status_request`` now and again while unanswered (module docstring)."""
        with self._lock:
            if self._closed:
                return
            self._connection += 1
            connection, seen = self._connection, self._epochs_seen
        self._ask_status(connection, seen, 0)

    def _ask_status(self, connection: int, seen: int, attempt: int) -> None:
        with self._lock:
            if self._closed or connection != self._connection or self._epochs_seen != seen:
                return  # a newer connection asks for itself; or an epoch arrived
        try:
            self._send(msgs.StatusRequest())
            self.status_requests += 1
        except Exception:  # the link retries; never kill paho's or the timer's thread
            log.warning("status_request not sent", exc_info=True)
        if attempt < len(STATUS_RETRY_S):
            self._schedule(STATUS_RETRY_S[attempt], lambda: self._ask_status(connection, seen, attempt + 1))

    def awaiting(self, result: msgs.Result | None) -> None:
        """The result to re-offer until the server answers it (None: nothing waits)."""
        with self._lock:
            self._result = result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()

    # -- events (paho's thread) -------------------------------------------------------------
    def on_event(self, kind: str, value: object, retained: bool) -> None:
        if kind == "epoch" and isinstance(value, ServerEpoch):
            self._on_epoch(value, retained)
        elif kind == "status":
            self.server_online = value == "online"
            if value == "online" and not retained:  # the server (re)connected just now
                legacy = self._announced is None and self._target is None
                log.info("server is online again%s", " (no epoch: hello now)" if legacy else "")
                if legacy:  # a server without epochs: hello as protocol v2 always did
                    self._send_hello()
                self._reoffer("the server reconnected")
        elif kind == "connected" and value:
            self.request_status()
            self._reoffer("reconnected to the broker")

    def _on_epoch(self, epoch: ServerEpoch, retained: bool) -> None:
        with self._lock:
            self._epochs_seen += 1
            if self._closed or epoch.epoch in (self._announced, self._target):
                return
            if self._announced is None and self._target is None and retained:
                self._announced = epoch.epoch  # the start hello went to this server
                log.info("server epoch %s", epoch.epoch[:8])
                return
            window = epoch.announce_window_s if self.window_s is None else self.window_s
            delay = self._rng.uniform(0.0, max(0.0, window))
            self._target = epoch.epoch
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._schedule(delay, lambda: self._announce(epoch.epoch))
        log.info("new server epoch %s: hello in %.2f s (window %.1f s)", epoch.epoch[:8], delay, window)

    def _announce(self, epoch: str) -> None:
        with self._lock:
            if self._closed or self._target != epoch:
                return
            self._target, self._announced = None, epoch
        self._send_hello()
        self._reoffer("the server restarted")

    # -- sending ----------------------------------------------------------------------------
    def _send_hello(self) -> None:
        try:
            self._send(self.hello)
            self.hellos += 1
        except Exception:  # the link retries; never kill paho's or the timer's thread
            log.warning("hello not sent", exc_info=True)

    def _reoffer(self, why: str) -> None:
        with self._lock:
            result = self._result
        if result is None:
            return
        log.info("offering the result of task %s again (%s)", result.task_id[:8], why)
        try:
            self._send(result)
            self.reoffers += 1
        except Exception:
            log.warning("result not re-sent", exc_info=True)
