"""Swarm devices on a loopback broker bind their own loopback source address (swarm/link.py):
the wildcard address shares one ephemeral port range, which capped a host at 28,158 devices."""

from __future__ import annotations

import socket

from server_toolkit.swarm.link import loopback_source


def test_a_loopback_broker_gives_each_device_a_stable_loopback_source_address():
    first = loopback_source("127.0.0.1", "fedsdk-dev-fleet-swarm-00001")
    assert first == loopback_source("127.0.0.1", "fedsdk-dev-fleet-swarm-00001")
    assert first.startswith("127.") and first != "127.0.0.1"
    sources = {loopback_source("127.0.0.1", f"fedsdk-dev-fleet-swarm-{i:05d}") for i in range(1000)}
    assert len(sources) > 990  # spread: a few collisions share one address's 28k ports, harmlessly


def test_other_brokers_keep_the_wildcard_source_address():
    for host in ("broker.example.org", "localhost", "::1", "10.0.0.5", "192.168.1.20"):
        assert loopback_source(host, "fedsdk-dev-fleet-d1") == ""


def test_a_socket_bound_to_the_picked_address_reaches_a_listener_on_127_0_0_1():
    server = socket.create_server(("127.0.0.1", 0))
    try:
        source = loopback_source("127.0.0.1", "fedsdk-dev-fleet-d1")
        client = socket.create_connection(server.getsockname(), timeout=5, source_address=(source, 0))
        peer, address = server.accept()
        assert address[0] == source
        peer.close()
        client.close()
    finally:
        server.close()
