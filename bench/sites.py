"""A fleet past one broker: N devices on S mosquitto site brokers bridged to a central one,
one generic FedAvg edge per site, the server on the central broker.

Topology (all on this machine, real processes over loopback TCP):

* **central** mosquitto: the server (``fedsdk-server -v run --min-devices S
  --clients-per-round S``; its registry holds the S edges) and the sites' bridges;
* **site k** (k = 1..S): a mosquitto bridged to central for the server's fleet only
  (``fedsdk-server bridge-config``: ``fedsdk/v1/<fleet>/#`` both ways, QoS 1), its edge
  ``fedsdk-server edge --method fedavg --broker SITE --min-devices N/S --clients-per-round K/S``
  (its N/S devices registered in its own run directory) and a swarm of N/S protocol-level
  devices on the group fleet ``<fleet>.edge-k`` (processes of at most ``--per-process``
  devices: a process may hold 20,000 descriptors here). Group traffic stays at the site;
  only the edge's task, blobs and partial sum cross the bridge.

Phases, timed from the bench's start of each: **register** (every ``devices add``),
**connected** (every device has its CONNACK), **joined** (the server recorded the hello of
all S edges, each sent once its whole group was online), **round K** (the server's
``seconds`` of round 2, K devices asked across the edges; round 1 carries the program
export), **restart** (SIGKILL of the server once round 3's tasks reached devices, then
``--resume``: **edges back** = the restarted server logged the hello of every edge, **resume**
= the first task a device receives after the restart, **round after** = the server's seconds
of round 4). Measured: peak RSS and CPU seconds of the server, edges, brokers and swarm, the
bytes through each bridge (the kernel's count for its TCP socket), the brokers' dropped
publishes (``$SYS``), and for round 2 every asked device: answered, refused or rejected (by
code), or silent; and the edges' CPU seconds from the end of round 1 to the end of round 2, per
update accepted in round 2 (the cost of an edge per update: pull, check, fold, and sending the
task). ``--no-restart`` stops after round 2; ``--profile-edge DIR`` samples the edges with py-spy
during round 2 (``sites_probes.EdgeProfile``). A progress line every ``--every`` seconds. Run
from the repository root::

    nice .venv/bin/python bench/sites.py --devices 100000 --sites 8 --selected 10000
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scale import FLEET, Server, Timeout, wait_for  # noqa: E402
from scale_probes import BrokerWatch, ProcessSampler, hellos_logged, hellos_recorded, round_rows, rss_mb  # noqa: E402
from sites_probes import EdgeProfile, account, bridge_bytes, group_round, mib  # noqa: E402

from server_toolkit.broker.bridge import bridge_config  # noqa: E402
from server_toolkit.broker.mosquitto import MosquittoBroker  # noqa: E402
from server_toolkit.swarm import Swarm, SwarmConfig  # noqa: E402
from server_toolkit.swarm.shard import raise_fd_limit  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "server_toolkit.cli", *args], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, env=ENV)


class Sites:
    """The central broker, S site brokers with their edges and swarms, and their samplers."""

    def __init__(self, workdir: Path, args) -> None:
        self.args, self.workdir = args, workdir
        self.group = args.devices // args.sites
        self.central = MosquittoBroker(workdir=workdir / "central", extra_config="sys_interval 1").start()
        self.brokers = [self.central]
        self.edges: list[subprocess.Popen] = []
        self.swarms: list[Swarm] = []
        for k in range(1, args.sites + 1):
            conf = "sys_interval 1\n" + bridge_config(f"site-{k}", self.central.url, [FLEET])
            self.brokers.append(MosquittoBroker(workdir=workdir / f"site-{k}", extra_config=conf,
                                                max_queued_messages=max(10_000, 3 * self.group)).start())
        self.watches = [BrokerWatch(b.host, b.port, FLEET) for b in self.brokers]
        self.broker_samplers = [ProcessSampler(b.proc.pid) for b in self.brokers]
        self.edge_samplers: list[ProcessSampler] = []

    def edge_dir(self, k: int) -> Path:
        return self.workdir / "edges" / f"edge-{k}"

    def start_edges_and_swarms(self) -> None:
        a, per_edge = self.args, self.args.selected // self.args.sites
        for k in range(1, a.sites + 1):
            site = self.brokers[k]
            cmd = [sys.executable, "-m", "server_toolkit.cli", "-v", "edge", "--broker", site.url,
                   "--fleet", FLEET, "--edge-id", f"edge-{k}", "--run-dir", str(self.edge_dir(k)),
                   "--method", "fedavg",
                   "--min-devices", str(self.group), "--devices-wait", str(a.timeout),
                   "--clients-per-round", str(per_edge)]
            with open(self.edge_dir(k) / "edge.log", "w") as out:
                self.edges.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV,
                                                   cwd=ROOT))
            self.edge_samplers.append(ProcessSampler(self.edges[-1].pid))
        for k in range(1, a.sites + 1):
            self.swarms.append(Swarm(SwarmConfig(
                self.brokers[k].url, f"{FLEET}.edge-{k}", devices=self.group,
                processes=math.ceil(self.group / a.per_process), first=(k - 1) * self.group,
                connect_rate=a.connect_rate / a.sites, heartbeat_s=a.heartbeat)).start())

    def edges_cpu(self) -> float:
        """The edges' CPU seconds (user + system) so far, summed."""
        for sampler in self.edge_samplers:
            sampler.sample()
        return sum(s.cpu_s for s in self.edge_samplers)

    def swarm_total(self, name: str) -> int:
        return sum(getattr(s.counters(), name) for s in self.swarms)

    def bridges(self) -> list[tuple[int, int] | None]:
        return [bridge_bytes(b.proc.pid, self.central.port) for b in self.brokers[1:]]

    def dropped(self) -> int:
        return sum(w.dropped for w in self.watches)

    def stop(self) -> None:
        for proc in self.edges:
            proc.terminate()
        for proc in self.edges:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for sampler in self.edge_samplers:
            sampler.stop()
        for swarm in self.swarms:
            swarm.stop()
        time.sleep(1.5)  # one more $SYS interval
        for watch in self.watches:
            watch.close()
        for sampler, broker in zip(self.broker_samplers, self.brokers, strict=True):
            sampler.stop()
            broker.stop()


