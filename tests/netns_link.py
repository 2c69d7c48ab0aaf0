"""A network of a test's own: a network namespace joined to the root namespace by a veth pair
whose two addresses (a /30 of 10.231.<tag>.0) are the only ones it uses; shaping with what this
kernel has (tbf for bandwidth, iptables' statistic match for loss, per 1500-byte packet; no
netem, so latency is tests/delay_relay.py's) and outages with ``ip link set … down``. Used by
tests/integration/test_network_conditions.py and bench/netns.py. Needs root and iproute2
(``available`` says why not), iptables for loss."""

from __future__ import annotations

import os
import shutil
import subprocess


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def available(tools: tuple[str, ...] = ("ip", "tc")) -> str | None:
    """None when namespaces can be made here with ``tools``, else why not."""
    if os.geteuid() != 0:
        return "needs root to make a network namespace"
    missing = [tool for tool in tools if shutil.which(tool) is None]
    return f"needs {', '.join(missing)}" if missing else None


class NetnsLink:
    """Namespace ``ns`` with interface ``dev_if`` (address ``dev_ip``), its peer ``host_if``
    (``host_ip``) in the root namespace. A context manager: made on enter, removed on exit."""

    def __init__(self, tag: int) -> None:
        self.ns, self.host_if, self.dev_if = f"fedsdk-t{tag}", f"fsh{tag}", f"fsd{tag}"
        self.host_ip, self.dev_ip = f"10.231.{tag}.1", f"10.231.{tag}.2"

    def __enter__(self) -> NetnsLink:
        ip("netns", "add", self.ns)
        try:
            ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.dev_if)
            ip("link", "set", self.dev_if, "netns", self.ns)
            ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            ip("link", "set", self.host_if, "up")
            self.run("ip", "addr", "add", f"{self.dev_ip}/30", "dev", self.dev_if)
            self.run("ip", "link", "set", self.dev_if, "up")
            self.run("ip", "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)

    def run(self, *cmd: str) -> None:
        """Run ``cmd`` inside the namespace (raises on failure)."""
        subprocess.run(["ip", "netns", "exec", self.ns, *cmd], check=True, capture_output=True, timeout=10)

    def uplink(self, rate: str) -> None:
        """Shape the device's sending to ``rate`` (e.g. "512kbit") with tbf."""
        self.run("tc", "qdisc", "add", "dev", self.dev_if, "root", "tbf", "rate", rate, "burst", "16kb",
                 "latency", "400ms")

    def loss(self, fraction: float) -> None:
        """Drop ``fraction`` of the packets in each direction at random (iptables statistic).
        Segmentation offload is capped at one 1500-byte packet on both ends first: a veth
        otherwise carries TCP in segments of up to 64 KiB, and dropping one of those is not
        what a lossy link does (measured: 20 % of 420 kB sent as 1,400-byte writes dropped 25
        packets with offload, 126 without)."""
        ip("link", "set", self.host_if, "gso_max_size", "1500", "gso_max_segs", "1")
        self.run("ip", "link", "set", self.dev_if, "gso_max_size", "1500", "gso_max_segs", "1")
        for chain in ("INPUT", "OUTPUT"):
            self.run("iptables", "-A", chain, "-m", "statistic", "--mode", "random", "--probability",
                     str(fraction), "-j", "DROP")

    def dropped(self) -> int:
        """Packets the ``loss`` rules dropped so far (both directions; 0 without them)."""
        out = subprocess.run(["ip", "netns", "exec", self.ns, "iptables", "-L", "-v", "-x", "-n"],
                             check=True, capture_output=True, text=True, timeout=10).stdout
        rules = [line for line in out.splitlines() if "DROP" in line and "statistic" in line]
        return sum(int(line.split()[0]) for line in rules)

    def link(self, up: bool) -> None:
        ip("link", "set", self.host_if, "up" if up else "down")
