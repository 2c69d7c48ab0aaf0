"""Rounds over real network conditions (issue 28): one device process in a network namespace of
its own (tests/netns_link.py: a veth pair with addresses only on it), the broker and the server
in the root namespace; per condition one round of the digits small_cnn, the server pulling in
4 KiB chunks. Conditions: a clean link; 5 % and 20 % packet loss each way (iptables statistic);
a 1 Mbit/s uplink (tbf); 300 ms round trip (150 ms each way through tests/delay_relay.py: netem
is not in this kernel); the link down 20 s and 60 s mid-upload (512 kbit/s uplink; ``down60two``:
with a second device on loopback in the round, which may close without the far one), or 60 s from
the round's start (``down60task``: the task waits in the broker); the link flapping (down 10 s,
up 10 s) until the round ends, from its start (``flap10``: the task's delivery is hit) or from
mid-upload (``flap10pull``, 512 kbit/s uplink: the server's pull is hit); that last with 5 %
loss (``loss5flap10pull``, the CI test's condition); and the worst: 20 % loss, a 32 kbit/s
uplink (the upload spans flaps) and flapping from the round's start (``loss20flap10slow``).
Prints one row per condition: round seconds (and the far device's training seconds within
them: on a busy machine training dominates), chunk bytes pulled vs the update's size,
rejections (retries), accepted updates, packets the loss rules dropped, the device's MQTT
reconnects; a condition whose round raised prints why.

Needs root, iproute2 and iptables (``make iptables``). Run from the repository root::

    nice -n 10 .venv/bin/python bench/netns.py [--only loss5 ...]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.netns_round import far_round, flapping, outage_at_start, outage_mid_pull  # noqa: E402
from tests.netns_link import NetnsLink, available  # noqa: E402

TRAINED = re.compile(r"trained \d+ samples in ([\d.]+) s")  # the far device's log line per task


class Condition(NamedTuple):
    """A link: ``loss`` (fraction of packets dropped each way), ``uplink`` (tbf rate), a
    disturbance made from (net, tmp) (outages, flapping), ``delay_s`` (one way, the relay)."""

    loss: float = 0.0
    uplink: str | None = None
    disturb: Callable[[NetnsLink, Path], Callable[[dict], None]] | None = None
    delay_s: float = 0.0
    near: bool = False  # a second device on loopback in the same round


CONDITIONS = {
    "clean": Condition(),
    "loss5": Condition(loss=0.05),
    "loss20": Condition(loss=0.20),
    "1mbit": Condition(uplink="1mbit"),
    "rtt300": Condition(delay_s=0.150),  # 300 ms round trip
    "down20": Condition(uplink="512kbit", disturb=lambda net, tmp: outage_mid_pull(net, tmp, 20.0)),
    "down60": Condition(uplink="512kbit", disturb=lambda net, tmp: outage_mid_pull(net, tmp, 60.0)),
    "down60two": Condition(uplink="512kbit", disturb=lambda net, tmp: outage_mid_pull(net, tmp, 60.0),
                           near=True),
    "down60task": Condition(disturb=lambda net, tmp: outage_at_start(net, 60.0)),
    "flap10": Condition(disturb=lambda net, tmp: flapping(net, 10.0, 10.0)),
    "flap10pull": Condition(uplink="512kbit", disturb=lambda net, tmp: flapping(net, 10.0, 10.0, tmp)),
    "loss5flap10pull": Condition(loss=0.05, uplink="512kbit",
                                 disturb=lambda net, tmp: flapping(net, 10.0, 10.0, tmp)),
    "loss20flap10slow": Condition(loss=0.20, uplink="32kbit",
                                  disturb=lambda net, tmp: flapping(net, 10.0, 10.0)),
}


def run_condition(net: NetnsLink, tmp: Path, cond: Condition) -> dict:
    """One round over ``net`` shaped as ``cond``; far_round's figures plus ``dropped``."""
    if cond.loss:
        net.loss(cond.loss)
    if cond.uplink:
        net.uplink(cond.uplink)
    got = far_round(net, tmp, cond.disturb(net, tmp) if cond.disturb else None, latency_s=cond.delay_s,
                     near=cond.near)
    got["dropped"] = net.dropped() if cond.loss else 0
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CONDITIONS),
                        help="conditions to run (default: all)")
    parser.add_argument("--logs", type=Path, help="keep each condition's device log here as NAME.log")
    args = parser.parse_args()
    if why := available():
        sys.exit(f"bench/netns.py: {why}")
    print("| condition | round s | of which training s | bytes pulled / update bytes | rejections (retries) "
          "| accepted | packets dropped | device reconnects |")
    print("|---|---|---|---|---|---|---|---|")
    for tag, name in enumerate(args.only or CONDITIONS, start=210):
        cond = CONDITIONS[name]
        if cond.loss and (why := available(("iptables",))):
            print(f"| {name} | not run: {why} | | | | | | |", flush=True)
            continue
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp, NetnsLink(tag) as net:
            try:
                got = run_condition(net, Path(tmp), cond)
                log = (Path(tmp) / "far.log").read_text()
                got["reconnects"] = log.count(" reconnected to ")
                got["training"] = sum(float(s) for s in TRAINED.findall(log))
            except Exception as exc:  # one condition's failure is a row, the others still run
                print(f"| {name} | failed after {time.monotonic() - started:.0f} s: {type(exc).__name__}: "
                      f"{exc} | | | | | | |", flush=True)
                got = None
            finally:
                if args.logs and (Path(tmp) / "far.log").is_file():
                    args.logs.mkdir(parents=True, exist_ok=True)
                    shutil.copy(Path(tmp) / "far.log", args.logs / f"{name}.log")
        if got is None:
            continue
        ratio = got["bytes_pulled"] / got["blob_bytes"] if got["blob_bytes"] else float("nan")
        print(f"| {name} | {got['seconds']:.1f} | {got['training']:.1f} | {got['bytes_pulled']:,} / "
              f"{got['blob_bytes']:,} = "
              f"{ratio:.2f} | {got['rejections']} | {got['accepted']}/{1 + cond.near} | {got['dropped']} "
              f"| {got['reconnects']} |", flush=True)


if __name__ == "__main__":
    main()
