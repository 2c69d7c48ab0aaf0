"""Broker security: how long a grant or a revocation takes to be live, as the fleet grows.

Against ONE secured mosquitto started by this script on a loopback port (accounts + ACL of
``server_toolkit.broker.mosquitto_auth``; ``--tls`` for an mqtts-only listener):

* **grant** - ``grant_device`` wall time: rewrite password + ACL files, SIGHUP, then log in
  with the reload marker until the broker accepts it (the call returns once the account
  works). Timed for the first ``--sample`` grants (few accounts) and for the last
  ``--sample`` ones after ``--devices`` accounts exist.
* **revoke-to-cut** - from ``revoke_device`` being called to the revoked device's live
  session being closed by the broker (its paho client's disconnect callback).

Medians in milliseconds; the headline is the ratio of grant time with ``--devices``
accounts to grant time with a handful.

Run from the repository root::

    .venv/bin/python bench/broker_security.py [--devices 1000] [--sample 20] [--tls]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdk_device.transport.mqtt_link import MqttLink  # noqa: E402
from server_toolkit.broker.secured import make_secured_broker  # noqa: E402


def timed_grants(security, ids: list[str]) -> list[float]:
    times = []
    for device_id in ids:
        start = time.perf_counter()
        security.grant_device(device_id, f"pw-{device_id}")
        times.append((time.perf_counter() - start) * 1000)
    return times


def revoke_to_cut_ms(secured, device_id: str) -> float:
    cut = threading.Event()
    link = MqttLink(secured.address, f"fedsdk-dev-{secured.fleet}-{device_id}", lambda t, p: None,
                    username=device_id, password=f"pw-{device_id}", ca_file=secured.ca_file).connect()
    original = link._client.on_disconnect

    def on_disconnect(*args) -> None:
        cut.set()
        original(*args)

    link._client.on_disconnect = on_disconnect
    start = time.perf_counter()
    secured.security.revoke_device(device_id)
    if not cut.wait(15):
        raise RuntimeError(f"{device_id}'s session was not cut within 15 s")
    elapsed = (time.perf_counter() - start) * 1000
    link.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000, help="accounts on the broker at the end")
    parser.add_argument("--sample", type=int, default=20, help="grants / revocations timed at each end")
    parser.add_argument("--tls", action="store_true", help="mqtts-only listener (the probe logs in over TLS)")
    args = parser.parse_args()
    logging.getLogger("sdk_device.transport.mqtt_link").setLevel(logging.ERROR)  # the cuts are expected

    with tempfile.TemporaryDirectory() as tmp, make_secured_broker(tmp, "bench", tls=args.tls) as secured:
        ids = [f"dev-{i:05d}" for i in range(args.devices)]
        few = timed_grants(secured.security, ids[: args.sample])
        timed_grants(secured.security, ids[args.sample: args.devices - args.sample])  # fill, untimed
        many = timed_grants(secured.security, ids[args.devices - args.sample:])
        cuts = [revoke_to_cut_ms(secured, d) for d in ids[-args.sample:]]
        assert len(secured.security.devices()) == args.devices - args.sample

    few_ms, many_ms = statistics.median(few), statistics.median(many)
    print(f"secured mosquitto ({'mqtts' if args.tls else 'mqtt'} on loopback), median of {args.sample}:")
    print(f"  grant with {args.sample:>5} accounts: {few_ms:7.1f} ms")
    print(f"  grant with {args.devices:>5} accounts: {many_ms:7.1f} ms")
    print(f"  revoke -> live session cut (~{args.devices} accounts): {statistics.median(cuts):7.1f} ms")
    print(f"ratio grant({args.devices}) / grant({args.sample}) = {many_ms / few_ms:.2f}")


if __name__ == "__main__":
    main()
