"""One MQTT connection (paho-mqtt 2.x) with the settings fedsdk relies on.

* MQTT 3.1.1 with ``clean_session=False`` and a stable client id, so QoS-1 messages
  queue on the broker while a device is offline (the embedded broker speaks only 3.1.1;
  with MQTT 5 a session expiry would be needed instead, paho's default 0 loses them).
* QoS 1 everywhere (heartbeats: QoS 0, never queued for an offline peer), a small
  in-flight window, reconnect with exponential backoff (1 s .. 30 s), a retained
  "online"/"offline" status topic with a last will.
* Payload sizes are checked *before* publishing: paho ignores the broker's maximum packet
  size and would otherwise re-send an oversized message forever.
* ``on_message`` runs on paho's network thread and must return quickly (paho acknowledges
  after it returns): handlers only parse and enqueue.
* A broker that refuses the login, or a TLS certificate that fails verification, raises
  ``BrokerRefused`` (waiting would not fix it); an unreachable broker raises a plain
  ``ConnectionError`` (``backoff.connect_patiently`` retries those). A refusal on one of
  paho's later reconnects is kept in ``refused`` for the owner to act on.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable

import paho.mqtt.client as mqtt

from .broker_address import BrokerAddress
from .tls import check_plain_tcp

log = logging.getLogger(__name__)

DEFAULT_MAX_PAYLOAD = 8 * 1024 * 1024  # bytes; chunks are far smaller


# CONNACK refusals that waiting does not fix (paho names MQTT 3.1.1 codes with MQTT 5 ones);
# "Server unavailable", "Server busy" and the like are retried as an unreachable broker.
PERMANENT_REFUSALS = {"Bad user name or password", "Not authorized", "Client identifier not valid",
                      "Unsupported protocol version", "Bad authentication method", "Banned"}


class BrokerRefused(ConnectionError):
    """A permanent connection failure: credentials refused or the broker's certificate not
    trusted. ``tls`` tells which."""

    def __init__(self, text: str, tls: bool = False) -> None:
        super().__init__(text)
        self.tls = tls


def _disable_nagle(client: mqtt.Client) -> None:
    """Send small control messages at once: with Nagle's algorithm a blob request waits
    ~40 ms for the peer's delayed ACK (measured: 1 MB fetches took 42 ms instead of ~5)."""
    sock = client.socket()
    if sock is not None and hasattr(sock, "setsockopt"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


MessageHandler = Callable[..., None]  # (topic, payload) or, with pass_retain, (topic, payload, retained)


class MqttLink:
    """A connected paho client: ``publish``, ``subscribe``, ``close``.

    ``handler(topic, payload)`` is called on paho's thread for every message received
    (``handler(topic, payload, retained)`` with ``pass_retain``: ``retained`` is True for a
    retained copy delivered because we subscribed, False for a live message).
    ``on_connected(reconnect)`` runs on paho's thread after every successful CONNACK, once the
    subscriptions, the kept retained messages and the status ``online`` are queued.
    Plain ``mqtt://`` to a non-loopback broker raises ``InsecureTransportError`` unless
    ``insecure``.
    """

    def __init__(
        self,
        broker: BrokerAddress,
        client_id: str,
        handler: MessageHandler,
        *,
        status_topic: str | None = None,
        subscriptions: list[str] | None = None,
        username: str | None = None,
        password: str | None = None,
        ca_file: str | None = None,
        tls_verify: bool = True,
        clean_session: bool = False,
        keepalive_s: int = 30,
        max_inflight: int = 16,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        insecure: bool = False,
        pass_retain: bool = False,
        on_connected: Callable[[bool], None] | None = None,
    ) -> None:
        check_plain_tcp(broker.host, broker.tls, insecure)
        self.broker = broker
        self.client_id = client_id
        self.max_payload = max_payload
        self._handler = handler
        self._status_topic = status_topic
        self._subscriptions = list(subscriptions or [])
        self._connected = threading.Event()
        self._answered = threading.Event()  # a CONNACK came: accepted or refused
        self._refused: str | None = None
        self._closing = False
        self._pass_retain = pass_retain
        self._on_connected = on_connected
        self._kept: dict[str, bytes] = {}  # topic -> retained payload re-published on every connect
        self._connects = 0
        self._node = 0  # index in broker.nodes of the node we use

        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=mqtt.MQTTv311,
        )
        user = username or broker.username
        if user:
            client.username_pw_set(user, password or broker.password)
        if broker.tls and tls_verify:
            client.tls_set(ca_certs=ca_file, cert_reqs=ssl.CERT_REQUIRED)
        elif broker.tls:  # only to fetch a CA that is then checked against a pinned fingerprint
            client.tls_set(cert_reqs=ssl.CERT_NONE)
            client.tls_insecure_set(True)
        if status_topic:
            client.will_set(status_topic, b"offline", qos=1, retain=broker.retain)
        client.max_inflight_messages_set(max_inflight)
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        client.on_message = self._on_message
        self._client = client
        self._keepalive_s = keepalive_s

    # -- lifecycle -----------------------------------------------------------------------
    def connect(self, timeout_s: float = 15.0) -> MqttLink:
        """Connect (to the first node of the broker URL that answers) and start the network
        thread; raises ConnectionError with the reason (the last node's)."""
        for i, (host, port) in enumerate(self.broker.nodes):
            self._node = i
            try:
                return self._connect_to(host, port, timeout_s)
            except BrokerRefused:
                raise
            except ConnectionError:
                if i == len(self.broker.nodes) - 1:
                    raise
                log.warning("broker node %s:%d unreachable; trying the next", host, port)
        raise AssertionError("unreachable")

    def _connect_to(self, host: str, port: int, timeout_s: float) -> MqttLink:
        self._answered.clear()
        self._refused = None
        try:
            self._client.connect(host, port, keepalive=self._keepalive_s)
        except ssl.SSLCertVerificationError as exc:
            raise BrokerRefused(f"cannot reach MQTT broker at {self.broker.url}: {exc}", tls=True) from exc
        except (OSError, ssl.SSLError) as exc:
            raise ConnectionError(f"cannot reach MQTT broker at {self.broker.url}: {exc}") from exc
        self._client.loop_start()
        self._answered.wait(timeout_s)
        if not self._connected.is_set():
            self._client.loop_stop()
            if self._refused:
                raise BrokerRefused(f"MQTT broker at {self.broker.url} refused us: {self._refused}")
            raise ConnectionError(f"MQTT broker at {self.broker.url} refused us: no answer within "
                                  f"{timeout_s:.0f} s")
        return self

    def close(self) -> None:
        """Say "offline" (a clean disconnect suppresses the last will) and disconnect."""
        self._closing = True
        if self._connected.is_set() and self._status_topic:
            info = self._client.publish(self._status_topic, b"offline", qos=1, retain=self.broker.retain)
            try:
                info.wait_for_publish(timeout=3)
            except (RuntimeError, ValueError):
                pass
        self._client.disconnect()
        self._client.loop_stop()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def refused(self) -> str | None:
        """The broker's reason when its last answer refused our login (None after an accept)."""
        return self._refused

    @property
    def connects(self) -> int:
        """Successful CONNACKs so far (1 after the first connect; more after reconnects)."""
        return self._connects

    # -- traffic -------------------------------------------------------------------------
    def publish(self, topic: str, payload: bytes, *, retain: bool = False,
                qos: int = 1) -> mqtt.MQTTMessageInfo:
        """Queue a publish (QoS 1 unless told); ValueError if ``payload`` exceeds ``max_payload``
        bytes. A QoS-0 publish made while disconnected is dropped, not queued."""
        if len(payload) > self.max_payload:
            raise ValueError(
                f"refusing to publish {len(payload)} bytes to {topic}: limit is {self.max_payload}"
            )
        if qos == 0 and not self._connected.is_set():
            dropped = mqtt.MQTTMessageInfo(0)
            dropped.rc = mqtt.MQTT_ERR_NO_CONN
            return dropped
        return self._client.publish(topic, payload, qos=qos, retain=retain and self.broker.retain)

    def keep_retained(self, topic: str, payload: bytes) -> None:
        """Publish ``payload`` retained (QoS 1) now if connected, and again after every
        (re)connect, before the status ``online`` (the server's epoch, §3.1)."""
        self._kept[topic] = payload
        if self._connected.is_set():
            self._client.publish(topic, payload, qos=1, retain=self.broker.retain)

    def subscribe(self, topics: list[str]) -> None:
        """Add subscriptions (QoS 1); they are renewed after every reconnect."""
        self._subscriptions.extend(topics)
        if self._connected.is_set():
            self._client.subscribe([(t, 1) for t in topics])

    # -- paho callbacks (network thread) -------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            if str(reason_code) in PERMANENT_REFUSALS:
                self._refused = str(reason_code)
                self._answered.set()
            log.error("broker %s refused connection: %s", self.broker.url, reason_code)
            return
        self._refused = None
        _disable_nagle(client)
        if self._subscriptions:
            client.subscribe([(t, 1) for t in self._subscriptions])
        for topic, payload in list(self._kept.items()):
            client.publish(topic, payload, qos=1, retain=self.broker.retain)
        if self._status_topic:
            client.publish(self._status_topic, b"online", qos=1, retain=self.broker.retain)
        if self._connects:
            log.info("%s reconnected to %s", self.client_id, self.broker.url)
        else:
            log.debug("%s connected to %s", self.client_id, self.broker.url)
        self._connected.set()
        self._answered.set()
        self._connects += 1
        if self._on_connected is not None:
            try:
                self._on_connected(self._connects > 1)
            except Exception:  # a hook bug must never kill paho's thread
                log.exception("on_connected hook failed")

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self._connected.clear()
        if not self._closing:
            log.warning("%s lost the broker (%s); reconnecting", self.client_id, reason_code)
            self._next_node()

    def _on_connect_fail(self, client, userdata) -> None:
        if not self._closing:
            log.warning("%s: broker %s unreachable; paho tries again within 30 s", self.client_id,
                        self.broker.url)
            self._next_node()

    def _next_node(self) -> None:
        """Several broker nodes: paho's next reconnect goes to the next one (a failover)."""
        nodes = self.broker.nodes
        if len(nodes) < 2:
            return
        self._node = (self._node + 1) % len(nodes)
        # paho's public host/port setters refuse while its state is "connection lost", which is
        # exactly when its reconnect loop runs; reconnect() reads these two (paho 2.x).
        self._client._host, self._client._port = nodes[self._node]
        log.info("%s: reconnecting to broker node %s:%d", self.client_id, *nodes[self._node])

    def _on_message(self, client, userdata, message) -> None:
        try:
            if self._pass_retain:
                self._handler(message.topic, message.payload, bool(message.retain))
            else:
                self._handler(message.topic, message.payload)
        except Exception:  # a handler bug must never kill paho's thread
            log.exception("handler failed for a message on %s", message.topic)


def probe_login(
    broker: BrokerAddress,
    username: str | None,
    password: str | None,
    *,
    ca_file: str | None = None,
    client_id: str = "",
    timeout_s: float = 10.0,
) -> str:
    """Log in once (clean session) and disconnect; the broker's answer as text.

    ``"Success"``, ``"Not authorized"``, ``"Bad user name or password"``..., or
    ``"unreachable: <why>"`` (refused socket, TLS failure) / ``"timeout"``.
    """
    answer: dict[str, str] = {}
    done = threading.Event()

    def on_connect(client, userdata, flags, reason_code, properties) -> None:
        answer["reason"] = str(reason_code)
        done.set()

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=True,
                         protocol=mqtt.MQTTv311)
    if username is not None:
        client.username_pw_set(username, password)
    if broker.tls:
        client.tls_set(ca_certs=ca_file, cert_reqs=ssl.CERT_REQUIRED)
    client.on_connect = on_connect
    try:
        client.connect(broker.host, broker.port, keepalive=10)
    except (OSError, ssl.SSLError) as exc:
        return f"unreachable: {exc}"
    client.loop_start()
    try:
        if not done.wait(timeout_s):
            return "timeout"
        return answer["reason"]
    finally:
        client.disconnect()
        client.loop_stop()
