"""Many device MQTT connections on one thread: ``MqttLink`` driven by an epoll loop.

Each simulated device has its own connection, configured exactly as a real device's
(``sdk_device.transport.mqtt_link.MqttLink``: client id ``fedsdk-dev-<fleet>-<id>``,
persistent session, last will ``offline`` on its status topic, ``online`` after every
CONNACK, QoS 1, 16 in flight, TCP_NODELAY, TLS and credentials). Only the network loop
differs: a real device runs paho's own thread, which ``select()``s on one socket; here one
``selectors`` loop (epoll: no 1,024-descriptor limit) serves thousands of sockets through
paho's external-loop hooks, and reconnects with the same backoff (1 s doubling to 30 s).

Source addresses: paho binds every socket before connecting (to ``("", 0)`` unless told
otherwise), and a socket bound to the wildcard address needs a local port no other socket on
the machine holds. The kernel's ephemeral range here is 32768-60999, so all swarm processes of
one host together stopped at 28,158 connections, each further ``bind`` failing after about
16 ms of search (measured: ``bench/sites.py --devices 100000``, 80 % of the CPU in system
time). To a loopback broker a device therefore binds its own loopback source address
(``127.x.y.z``, stable per device id: ``loopback_source``), each of which has the whole port
range to itself. Non-loopback brokers keep paho's default: a real host runs one device.

Connect timeout: paho's TCP connect blocks its caller (up to 5 s by default), and here the caller
is the loop of every device of the process. A site broker short of CPU lets its listen queue
overflow; a connect then waits for the SYN's retransmission (strace: one ``poll`` of 3.06 s)
while no other device of the process sends its keepalive, the broker drops them, they reconnect
into the same queue, and the site collapsed (12,205 "exceeded timeout" at site 8 of
``bench/sites.py --devices 100000``). A swarm connect gives up after ``CONNECT_TIMEOUT_S`` and
retries with the backoff instead (a loopback connect that is accepted takes well under 1 ms).
TLS links keep paho's 5 s: their handshake runs under the same timeout and costs the broker CPU.
"""

from __future__ import annotations

import hashlib
import heapq
import ipaddress
import itertools
import logging
import random
import selectors
import ssl
import time
from collections.abc import Callable

from sdk_device.transport.mqtt_link import MqttLink

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 0.1  # longest a device's TCP connect may hold the loop (see above)
RECONNECTS_PER_PASS = 10  # reconnects due started per pass of the loop at most (the rest wait)


