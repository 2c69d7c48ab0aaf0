"""Measuring instruments of ``bench/sites.py``: bytes through a mosquitto bridge, the edges'
accounting of a group round, a progress line."""

from __future__ import annotations

import re
import sqlite3
import subprocess
from pathlib import Path

import psutil


def bridge_bytes(site_pid: int, central_port: int) -> tuple[int, int] | None:
    """(bytes up, bytes down) of the site broker ``site_pid``'s bridge connection to the central
    broker on ``central_port``, as the kernel counts them for that TCP socket (``ss -ti``:
    ``bytes_sent``, ``bytes_received``); None when the bridge is not connected."""
    try:
        conns = psutil.Process(site_pid).net_connections(kind="tcp")
    except psutil.Error:
        return None
    ports = [c.laddr.port for c in conns
             if c.raddr and c.raddr.port == central_port and c.status == "ESTABLISHED"]
    if not ports:
        return None
    out = subprocess.run(["ss", "-tinH", "state", "established",
                          f"( sport = :{ports[0]} and dport = :{central_port} )"],
                         capture_output=True, text=True, check=False).stdout
    sent, received = re.search(r"bytes_sent:(\d+)", out), re.search(r"bytes_received:(\d+)", out)
    return int(sent.group(1)) if sent else 0, int(received.group(1)) if received else 0


def group_round(edge_dir: Path, server_round: int) -> dict:
    """An edge's group round for the server's round ``server_round`` (its log line ``group round
    R (train, server round S): A/B updates``): ``selected`` B, ``accepted`` A and, of the rest,
    the devices refused or rejected, by code (its registry's ``rejections`` of round R) and
    ``silent`` (asked, no answer by the deadline)."""
    found = re.findall(rf"group round (\d+) \(train, server round {server_round}\): (\d+)/(\d+) updates",
                       (edge_dir / "edge.log").read_text(errors="replace"))
    if not found:
        return {}
    rnd, accepted, selected = (int(x) for x in found[-1])
    codes: dict[str, int] = {}
    try:
        with sqlite3.connect(f"file:{edge_dir / 'registry.sqlite'}?mode=ro", uri=True, timeout=5) as db:
            for code, count in db.execute("SELECT code, count(DISTINCT device_id) FROM rejections "
                                          "WHERE round = ? GROUP BY code", (rnd,)):
                codes[code] = count
    except sqlite3.Error:
        pass
    silent = selected - accepted - sum(codes.values())
    return {"selected": selected, "accepted": accepted, "codes": codes, "silent": max(0, silent)}


def account(rounds: list[dict]) -> dict:
    """The sum of several edges' ``group_round`` figures."""
    total: dict = {"selected": 0, "accepted": 0, "codes": {}, "silent": 0}
    for r in rounds:
        total["selected"] += r.get("selected", 0)
        total["accepted"] += r.get("accepted", 0)
        total["silent"] += r.get("silent", 0)
        for code, n in r.get("codes", {}).items():
            total["codes"][code] = total["codes"].get(code, 0) + n
    return total


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


class EdgeProfile:
    """py-spy sampling the edges' threads while they run (``--profile-edge DIR``): one
    ``edge-k.txt`` of collapsed stacks per edge (``py-spy record --format raw --gil``: samples
    of the thread holding the GIL, i.e. the edge's Python work; time in sqlite, fsync or numpy
    kernels that release the GIL is not in it). py-spy is looked for beside the Python
    that runs the bench, then on PATH (``pip install py-spy``: a profiler, not a dependency)."""

    def __init__(self, out_dir: Path) -> None:
        import shutil
        import sys

        beside = Path(sys.executable).parent / "py-spy"
        self.exe = str(beside) if beside.exists() else shutil.which("py-spy")
        if self.exe is None:
            raise RuntimeError("--profile-edge needs py-spy (pip install py-spy)")
        self.out_dir = out_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, pids: list[int]) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for k, pid in enumerate(pids, 1):
            self.procs.append(subprocess.Popen(
                [self.exe, "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--threads",
                 "--gil", "--nonblocking", "-o", str(self.out_dir / f"edge-{k}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        import signal

        for proc in self.procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs = []
