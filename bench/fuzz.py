"""The fuzz suite's long run (issue 28): ``--messages`` generated messages (tests/fuzz_wire.py:
every control message type with extreme values or broken, chunk frames, statuses) on every
topic the server listens to, while two honest devices train rounds with it over a real
mosquitto (the server in this process: the MQTT grid and round loop of ``fedsdk-server run``).
Hypothesis draws ~15 ms a message on a busy 2-core machine, so ``--unique`` distinct examples
are generated and the rest of the ``--messages`` repeat them in a seeded random order.
Rounds run until the fuzzer is done, then one more. Prints: messages sent, server exceptions
(log records carrying a traceback, exceptions that ended a thread), rounds completed, honest
updates lost (asked of an honest device and not accepted), registry rows and size, and what the
server only counted (garbage beyond its rate limits, chunk frames answering no pull).

Run from the repository root::

    nice -n 10 .venv/bin/python bench/fuzz.py [--messages 100000] [--seed 1]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdk_device.agent import DeviceAgent  # noqa: E402
from server_toolkit.broker.mosquitto import MosquittoBroker  # noqa: E402
from server_toolkit.rounds.loop import NoUpdates  # noqa: E402
from tests.fuzz_wire import Tracebacks, fuzzed_fleet  # noqa: E402
from tests.integration.harness import Fleet  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000, help="generated messages to publish")
    parser.add_argument("--seed", type=int, default=1, help="hypothesis seed")
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="messages a second at most (0: as fast as paho takes them)")
    parser.add_argument("--unique", type=int, default=1000,
                        help="distinct hypothesis examples; the rest repeat them in a seeded random order")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    started, load_start = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, MosquittoBroker(workdir=Path(tmp) / "mosquitto") as broker:
        fleet = Fleet(broker.address, Path(tmp))
        honest = ["good0", "good1"]
        paths, fuzzer = fuzzed_fleet(fleet, honest)
        rows: list[dict] = []
        with Tracebacks() as tracebacks:
            try:
                for dev in honest:
                    fleet.start_thread(DeviceAgent(fleet.agent_config(dev, paths[dev])))
                loop = fleet.server(rounds=1, round_timeout_s=120, min_devices=2, fleet_timeout_s=300)
                loop.start()
                fleet_ok = loop.grid.wait_for_devices(2, timeout_s=120) >= 2
                thread = threading.Thread(target=fuzzer.run, daemon=True,
                                          args=(args.messages, args.seed, args.unique, args.rate))
                thread.start()
                while fleet_ok and (thread.is_alive() or len(rows) == 0 or rows[-1]["under_fuzz"]):
                    under = thread.is_alive()
                    loop.config.rounds = loop.completed_round + 1
                    try:
                        rows += [{**r, "under_fuzz": under} for r in loop.run()]
                    except NoUpdates:  # a round without an honest update: lost, counted below
                        rows += [{"round": loop.completed_round, "accepted": 0, "seconds": float("nan"),
                                  "under_fuzz": under}]
                    print(f"round {rows[-1]['round']}: accepted {rows[-1]['accepted']} in "
                          f"{rows[-1]['seconds']:.1f} s; {fuzzer.sent} messages sent", flush=True)
            finally:
                fuzzer.stop.set()
                fuzzer.link.close()
                fleet.close()
        asked = 2 * len(rows)
        accepted = sum(r["accepted"] for r in rows)
        size = sum(p.stat().st_size for p in (Path(tmp) / "server").glob("registry.sqlite*"))
        rejections = len(fleet.registry.rejections())
        print(f"messages sent: {fuzzer.sent}")
        print(f"server exceptions: {len(tracebacks.records)}")
        for record in tracebacks.records[:10]:
            print(f"  {record}")
        print(f"rounds completed: {len(rows)} ({sum(r['under_fuzz'] for r in rows)} under fuzz)")
        print(f"honest updates lost: {asked - accepted} of {asked}")
        print(f"round seconds: max {max(r['seconds'] for r in rows):.1f}, "
              f"mean {sum(r['seconds'] for r in rows) / len(rows):.1f}")
        print(f"registry: {rejections} rejection rows, {len(fleet.registry.devices())} devices, "
              f"{size / 1e6:.1f} MB")
        endpoint = loop.grid.endpoint
        print(f"only counted (rate limit): {endpoint.rejections.dropped} rejections of registered ids, "
              f"{endpoint.strangers.total} messages of unknown ids; {endpoint.stray_chunks} chunk frames "
              f"answering no pull dropped unread")
        print(f"wall time: {time.monotonic() - started:.0f} s")
        print(f"load average (1 min) at start {load_start:.1f}, at end {os.getloadavg()[0]:.1f} "
              f"(the machine is shared)")


if __name__ == "__main__":
    main()
