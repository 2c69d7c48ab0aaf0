"""Fleet scale: a real ``fedsdk-server run`` against a real mosquitto and a device swarm of N.

For each N of ``--sizes`` (default 1000 5000 10000), in a fresh directory:

1. **register** N ids by running ``fedsdk-server devices add --count N --prefix swarm-`` as a
   user would (the wall time of the command, Python start-up included); the swarm's ids are
   the same (``swarm_ids`` = ``numbered_ids``);
2. start mosquitto (fedsdk's test configuration plus ``sys_interval 1``, ``max_queued_messages``
   = ``--max-queued``, by default the sizing rule of docs/operations.md §1: 3 × N, at least
   10,000; the open-file limit raised to the hard limit, which children inherit: one
   descriptor per connection), then ``fedsdk-server run --model small_cnn --dataset digits
   --min-devices N --fleet-timeout T --clients-per-round 100 --rounds 2`` (every round waits
   for the whole fleet, at most ``--timeout``), then the swarm (``--processes``,
   ``--connect-rate``);
3. measure: **connected** (swarm start -> every device has its CONNACK), **hellos** (swarm start
   -> the registry has a hello of every device), **round 100** (the ``seconds`` of round 2, the
   first round carries the program export), then ``--resume --rounds 3 --clients-per-round
   min(1000, N)``: **round 1000** (round 3's ``seconds``);
4. then ``--resume --rounds 5``, SIGKILL once round 4's tasks went out, ``--resume`` again
   (with more rounds, stopped once rounds 4-5 are done and every device said hello to it):
   **resume** = restart -> the first task a swarm device receives (all devices stay connected;
   ``--min-devices N``: the round waits until the server knows all N again), **re-hellos** =
   restart -> the restarted server logged a hello of every device (the epoch's window is
   N / 333 s, at least 1 s; a small fleet's rounds may be over sooner: ``done first (k/N)``);
5. server peak RSS and CPU seconds (over all its processes' lives), mosquitto peak RSS, the
   swarm's memory per device, the broker's dropped publishes (``$SYS``, in total and between
   the SIGKILL and the end), the N's wall time and the 1-minute load average at its end.

A wait that times out (``--timeout``) prints ``timeout`` in its cell and the bench goes on
with the next N. Run from the repository root::

    .venv/bin/python bench/scale.py [--sizes 1000 5000] [--processes 4] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scale_probes import (  # noqa: E402
    BrokerWatch,
    ProcessSampler,
    hellos_logged,
    hellos_recorded,
    round_rows,
    rss_mb,
)

from server_toolkit.broker.mosquitto import MosquittoBroker  # noqa: E402
from server_toolkit.swarm import Swarm, SwarmConfig  # noqa: E402
from server_toolkit.swarm.shard import raise_fd_limit  # noqa: E402

FLEET = "scale"
KEEP_ROUNDS = 200  # rounds the restarted server may run after round 5 while its re-hellos arrive
COLUMNS = ["N", "register s", "connected s", "hellos s", "round 100 s", "round 1000 s", "resume s",
           "re-hellos s", "server RSS MiB", "server CPU s", "mosquitto RSS MiB", "swarm KiB/dev", "dropped",
           "dropped after kill", "wall s", "load"]


class Timeout(Exception):
    """A wait of the bench ran out of time."""


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.2) -> float:
    """Seconds until ``condition()`` held; Timeout after ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise Timeout(what)
        time.sleep(poll_s)
    return time.monotonic() - started


class Server:
    """One ``fedsdk-server -v run`` process of the bench (output in ``<run dir>/server-<n>.log``;
    ``-v``: INFO lines, one per hello, counted by ``hellos_logged``)."""

    def __init__(self, run_dir: Path, broker_url: str, devices: int, rounds: int, per_round: int,
                 resume: bool, round_timeout_s: float, fleet_timeout_s: float, index: int) -> None:
        args = [sys.executable, "-m", "server_toolkit.cli", "-v", "run", "--broker", broker_url,
                "--fleet", FLEET, "--run-dir", str(run_dir), "--model", "small_cnn", "--dataset", "digits",
                "--rounds", str(rounds), "--clients-per-round", str(per_round), "--min-devices", str(devices),
                "--fleet-timeout", str(fleet_timeout_s), "--round-timeout", str(round_timeout_s),
                "--local-epochs", "1"]
        args += ["--resume"] if resume else []
        self.log = run_dir / f"server-{index}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.sampler = ProcessSampler(self.proc.pid)

    def finished(self) -> bool:
        if self.proc.poll() is None:
            return False
        if self.proc.returncode != 0:
            raise RuntimeError(f"the server exited with {self.proc.returncode}; see {self.log}")
        return True

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.sampler.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.sampler.stop()


def measure(n: int, workdir: Path, args) -> dict:
    """One row of the table for a fleet of ``n`` devices (cells left out when a wait timed out)."""
    row: dict = {"N": n}
    run_dir = workdir / "server"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "server_toolkit.cli", "devices", "add", "--run-dir", str(run_dir),
                    "--count", str(n), "--prefix", "swarm-"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    row["register s"] = time.monotonic() - started
    servers: list[Server] = []
    swarm = watch = dropped_before = None
    queued = args.max_queued or max(10_000, 3 * n)
    broker = MosquittoBroker(workdir=workdir / "mosquitto", extra_config="sys_interval 1",
                             max_queued_messages=queued).start()
    broker_sampler = ProcessSampler(broker.proc.pid)
    try:
        watch = BrokerWatch(broker.host, broker.port, FLEET)

        def server(rounds: int, per_round: int, resume: bool) -> Server:
            servers.append(Server(run_dir, broker.url, n, rounds, per_round, resume, args.round_timeout,
                                  args.timeout, len(servers)))
            return servers[-1]

        launched = time.monotonic()
        first = server(rounds=2, per_round=min(100, n), resume=False)
        if not watch.wait_server_online(launched, args.timeout):
            raise Timeout("server start")
        hello_since, swarm_started = time.time(), time.monotonic()
        swarm = Swarm(SwarmConfig(broker.url, FLEET, devices=n, processes=args.processes,
                                  connect_rate=args.connect_rate)).start()
        wait_for(lambda: swarm.counters().connected == n, args.timeout, "connected")
        row["connected s"] = time.monotonic() - swarm_started
        registry_path = run_dir / "registry.sqlite"
        wait_for(lambda: hellos_recorded(registry_path, hello_since) >= n, args.timeout, "hellos")
        row["hellos s"] = time.monotonic() - swarm_started
        row["swarm KiB/dev"] = rss_mb(swarm.pids) * 1024 / n
        wait_for(first.finished, args.timeout, "rounds 1-2")
        row["round 100 s"] = round_rows(run_dir)[2]["seconds"]
        second = server(rounds=3, per_round=min(1000, n), resume=True)
        wait_for(second.finished, args.timeout, "round 3")
        row["round 1000 s"] = round_rows(run_dir)[3]["seconds"]
        third = server(rounds=5, per_round=min(100, n), resume=True)
        tasks = swarm.counters().tasks
        wait_for(lambda: swarm.counters().tasks > tasks, args.timeout, "round 4 tasks")
        third.kill()
        time.sleep(2.5)  # the swarm reports its counters once a second: let round 4's tasks settle
        tasks, dropped_before = swarm.counters().tasks, watch.dropped
        restarted = time.monotonic()
        fourth = server(rounds=5 + KEEP_ROUNDS, per_round=min(100, n), resume=True)
        wait_for(lambda: swarm.counters().tasks > tasks, args.timeout, "the next round after the restart")
        row["resume s"] = time.monotonic() - restarted
        wait_for(lambda: hellos_logged(fourth.log) >= n or fourth.finished(), args.timeout, "re-hellos",
                 poll_s=0.5)
        heard = hellos_logged(fourth.log)
        row["re-hellos s"] = time.monotonic() - restarted if heard >= n else f"done first ({heard}/{n})"
        wait_for(lambda: len(round_rows(run_dir)) >= 5, args.timeout, "rounds 4-5")
        fourth.stop()  # rounds 6.. only kept it serving while the re-hellos came in
    except Timeout as exc:
        row["timeout"] = str(exc)
        print(f"N={n}: timed out waiting for {exc}", file=sys.stderr)
    finally:
        for s in servers:
            s.stop()
        if swarm is not None:
            row["swarm at the end"] = swarm.counters().status_line(n)
            swarm.stop()
        time.sleep(1.5)  # one more $SYS interval
        if watch is not None:
            row["dropped"] = watch.dropped
            if dropped_before is not None:
                row["dropped after kill"] = watch.dropped - dropped_before
            watch.close()
        broker_sampler.stop()
        broker.stop()
    row["server RSS MiB"] = max((s.sampler.peak_rss_mb for s in servers), default=None)
    row["server CPU s"] = sum(s.sampler.cpu_s for s in servers)
    row["mosquitto RSS MiB"] = broker_sampler.peak_rss_mb
    row["max_queued_messages"] = queued
    row["wall s"] = time.monotonic() - started
    row["load"] = os.getloadavg()[0]
    return row


def cell(value, missing: str = "timeout") -> str:
    if value is None:
        return missing
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def print_table(columns: list[str], rows: list[dict], missing: str = "timeout") -> None:
    """``rows`` as a Markdown table of ``columns`` (what BENCHMARKS.md shows)."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(cell(row.get(c), missing) for c in columns) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--processes", type=int, default=4, help="swarm processes")
    parser.add_argument("--connect-rate", type=float, default=500.0, help="devices per second")
    parser.add_argument("--round-timeout", type=float, default=300.0, help="the server's --round-timeout")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds any one wait may take")
    parser.add_argument("--max-queued", type=int, default=None,
                        help="mosquitto's max_queued_messages (default: 3 x N, at least 10,000)")
    parser.add_argument("--keep", type=Path, default=None, help="keep run directories and logs here")
    args = parser.parse_args()
    limit = raise_fd_limit()
    print(f"open-file limit {limit} (mosquitto needs one per device, each swarm process one per device)")
    rows = []
    for n in args.sizes:
        workdir = Path(tempfile.mkdtemp(prefix=f"fedsdk-scale-{n}-", dir=args.keep))
        started = time.monotonic()
        rows.append(measure(n, workdir, args))
        print(f"N={n} done in {time.monotonic() - started:.0f} s: {rows[-1]}", flush=True)
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(COLUMNS, rows)


if __name__ == "__main__":
    main()