class Timer:
    """A call the loop makes later (``EventLoop.call_later``), unless cancelled first."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    """An epoll loop over paho sockets, with reconnect timers and delayed calls (monotonic seconds)."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self._reconnects: dict[SwarmLink, float] = {}  # link -> when to try again
        self._later: list[tuple[float, int, Timer]] = []  # heap of (when, order, call)
        self._order = itertools.count()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        """Call ``fn()`` on the loop's thread after ``delay_s`` seconds (an ``Announcer``'s
        scheduler: a device's delayed hello costs no thread)."""
        timer = Timer(fn)
        heapq.heappush(self._later, (time.monotonic() + delay_s, next(self._order), timer))
        return timer

    def watch(self, sock, link: SwarmLink) -> None:
        try:
            self.selector.register(sock, selectors.EVENT_READ, link)
        except (KeyError, ValueError):  # already watched, or closed meanwhile
            pass

    def unwatch(self, sock) -> None:
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def want_write(self, sock, link: SwarmLink, on: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
        try:
            self.selector.modify(sock, events, link)
        except (KeyError, ValueError):
            pass

    def reconnect_later(self, link: SwarmLink, delay_s: float) -> None:
        self._reconnects[link] = time.monotonic() + delay_s

    def run_once(self, timeout_s: float) -> None:
        """Serve the sockets that are ready (waiting at most ``timeout_s``), then due reconnects."""
        for key, mask in self.selector.select(timeout_s):
            link: SwarmLink = key.data
            if mask & selectors.EVENT_READ:
                link.read()
            if mask & selectors.EVENT_WRITE:
                link.client.loop_write()
        now = time.monotonic()
        due = [link for link, at in self._reconnects.items() if at <= now][:RECONNECTS_PER_PASS]
        for link in due:
            del self._reconnects[link]
            link.start()
        while self._later and self._later[0][0] <= now:
            timer = heapq.heappop(self._later)[2]
            if not timer.cancelled:
                try:
                    timer.fn()
                except Exception:  # one device's bug must not stop the others
                    log.exception("a delayed call failed")


def loopback_source(broker_host: str, client_id: str) -> str:
    """The address a device's socket binds before it connects: for an IPv4 loopback broker,
    an address of 127.1.0.0-127.254.255.255 picked by ``client_id``'s hash (each has its own
    local ports, so one host can hold more connections than its ephemeral port range); "" (the
    wildcard, paho's default) for any other broker."""
    try:
        address = ipaddress.ip_address(broker_host)
    except ValueError:
        return ""
    if address.version != 4 or not address.is_loopback:
        return ""
    digest = hashlib.sha256(client_id.encode()).digest()
    return f"127.{1 + digest[0] % 254}.{digest[1]}.{digest[2]}"


class SwarmLink(MqttLink):
    """A device's ``MqttLink`` without paho's thread: ``start()`` connects without waiting;
    the ``EventLoop`` moves the bytes; ``on_connected(first)`` follows each CONNACK."""

    def __init__(self, loop: EventLoop, on_connected: Callable[[bool], None],
                 on_disconnected: Callable[[], None], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loop = loop
        self.client = self._client
        self._notify_connected = on_connected
        self._notify_disconnected = on_disconnected
        self._ever_connected = False
        self._backoff_s = 1.0
        self.dead = False
        if not self.broker.tls:
            self.client.connect_timeout = CONNECT_TIMEOUT_S
        self.client.on_socket_open = lambda _client, _userdata, sock: loop.watch(sock, self)
        self.client.on_socket_close = lambda _client, _userdata, sock: loop.unwatch(sock)
        self.client.on_socket_register_write = lambda _c, _u, sock: loop.want_write(sock, self, True)
        self.client.on_socket_unregister_write = lambda _c, _u, sock: loop.want_write(sock, self, False)

    def start(self) -> None:
        """Open the TCP (and TLS) connection and queue CONNECT; on failure, retry later."""
        if self.dead or self._closing:
            return
        try:
            self.client.connect_async(self.broker.host, self.broker.port, keepalive=self._keepalive_s,
                                      bind_address=loopback_source(self.broker.host, self.client_id))
            self.client.reconnect()
        except (OSError, ssl.SSLError) as exc:
            log.debug("%s: cannot reach the broker (%s)", self.client_id, exc)
            self._retry()

    def read(self) -> None:
        """Read what arrived (TLS may hold decrypted bytes epoll cannot see: drain them)."""
        self.client.loop_read()
        sock = self.client.socket()
        while isinstance(sock, ssl.SSLSocket) and sock.pending():
            self.client.loop_read()
            sock = self.client.socket()

    def misc(self) -> None:
        """Keepalive pings (call about once a second)."""
        if not self.dead and self.client.socket() is not None:
            self.client.loop_misc()

    def vanish(self) -> None:
        """Die without a DISCONNECT (the broker then publishes the last will); never come back."""
        self.dead = True
        sock = self.client.socket()
        if sock is not None:
            self.loop.unwatch(sock)
            try:
                sock.close()
            except OSError:
                pass

    def begin_close(self) -> None:
        """Publish ``offline`` (retained) and queue DISCONNECT; the loop flushes them."""
        self._closing = True
        if self.dead or not self.connected:
            return
        if self._status_topic:
            self.client.publish(self._status_topic, b"offline", qos=1, retain=True)
        self.client.disconnect()

    def _retry(self) -> None:
        self.loop.reconnect_later(self, self._backoff_s * random.uniform(0.8, 1.2))
        self._backoff_s = min(30.0, self._backoff_s * 2)

    # -- paho callbacks ----------------------------------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        super()._on_connect(client, userdata, flags, reason_code, properties)
        if reason_code.is_failure:
            self._retry()
            return
        self._backoff_s = 1.0
        first, self._ever_connected = not self._ever_connected, True
        self._notify_connected(first)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self._connected.clear()
        self._notify_disconnected()
        if not self._closing and not self.dead:
            log.info("%s lost the broker (%s); reconnecting", self.client_id, reason_code)
            self._retry()
