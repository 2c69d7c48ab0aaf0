"""Edges at fleet scale: N swarm devices talking to the server directly vs behind E generic
edge aggregators; one FedAvg round in each arm, on one mosquitto each.

* **flat**: ``fedsdk-server devices add --count N --prefix swarm-``; ``fedsdk-server -v run
  --model small_cnn --dataset digits --min-devices N --clients-per-round N --rounds 1``; a
  swarm of N devices (``--processes``) on the server's fleet.
* **edges**: the server's registry holds the E edges only (``devices add edge-1 … edge-E``) and
  its run has ``--min-devices E --clients-per-round E --rounds 1``; edge k is ``fedsdk-server
  edge --method fedavg --min-devices N/E`` with its N/E swarm ids registered in its own run
  directory, and a swarm of N/E devices (one process) on its group fleet ``scale.edge-k``.

Every device of the fleet trains in the round in both arms. Measured per arm: the round's
``seconds`` (the server's metrics row), the server's peak RSS and CPU seconds over its
whole life (start-up, the fleet's hellos, the round, evaluation), the edges' summed CPU
seconds and largest RSS, mosquitto's peak RSS, and the arm's wall time (registration to
the server's exit). Run from the repository root::

    .venv/bin/python bench/scale_edges.py [--devices 10000] [--edges 10] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scale import FLEET, Server, Timeout, print_table, wait_for  # noqa: E402
from scale_probes import ProcessSampler, round_rows  # noqa: E402

from server_toolkit.broker.mosquitto import MosquittoBroker  # noqa: E402
from server_toolkit.swarm import Swarm, SwarmConfig  # noqa: E402
from server_toolkit.swarm.shard import raise_fd_limit  # noqa: E402

COLUMNS = ["arm", "N", "edges", "round s", "server RSS MiB", "server CPU s", "edges CPU s", "edge RSS MiB",
           "mosquitto RSS MiB", "wall s", "load"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "server_toolkit.cli", *args], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, env=ENV)


def start_edge(workdir: Path, broker_url: str, k: int, group: int, timeout_s: float) -> subprocess.Popen:
    """Edge k (1-based): a generic FedAvg edge of ``group`` swarm ids."""
    edge_dir = workdir / "edges" / f"edge-{k}"
    cli("devices", "add", "--run-dir", str(edge_dir), "--count", str(group), "--prefix", "swarm-",
        "--start", str((k - 1) * group))
    cmd = [sys.executable, "-m", "server_toolkit.cli", "edge", "--broker", broker_url, "--fleet", FLEET,
           "--edge-id", f"edge-{k}", "--run-dir", str(edge_dir), "--method", "fedavg",
           "--min-devices", str(group), "--devices-wait", str(timeout_s)]
    with open(edge_dir / "edge.log", "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)


def measure(n: int, edges: int, workdir: Path, args) -> dict:
    """One row: the arm with ``edges`` edges (0: flat) for ``n`` devices."""
    row: dict = {"arm": "edges" if edges else "flat", "N": n, "edges": edges}
    run_dir = workdir / "server"
    started = time.monotonic()
    if edges:
        cli("devices", "add", "--run-dir", str(run_dir), *[f"edge-{k + 1}" for k in range(edges)])
    else:
        cli("devices", "add", "--run-dir", str(run_dir), "--count", str(n), "--prefix", "swarm-")
    broker = MosquittoBroker(workdir=workdir / "mosquitto", max_queued_messages=max(10_000, 3 * n)).start()
    broker_sampler = ProcessSampler(broker.proc.pid)
    server = None
    edge_procs: list[subprocess.Popen] = []
    edge_samplers: list[ProcessSampler] = []
    swarms: list[Swarm] = []
    try:
        members = edges or n
        server = Server(run_dir, broker.url, members, 1, members, False, args.round_timeout, args.timeout, 0)
        if edges:
            group = n // edges
            for k in range(1, edges + 1):
                edge_procs.append(start_edge(workdir, broker.url, k, group, args.timeout))
                edge_samplers.append(ProcessSampler(edge_procs[-1].pid))
                swarms.append(Swarm(SwarmConfig(broker.url, f"{FLEET}.edge-{k}", devices=group, processes=1,
                                                 first=(k - 1) * group,
                                                 connect_rate=args.connect_rate / edges)).start())
        else:
            swarms.append(Swarm(SwarmConfig(broker.url, FLEET, devices=n, processes=args.processes,
                                            connect_rate=args.connect_rate)).start())
        wait_for(server.finished, args.timeout, "the round", poll_s=0.5)
        row["round s"] = round_rows(run_dir)[1]["seconds"]
        row["accepted"] = round_rows(run_dir)[1]["accepted"]
    except (Timeout, RuntimeError) as exc:
        row["timeout"] = str(exc)
        print(f"{row['arm']}: {exc}", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()
        for proc in edge_procs:
            proc.terminate()
        for proc in edge_procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for sampler in edge_samplers:
            sampler.stop()
        for swarm in swarms:
            swarm.stop()
        broker_sampler.stop()
        broker.stop()
    if server is not None:
        row["server RSS MiB"], row["server CPU s"] = server.sampler.peak_rss_mb, server.sampler.cpu_s
    if edges:
        row["edges CPU s"] = sum(s.cpu_s for s in edge_samplers)
        row["edge RSS MiB"] = max(s.peak_rss_mb for s in edge_samplers)
    row["mosquitto RSS MiB"] = broker_sampler.peak_rss_mb
    row["wall s"] = time.monotonic() - started
    row["load"] = os.getloadavg()[0]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--edges", type=int, default=10, help="edges of the edge arm (N divisible by it)")
    parser.add_argument("--processes", type=int, default=4, help="swarm processes of the flat arm")
    parser.add_argument("--connect-rate", type=float, default=500.0, help="devices per second in total")
    parser.add_argument("--round-timeout", type=float, default=600.0, help="the server's --round-timeout")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds any one wait may take")
    parser.add_argument("--arms", nargs="+", choices=["flat", "edges"], default=["flat", "edges"])
    parser.add_argument("--keep", type=Path, default=None, help="keep run directories and logs here")
    args = parser.parse_args()
    if args.devices % args.edges:
        parser.error("--devices must be divisible by --edges")
    raise_fd_limit()
    rows = []
    for edges in [0 if arm == "flat" else args.edges for arm in args.arms]:
        workdir = Path(tempfile.mkdtemp(prefix=f"fedsdk-scale-edges-{edges}-", dir=args.keep))
        rows.append(measure(args.devices, edges, workdir, args))
        print(f"{rows[-1]}", flush=True)
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(COLUMNS, rows, missing="-")


if __name__ == "__main__":
    main()
