"""Accounts and ACL on a real mosquitto: what each account can and cannot reach.

Every "nothing crosses" check is closed by a sentinel: the sender publishes a permitted
message after the forbidden ones, on the same connection; mosquitto forwards one client's
messages in order, so once the sentinel has arrived anything forbidden would have too.
"""

from __future__ import annotations

import threading
import time

import pytest

from sdk_device.transport.mqtt_link import MqttLink, probe_login
from server_toolkit.broker.security import PAIR_PASSWORD, PAIR_USERNAME, pair_topic

pytestmark = pytest.mark.integration


class Client:
    """A real MQTT client (fedsdk's MqttLink) that records what it receives."""

    def __init__(self, secured, client_id: str, username: str | None, password: str | None,
                 subscriptions: list[str]) -> None:
        self.received: list[tuple[str, bytes]] = []
        self._changed = threading.Condition()
        self.link = MqttLink(secured.address, client_id, self._on_message, subscriptions=subscriptions,
                             username=username, password=password, ca_file=secured.ca_file)

    def _on_message(self, topic: str, payload: bytes) -> None:
        with self._changed:
            self.received.append((topic, payload))
            self._changed.notify_all()

    def start(self) -> Client:
        self.link.connect(timeout_s=15)
        time.sleep(0.3)  # let the SUBSCRIBEs reach the broker before anyone publishes
        return self

    def wait_for(self, payload: bytes, timeout_s: float = 15.0) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: any(p == payload for _, p in self.received), timeout_s)

    def payloads(self) -> set[bytes]:
        with self._changed:
            return {p for _, p in self.received}

    def publish(self, topic: str, payload: bytes) -> None:
        self.link.publish(topic, payload).wait_for_publish(timeout=10)

    def close(self) -> None:
        self.link.close()


@pytest.fixture
def fleet(secured_mosquitto):
    """Devices A and B granted, the server connected to everything of the fleet and pairing."""
    secured = secured_mosquitto
    base = f"fedsdk/v1/{secured.fleet}"
    secured.security.grant_device("A", "password-A")
    secured.security.grant_device("B", "password-B")
    server = Client(secured, "fedsdk-server-sec", *secured.security.server_credentials(),
                    [f"{base}/#", "fedsdk/v1/pair/+/req"]).start()
    clients = [server]
    yield secured, base, server, clients
    for client in clients:
        client.close()


def device(secured, clients, dev: str, subscriptions: list[str]) -> Client:
    client_id = f"fedsdk-dev-{secured.fleet}-{dev}"
    client = Client(secured, client_id, dev, f"password-{dev}", subscriptions).start()
    clients.append(client)
    return client


def test_a_device_cannot_read_or_write_another_devices_subtree(fleet):
    secured, base, server, clients = fleet
    # A asks for B's subtree in every way it can; B subscribes like a real device.
    a = device(secured, clients, "A", [f"{base}/dev/A/#", f"{base}/dev/B/#", f"{base}/dev/+/down",
                                       f"{base}/#", "#"])
    b = device(secured, clients, "B", [f"{base}/dev/B/#", f"{base}/server/status", f"{base}/broadcast/#"])

    # server -> B and B -> server: B and the server see them, A sees nothing of B.
    server.publish(f"{base}/dev/B/down", b"server to B")
    b.publish(f"{base}/dev/B/up", b"B to server")
    server.publish(f"{base}/broadcast/all", b"broadcast")
    server.publish(f"{base}/dev/A/down", b"server to A")  # sentinel for A
    assert a.wait_for(b"server to A") and b.wait_for(b"server to B") and b.wait_for(b"broadcast")
    assert server.wait_for(b"B to server")
    assert a.payloads() == {b"server to A", b"broadcast"}

    # A writes into B's subtree, spoofs the server status and the broadcast: nobody gets it.
    for topic in (f"{base}/dev/B/down", f"{base}/dev/B/down/chunk", f"{base}/dev/B/up",
                  f"{base}/dev/B/status", f"{base}/server/status", f"{base}/broadcast/all",
                  "fedsdk/v1/other-fleet/dev/B/down"):
        a.publish(topic, b"forged by A")
    a.publish(f"{base}/dev/A/up", b"A sentinel")
    assert server.wait_for(b"A sentinel")
    assert b"forged by A" not in server.payloads() | b.payloads()

    # And the other direction: B into A's subtree.
    b.publish(f"{base}/dev/A/down", b"forged by B")
    b.publish(f"{base}/dev/A/up", b"forged by B")
    b.publish(f"{base}/dev/B/up", b"B sentinel")
    assert server.wait_for(b"B sentinel")
    assert b"forged by B" not in server.payloads() | a.payloads()


def test_revoked_device_is_cut_off_and_cannot_reconnect(fleet):
    secured, base, server, clients = fleet
    a = device(secured, clients, "A", [f"{base}/dev/A/#"])
    assert a.link.connected
    secured.security.revoke_device("A")
    deadline = time.monotonic() + 15
    while a.link.connected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not a.link.connected, "the revoked device's live session was not cut"
    assert probe_login(secured.address, "A", "password-A", ca_file=secured.ca_file) == "Not authorized"
    # paho keeps retrying in the background: it must stay out, and B is unaffected.
    time.sleep(2.5)
    assert not a.link.connected
    assert secured.security.devices() == ["B"]
    assert probe_login(secured.address, "B", "password-B", ca_file=secured.ca_file) == "Success"


def test_unknown_or_unpaired_clients_cannot_connect(secured_mosquitto):
    secured = secured_mosquitto
    secured.security.grant_device("A", "password-A")
    address, ca = secured.address, secured.ca_file
    assert probe_login(address, None, None, ca_file=ca) == "Not authorized"  # anonymous
    assert probe_login(address, "stranger", "guess", ca_file=ca) == "Not authorized"
    assert probe_login(address, "A", "wrong password", ca_file=ca) == "Not authorized"
    assert probe_login(address, "fedsdk-server", "guess", ca_file=ca) == "Not authorized"
    assert probe_login(address, "A", "password-A", ca_file=ca) == "Success"


def test_pairing_account_reaches_only_its_own_pairing_topics(fleet):
    secured, base, server, clients = fleet
    secured.security.grant_device("A", "password-A")
    pair_all = [f"fedsdk/v1/pair/{cid}/#" for cid in ("p1", "p2", "+")]
    p1 = Client(secured, "p1", PAIR_USERNAME, PAIR_PASSWORD, [*pair_all, f"{base}/#", "#"]).start()
    p2 = Client(secured, "p2", PAIR_USERNAME, PAIR_PASSWORD, [pair_topic("p2", "resp")]).start()
    clients += [p1, p2]
    a = device(secured, clients, "A", [f"{base}/dev/A/#"])

    # The server answers p2 and talks to device A: p1 reads none of it.
    server.publish(pair_topic("p2", "resp"), b"credentials for p2")
    server.publish(f"{base}/dev/A/down", b"server to A")
    server.publish(f"{base}/server/status", b"online")
    server.publish(pair_topic("p1", "resp"), b"answer for p1")  # sentinel for p1
    assert p2.wait_for(b"credentials for p2") and a.wait_for(b"server to A") and p1.wait_for(b"answer for p1")
    assert p1.payloads() == {b"answer for p1"}

    # p1 writes into device, server and p2's pairing topics: nobody gets it; its own request arrives.
    for topic in (f"{base}/dev/A/down", f"{base}/dev/A/up", f"{base}/server/status", f"{base}/broadcast/x",
                  pair_topic("p2", "resp"), pair_topic("p2", "req")):
        p1.publish(topic, b"forged by pairing")
    p1.publish(pair_topic("p1", "req"), b"pairing request p1")
    assert server.wait_for(b"pairing request p1")
    assert b"forged by pairing" not in server.payloads() | a.payloads() | p2.payloads()


def test_cli_sets_up_a_tls_broker_and_grants_and_revokes_by_hand(tmp_path):
    """certs init -> security init -> (broker) -> security grant/show/revoke, as a user types them."""
    import re

    from click.testing import CliRunner

    from server_toolkit.broker.mosquitto import free_port
    from server_toolkit.broker.secured import server_connection, start_secured_broker
    from server_toolkit.cli import main

    d = tmp_path / "broker"
    runner = CliRunner()
    made = runner.invoke(main, ["certs", "init", "--dir", str(d), "--host", "localhost",
                                "--host", "127.0.0.1"])
    assert made.exit_code == 0 and "sha256:" in made.output, made.output
    port = str(free_port())
    init = runner.invoke(main, ["security", "init", "--dir", str(d), "--fleet", "lab", "--host", "127.0.0.1",
                                "--port", port])
    assert init.exit_code == 0, init.output
    assert "mqtts://127.0.0.1:" + port in init.output and (d / "mosquitto.conf").is_file()
    again = runner.invoke(main, ["security", "init", "--dir", str(d), "--fleet", "lab"])
    assert again.exit_code != 0 and "exists already" in again.output

    with start_secured_broker(d, workdir=tmp_path / "data") as secured:
        granted = runner.invoke(main, ["security", "grant", "--dir", str(d), "pi-7"])
        assert granted.exit_code == 0, granted.output
        password = re.search(r"password (\S+) \(shown once\)", granted.output).group(1)
        address, ca_file, _ = server_connection(d)
        assert address.tls and address.port == int(port)
        assert probe_login(address, "pi-7", password, ca_file=ca_file) == "Success"
        assert "pi-7" in runner.invoke(main, ["security", "show", "--dir", str(d)]).output
        assert runner.invoke(main, ["security", "revoke", "--dir", str(d), "pi-7"]).exit_code == 0
        assert probe_login(address, "pi-7", password, ca_file=ca_file) == "Not authorized"
        bad = runner.invoke(main, ["security", "grant", "--dir", str(d), "fedsdk-server"])
        assert bad.exit_code != 0 and "taken" in bad.output
        assert secured.security.devices() == []