def progress(sites: Sites, servers: list[Server], started: float, stop: threading.Event,
             every_s: float) -> None:
    """One line every ``every_s`` seconds: what the fleet has done so far."""
    run_dir = sites.workdir / "server"
    while not stop.wait(every_s):
        rows = round_rows(run_dir)
        print(f"[{time.monotonic() - started:6.0f} s] connected {sites.swarm_total('connected')}/"
              f"{sites.args.devices}, tasks {sites.swarm_total('tasks')}, "
              f"answered {sites.swarm_total('results')}, "
              f"accepted {sites.swarm_total('accepted')}; server rounds {sorted(rows)}, RSS "
              f"{mib(servers[-1].sampler.peak_rss_mb if servers else None)} MiB; edges RSS max "
              f"{mib(max((s.peak_rss_mb for s in sites.edge_samplers), default=None))} MiB; dropped "
              f"{sites.dropped()}; load {os.getloadavg()[0]:.1f}", flush=True)


def run(workdir: Path, args) -> dict:
    """Every phase once; the figures as a dict (a phase that timed out: ``timeout``)."""
    fig: dict = {"N": args.devices, "sites": args.sites, "load at start": os.getloadavg()[0]}
    run_dir, group = workdir / "server", args.devices // args.sites
    started = time.monotonic()
    cli("devices", "add", "--run-dir", str(run_dir), *[f"edge-{k}" for k in range(1, args.sites + 1)])
    for k in range(1, args.sites + 1):
        cli("devices", "add", "--run-dir", str(workdir / "edges" / f"edge-{k}"), "--count", str(group),
            "--prefix", "swarm-", "--start", str((k - 1) * group))
    fig["register s"] = time.monotonic() - started
    sites, servers, stop = Sites(workdir, args), [], threading.Event()
    profile = EdgeProfile(args.profile_edge) if args.profile_edge is not None else None
    threading.Thread(target=progress, args=(sites, servers, started, stop, args.every), daemon=True).start()

    def server(rounds: int, resume: bool) -> Server:
        servers.append(Server(run_dir, sites.central.url, args.sites, rounds, args.sites, resume,
                              args.round_timeout, args.timeout, len(servers)))
        return servers[-1]

    try:
        first = server(rounds=3, resume=False)
        sites.start_edges_and_swarms()
        since, t0 = time.time(), time.monotonic()
        wait_for(lambda: sites.swarm_total("connected") == args.devices, args.timeout, "connected")
        fig["connected s"] = time.monotonic() - t0
        fig["swarm RSS MiB"] = rss_mb([p for s in sites.swarms for p in s.pids])
        wait_for(lambda: hellos_recorded(run_dir / "registry.sqlite", since) >= args.sites, args.timeout,
                 "joined")
        fig["joined s"] = time.monotonic() - t0
        print(f"all {args.devices} connected in {fig['connected s']:.0f} s, all {args.sites} edges joined in "
              f"{fig['joined s']:.0f} s", flush=True)
        wait_for(lambda: 1 in round_rows(run_dir), args.timeout, "round 1", poll_s=0.2)
        cpu_before = sites.edges_cpu()
        if profile is not None:
            profile.start([p.pid for p in sites.edges])
        wait_for(lambda: 2 in round_rows(run_dir), args.timeout, "round 2", poll_s=0.2)
        fig["edges CPU s in round K"] = sites.edges_cpu() - cpu_before
        if profile is not None:
            profile.stop()
        rows = round_rows(run_dir)
        fig["round 1 s"], fig["round K s"] = rows[1]["seconds"], rows[2]["seconds"]
        fig["round K"] = account([group_round(sites.edge_dir(k), 2) for k in range(1, args.sites + 1)])
        fig["round K edges accepted"] = rows[2]["accepted"]
        fig["edge CPU ms per accepted update in round K"] = (
            1000 * fig["edges CPU s in round K"] / max(1, fig["round K"]["accepted"]))
        fig["bridges after round K"] = sites.bridges()
        print(f"round 2: {fig['round K s']:.1f} s of server time, {fig['round K']}", flush=True)
        if not args.no_restart:
            tasks = sites.swarm_total("tasks")
            wait_for(lambda: sites.swarm_total("tasks") > tasks, args.timeout, "round 3 tasks")
            first.kill()
            time.sleep(2.5)  # the swarm reports its counters once a second
            tasks, restarted = sites.swarm_total("tasks"), time.monotonic()
            second = server(rounds=4, resume=True)
            wait_for(lambda: hellos_logged(second.log) >= args.sites, args.timeout, "edges back", poll_s=0.5)
            fig["edges back s"] = time.monotonic() - restarted
            wait_for(lambda: sites.swarm_total("tasks") > tasks, args.timeout, "a task after the restart")
            fig["resume s"] = time.monotonic() - restarted
            wait_for(second.finished, args.timeout, "round 4", poll_s=0.5)
            rows = round_rows(run_dir)
            fig["round 3 s"], fig["round after s"] = rows[3]["seconds"], rows[4]["seconds"]
            fig["round after"] = account([group_round(sites.edge_dir(k), 4)
                                          for k in range(1, args.sites + 1)])
    except (Timeout, RuntimeError, KeyboardInterrupt) as exc:  # Ctrl-C or SIGTERM: stop, keep the figures
        fig["timeout"] = str(exc) or "interrupted"
        print(f"stopped: {exc}", file=sys.stderr, flush=True)
    finally:
        fig["connected at the end"] = sites.swarm_total("connected")
        fig["bridges at the end"] = sites.bridges()
        totals = ("connects", "hellos", "tasks", "results", "reoffers", "accepted", "rejected", "refused")
        fig["swarm totals"] = {n: sites.swarm_total(n) for n in totals}
        stop.set()
        if profile is not None:
            profile.stop()
        for s in servers:
            s.stop()
        sites.stop()
    fig["server RSS MiB"] = max((s.sampler.peak_rss_mb for s in servers), default=None)
    fig["server CPU s"] = sum(s.sampler.cpu_s for s in servers)
    fig["edge RSS MiB (max)"] = max((s.peak_rss_mb for s in sites.edge_samplers), default=None)
    fig["edges CPU s (sum)"] = sum(s.cpu_s for s in sites.edge_samplers)
    central = sites.broker_samplers[0]
    fig["central RSS MiB"], fig["central CPU s"] = central.peak_rss_mb, central.cpu_s
    fig["site broker RSS MiB (max)"] = max(s.peak_rss_mb for s in sites.broker_samplers[1:])
    fig["site brokers CPU s (sum)"] = sum(s.cpu_s for s in sites.broker_samplers[1:])
    fig["dropped"] = [w.dropped for w in sites.watches]
    fig["wall s"] = time.monotonic() - started
    fig["load at end"] = os.getloadavg()[0]
    return fig


