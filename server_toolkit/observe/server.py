"""The dashboard's web server: uvicorn serving ``observe/app.py`` on a thread of its own, so that
the round loop never waits for a browser (nor a browser for a round)."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import threading
import time

import uvicorn

from .access import Bind, DashboardError
from .app import build_app
from .state import DashboardState

log = logging.getLogger(__name__)


class DashboardServer:
    """``start()`` binds (a one-line ``DashboardError`` when it cannot) and serves in the background;
    ``stop()`` ends it. ``bind.port`` 0 picks a free port (then read ``port``)."""

    def __init__(self, state: DashboardState, bind: Bind, token: str | None) -> None:
        self.bind, self.token = bind, token
        config = uvicorn.Config(build_app(state, token), log_level="warning", access_log=False,
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.port = bind.port

    def start(self) -> DashboardServer:
        sock = _listen(self.bind)
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="dashboard", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            raise DashboardError(f"dashboard on {self.bind.host}:{self.port} did not start")
        return self

    def _serve(self, sock: socket.socket) -> None:
        asyncio.run(self._server.serve(sockets=[sock]))

    def url(self, with_token: bool = False) -> str:
        return Bind(self.bind.host, self.port).url(self.token if with_token else None)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)


def _listen(bind: Bind) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind.host, bind.port))
    except OSError as exc:
        sock.close()
        why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
        raise DashboardError(f"--dashboard {bind.host}:{bind.port} {why}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock
