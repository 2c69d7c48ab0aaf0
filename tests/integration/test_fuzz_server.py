"""The fuzz suite in CI (issue 28): thousands of generated messages — every control message
type with extreme values or broken, chunk frames, statuses — on every topic a server listens
to, while two honest devices train rounds with it over mosquitto. The server stays up, no
exception escapes (none logged, none ends a thread), every round completes with both honest
updates, and the registry stays bounded: a stranger's messages are recorded once a minute, a
registered device's garbage once per (device, code) a minute. The long run is bench/fuzz.py."""

from __future__ import annotations

import threading
import time

import pytest

from sdk_device.agent import DeviceAgent

from ..fuzz_wire import GHOSTS, STRANGERS, Tracebacks, fuzzed_fleet
from .harness import Fleet

pytestmark = pytest.mark.integration

MESSAGES = 1500  # ~5 s of generating on a quiet machine (hypothesis draws ~1.5 ms a message)


def test_a_server_under_fuzz_stays_up_and_completes_the_honest_rounds(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    honest = ["good0", "good1"]
    paths, fuzzer = fuzzed_fleet(fleet, honest)
    started = time.monotonic()
    with Tracebacks() as tracebacks:
        try:
            for dev in honest:
                fleet.start_thread(DeviceAgent(fleet.agent_config(dev, paths[dev])))
            loop = fleet.server(rounds=2, round_timeout_s=60, min_devices=2)
            loop.start()
            assert loop.grid.wait_for_devices(2, timeout_s=60) >= 2
            thread = threading.Thread(target=fuzzer.run, args=(MESSAGES,), daemon=True)
            thread.start()
            rows = loop.run()  # rounds 1-2 under fuzz
            thread.join(timeout=300)
            loop.config.rounds = 3
            rows += loop.run()  # round 3 after all of it: the server still serves
        finally:
            fuzzer.stop.set()
            fuzzer.link.close()
            fleet.close()
    minutes = 1 + int((time.monotonic() - started) // 60)  # rate-limit windows the run spanned
    assert fuzzer.sent == MESSAGES
    assert tracebacks.records == []
    assert [r["accepted"] for r in rows] == [2, 2, 2]  # no honest update lost
    assert all(r["seconds"] < 30 for r in rows), [r["seconds"] for r in rows]
    registry = fleet.registry
    assert {d["device_id"] for d in registry.devices()} == {*honest, *GHOSTS}  # strangers never join
    rows_by, by_code = {}, {}
    for r in registry.rejections():
        rows_by[r["device_id"]] = rows_by.get(r["device_id"], 0) + 1
        by_code[r["device_id"], r["code"]] = by_code.get((r["device_id"], r["code"]), 0) + 1
        assert len(r["detail"]) <= 1000
    assert all(rows_by.get(s, 0) <= minutes for s in STRANGERS), rows_by  # rate-limited: one a minute per id
    ghosts = {key: n for key, n in by_code.items() if key[0] in GHOSTS}  # all garbage: they never run
    assert ghosts and all(n <= minutes for n in ghosts.values()), ghosts  # one a minute per (id, code)
    assert set(rows_by) <= {*honest, *GHOSTS, *STRANGERS}
    assert all((d["num_samples"] or 1) <= 10**9 for d in registry.devices())