def print_figures(fig: dict) -> None:
    """The figures as a two-column Markdown table (what BENCHMARKS.md shows)."""
    print("| figure | value |\n|---|---|")
    for key, value in fig.items():
        if isinstance(value, list) and value and isinstance(value[0], tuple | type(None)):
            value = ", ".join("-" if v is None else f"{v[0] / 2**20:.2f}↑ {v[1] / 2**20:.2f}↓" for v in value)
        print(f"| {key} | {f'{value:.1f}' if isinstance(value, float) else value} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=100_000, help="devices (divisible by --sites)")
    parser.add_argument("--sites", type=int, default=8, help="site brokers, one edge each")
    parser.add_argument("--selected", type=int, default=10_000, help="devices asked in round 2, in all")
    parser.add_argument("--per-process", type=int, default=15_000, help="most devices per swarm process")
    parser.add_argument("--connect-rate", type=float, default=500.0, help="devices per second in total")
    parser.add_argument("--heartbeat", type=float, default=10.0, help="seconds between idle heartbeats")
    parser.add_argument("--round-timeout", type=float, default=300.0, help="the server's --round-timeout")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds any one wait may take")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between progress lines")
    parser.add_argument("--no-restart", action="store_true",
                        help="stop after round 2 (no server restart, no rounds 3-4)")
    parser.add_argument("--profile-edge", type=Path, default=None,
                        help="sample the edges with py-spy during round 2; collapsed stacks into this folder")
    parser.add_argument("--keep", type=Path, default=None, help="keep run directories and logs here")
    args = parser.parse_args()
    if args.devices % args.sites or args.selected % args.sites:
        parser.error("--devices and --selected must be divisible by --sites")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"open-file limit {raise_fd_limit()}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="fedsdk-sites-", dir=args.keep))
    fig = run(workdir, args)
    print_figures(fig)
    if args.keep is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
