"""Edge sites: a mosquitto at the site bridged to the central broker.

Devices at a site connect to the site's broker; the site broker opens one MQTT connection
to the central broker (the *bridge*) and forwards the fleet's topics both ways, so the
server on the central broker sees every device as if it were local: hellos, results, blob
requests and chunks, heartbeats, and the devices' wills, which the site broker publishes
when a device dies. Retained messages (the server's status, its epoch) reach the site
when the bridge subscribes. The bridge session is persistent (``cleansession false``): QoS 1
messages queued while the link is down are delivered when it comes back.

``bridge_config`` writes the ``connection`` section to append to the site broker's
mosquitto.conf (``fedsdk-server bridge-config`` prints it; docs/operations.md, "Edge
sites and clustered brokers").
"""

from __future__ import annotations

import re

from sdk_device.protocol.topics import ROOT, check_name
from sdk_device.transport.mqtt_link import BrokerAddress


def bridge_config(site: str, central_url: str, fleets: list[str], username: str | None = None,
                  password: str | None = None, ca_file: str | None = None) -> str:
    """The mosquitto ``connection`` section of site ``site``'s bridge to ``central_url``
    (mqtt[s]://host:port), forwarding every topic of ``fleets`` both ways at QoS 1.
    ``username``/``password``: the bridge's account on the central broker; ``ca_file``: the CA
    to trust for mqtts://. ValueError on a bad name or URL."""
    check_name("site", site)
    if not fleets:
        raise ValueError("a bridge needs at least one fleet")
    central = BrokerAddress.parse(central_url)
    if central.tls and ca_file is None:
        raise ValueError(f"{central_url} is TLS: give the CA to trust (--ca-file)")
    for secret in (username, password):
        if secret is not None and re.search(r"\s", secret):
            raise ValueError("bridge credentials may not contain whitespace (mosquitto.conf)")
    lines = [f"connection fedsdk-{site}", f"address {central.host}:{central.port}",
             *[f"topic {ROOT}/{check_name('fleet', fleet)}/# both 1" for fleet in fleets],
             "cleansession false",  # a persistent session: QoS 1 queued while the link is down
             f"remote_clientid fedsdk-bridge-{site}", f"local_clientid fedsdk-bridge-{site}-local",
             "try_private true",  # the central mosquitto sends the bridge no echo of its own messages
             "notifications false", "bridge_protocol_version mqttv311", "restart_timeout 1 10"]
    if username is not None:
        lines.append(f"remote_username {username}")
    if password is not None:
        lines.append(f"remote_password {password}")
    if ca_file is not None:
        lines.append(f"bridge_cafile {ca_file}")
    return "\n".join(lines) + "\n"
