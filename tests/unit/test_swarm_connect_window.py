"""A swarm process opens at most MAX_CONNECTING connections that wait for their CONNACK: a
broker (or a process) that is slow gets fewer new sockets, not more sessions it will drop."""

from __future__ import annotations

import socket
import threading
import time

from server_toolkit.swarm.shard import MAX_CONNECTING, Shard, ShardConfig


def silent_broker() -> tuple[socket.socket, list[socket.socket]]:
    """A TCP listener that accepts every connection and never answers (no CONNACK)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=512)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return server, held


def test_devices_wait_to_connect_while_max_connecting_of_them_await_their_connack():
    server, held = silent_broker()
    port = server.getsockname()[1]
    ids = tuple(f"swarm-{i:03d}" for i in range(MAX_CONNECTING + 50))
    shard = Shard(ShardConfig(f"mqtt://127.0.0.1:{port}", "scale", ids, connect_rate=0))  # 0: all at once
    shard.close = lambda: None  # no devices to say goodbye to (the finally below drops the sockets)
    state: dict = {"passes": 0}

    def stop() -> bool:
        state["passes"] += 1
        if state["passes"] == 20:
            state["window"] = (len(shard.links), shard.connecting)
            shard.connecting -= 1  # as if one CONNACK arrived: exactly one more device may connect
        return state["passes"] > 25

    try:
        shard.run(stop)
        assert state["window"] == (MAX_CONNECTING, MAX_CONNECTING)
        assert len(shard.links) == MAX_CONNECTING + 1
        deadline = time.monotonic() + 5
        while len(held) < MAX_CONNECTING + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(held) == MAX_CONNECTING + 1  # the broker saw exactly those sockets, no more
    finally:
        for link in shard.links:
            link.vanish()
        server.close()
        for sock in held:
            sock.close()
