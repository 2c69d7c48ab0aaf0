"""Rounds over real network conditions (issue 28): one device process in a network namespace of
its own (tests/netns_link.py: a veth pair with addresses only on it), the broker and the server
in the root namespace; per condition one round of the digits small_cnn, the server pulling in
4 KiB chunks. Conditions: a clean link; 5 % and 20 % packet loss each way (iptables statistic);
a 1 Mbit/s uplink (tbf); the link down 20 s mid-upload (512 kbit/s uplink); the link flapping
(down 10 s, up 10 s, three times) mid-upload. Latency needs netem (not in this kernel) or a relay:
not measured. Prints one row per condition: round seconds, chunk bytes pulled vs the update's
size, rejections (retries), accepted updates.

Needs root and iproute2/iptables. Run from the repository root::

    nice -n 10 .venv/bin/python bench/netns.py [--only loss5 ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.netns_round import far_round, outage_mid_pull  # noqa: E402
from tests.netns_link import NetnsLink, available  # noqa: E402

CONDITIONS = {
    "clean": lambda net, tmp: None,
    "loss5": lambda net, tmp: net.loss(0.05),
    "loss20": lambda net, tmp: net.loss(0.20),
    "1mbit": lambda net, tmp: net.uplink("1mbit"),
    "down20": lambda net, tmp: (net.uplink("512kbit"), outage_mid_pull(net, tmp, 20.0))[1],
    "flap10": lambda net, tmp: (net.uplink("512kbit"),
                                outage_mid_pull(net, tmp, 10.0, flaps=3, every_s=10.0))[1],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CONDITIONS),
                        help="conditions to run (default: all)")
    args = parser.parse_args()
    if why := available():
        sys.exit(f"bench/netns.py: {why}")
    print("| condition | round s | bytes pulled / update bytes | rejections (retries) | accepted |")
    print("|---|---|---|---|---|")
    for tag, name in enumerate(args.only or CONDITIONS, start=210):
        if name.startswith("loss") and (why := available(("iptables",))):
            print(f"| {name} | not run: {why} | | | |", flush=True)
            continue
        with tempfile.TemporaryDirectory() as tmp, NetnsLink(tag) as net:
            disturb = CONDITIONS[name](net, Path(tmp))
            got = far_round(net, Path(tmp), disturb)
        ratio = got["bytes_pulled"] / got["blob_bytes"] if got["blob_bytes"] else float("nan")
        print(f"| {name} | {got['seconds']:.1f} | {got['bytes_pulled']:,} / {got['blob_bytes']:,} = "
              f"{ratio:.2f} | {got['rejections']} | {got['accepted']}/1 |", flush=True)


if __name__ == "__main__":
    main()
