"""Rounds over real network conditions (issue 28): one device process in a network namespace of
its own (tests/netns_link.py: a veth pair with addresses only on it), the broker and the server
in the root namespace; per condition one round of the digits small_cnn, the server pulling in
4 KiB chunks. Conditions: a clean link; 5 % and 20 % packet loss each way (iptables statistic);
a 1 Mbit/s uplink (tbf); 300 ms round trip (150 ms each way through tests/delay_relay.py: netem
is not in this kernel); the link down 20 s and 60 s mid-upload (512 kbit/s uplink); the link
flapping (down 10 s, up 10 s) until the round ends, from its start (``flap10``: the task's
delivery is hit) or from mid-upload (``flap10pull``, 512 kbit/s uplink: the server's pull is
hit); and that last with 5 % loss (``loss5flap10pull``, the CI test's condition).
Prints one row per condition: round seconds, chunk bytes pulled vs the update's size,
rejections (retries), accepted updates, packets the loss rules dropped, the device's MQTT
reconnects; a condition whose round raised prints why.

Needs root, iproute2 and iptables (``make iptables``). Run from the repository root::

    nice -n 10 .venv/bin/python bench/netns.py [--only loss5 ...]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.netns_round import far_round, flapping, outage_mid_pull  # noqa: E402
from tests.netns_link import NetnsLink, available  # noqa: E402

RTT_300MS = 0.150  # one-way delay of the relay, seconds

# name -> (set the link up and return a disturbance or None, one-way relay delay in seconds)
CONDITIONS = {
    "clean": (lambda net, tmp: None, 0.0),
    "loss5": (lambda net, tmp: net.loss(0.05), 0.0),
    "loss20": (lambda net, tmp: net.loss(0.20), 0.0),
    "1mbit": (lambda net, tmp: net.uplink("1mbit"), 0.0),
    "rtt300": (lambda net, tmp: None, RTT_300MS),
    "down20": (lambda net, tmp: (net.uplink("512kbit"), outage_mid_pull(net, tmp, 20.0))[1], 0.0),
    "down60": (lambda net, tmp: (net.uplink("512kbit"), outage_mid_pull(net, tmp, 60.0))[1], 0.0),
    "flap10": (lambda net, tmp: flapping(net, 10.0, 10.0), 0.0),
    "flap10pull": (lambda net, tmp: (net.uplink("512kbit"), flapping(net, 10.0, 10.0, mid_pull=tmp))[1], 0.0),
    "loss5flap10pull": (lambda net, tmp: (net.loss(0.05), net.uplink("512kbit"),
                                          flapping(net, 10.0, 10.0, mid_pull=tmp))[2], 0.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CONDITIONS),
                        help="conditions to run (default: all)")
    parser.add_argument("--logs", type=Path, help="keep each condition's device log here as NAME.log")
    args = parser.parse_args()
    if why := available():
        sys.exit(f"bench/netns.py: {why}")
    print("| condition | round s | bytes pulled / update bytes | rejections (retries) | accepted "
          "| packets dropped | device reconnects |")
    print("|---|---|---|---|---|---|---|")
    for tag, name in enumerate(args.only or CONDITIONS, start=210):
        if name.startswith("loss") and (why := available(("iptables",))):
            print(f"| {name} | not run: {why} | | | | | |", flush=True)
            continue
        setup, delay_s = CONDITIONS[name]
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp, NetnsLink(tag) as net:
            try:
                got = far_round(net, Path(tmp), setup(net, Path(tmp)), latency_s=delay_s)
                got["dropped"] = net.dropped() if name.startswith("loss") else 0
                got["reconnects"] = (Path(tmp) / "far.log").read_text().count(" reconnected to ")
            except Exception as exc:  # one condition's failure is a row, the others still run
                print(f"| {name} | failed after {time.monotonic() - started:.0f} s: {type(exc).__name__}: "
                      f"{exc} | | | | | |", flush=True)
                got = None
            finally:
                if args.logs and (Path(tmp) / "far.log").is_file():
                    args.logs.mkdir(parents=True, exist_ok=True)
                    shutil.copy(Path(tmp) / "far.log", args.logs / f"{name}.log")
        if got is None:
            continue
        ratio = got["bytes_pulled"] / got["blob_bytes"] if got["blob_bytes"] else float("nan")
        print(f"| {name} | {got['seconds']:.1f} | {got['bytes_pulled']:,} / {got['blob_bytes']:,} = "
              f"{ratio:.2f} | {got['rejections']} | {got['accepted']}/1 | {got['dropped']} "
              f"| {got['reconnects']} |", flush=True)


if __name__ == "__main__":
    main()
