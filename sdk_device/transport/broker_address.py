"""Where the broker is: ``mqtt://[user:password@]host[:port][,host2[:port2]…][?retain=0]``.

Several hosts (docs/protocol.md §4) name the nodes of one broker cluster, tried in order: the
client connects to the first that answers and, when it loses that node, reconnects to the next
(``MqttLink``), so a killed node costs its devices one reconnect. They share the scheme, the
credentials and ``?retain``. ``?retain=0`` says the broker keeps no retained messages: the
client then never sets the retain flag (mosquitto's ``retain_available false`` disconnects a
client that does; the status request of §3.2 replaces what retained copies told).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlparse


@dataclass(frozen=True)
class BrokerAddress:
    """A parsed broker URL; ``others``: the further (host, port) nodes, in order."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None
    retain: bool = True  # False: "?retain=0", for brokers without retained messages (§4)
    others: tuple[tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        head, _, query = url.partition("?")
        if query not in ("", "retain=0", "retain=1"):
            raise ValueError(f"broker URL: the only query allowed is ?retain=0 or ?retain=1, got {url!r}")
        scheme, sep, rest = head.partition("://")
        user, at, hosts = rest.rpartition("@")
        nodes = [_parse_one(f"{scheme}{sep}{user}{at}{host}", url) for host in hosts.split(",")]
        first = nodes[0]
        return cls(first.host, first.port, first.tls, first.username, first.password, query != "retain=0",
                   tuple((n.host, n.port) for n in nodes[1:]))

    @property
    def nodes(self) -> list[tuple[str, int]]:
        """Every (host, port) to try, in order."""
        return [(self.host, self.port), *self.others]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{h}:{p}" for h, p in self.nodes)
        return f"{'mqtts' if self.tls else 'mqtt'}://{hosts}{'' if self.retain else '?retain=0'}"


def _parse_one(url: str, whole: str) -> BrokerAddress:
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if parsed.scheme not in ("mqtt", "mqtts") or not parsed.hostname or port == -1:
        raise ValueError(f"broker URL must look like mqtt://host:port or mqtts://host:port, got {whole!r}")
    tls = parsed.scheme == "mqtts"
    return BrokerAddress(parsed.hostname, port or (8883 if tls else 1883), tls,
                         unquote(parsed.username) if parsed.username else None,
                         unquote(parsed.password) if parsed.password else None)
