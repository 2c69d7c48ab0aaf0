"""Pairing against a real mosquitto that enforces accounts and an ACL (the security helper's
secured broker): the pairing service runs as in ``fedsdk-server run``, the device side is
the real ``PairClient`` with the real benchmark."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from export.programs import ProgramCache
from fedcore.recipe import Recipe
from sdk_device.pair_cli import _benchmark
from sdk_device.pairing import PairClient, PairingError
from sdk_device.profile import current_rss_mb
from sdk_device.transport.mqtt_link import probe_login
from server_toolkit.fleet.pair_codes import LockoutPolicy, PairCodes
from server_toolkit.fleet.pairing_setup import start_pairing_on
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.zoo import model_spec
from tests.unit.pte_cache import cached_programs  # noqa: F401 (the program_for fixture)

pytestmark = pytest.mark.integration

TIERS = ["1.0", "0.5", "0.25"]


def _method() -> HeteroFL:
    return HeteroFL(model_spec("small_cnn", (1, 8, 8), 10), Recipe(epochs=1, batch_size=16))


def _serve(
    secured, run_dir, policy: LockoutPolicy, programs: ProgramCache | None = None, tiers: list[str] = TIERS
):
    """The pairing service of a heterofl fleet with ``tiers``, logged in as fedsdk-server."""
    service, registry = start_pairing_on(secured, run_dir, _method(), tiers, method_name="heterofl",
                                         model="small_cnn", lockout=policy, programs=programs)
    return service, registry, PairCodes(registry, secured.security.directory, policy)  # the fleet's key


def _pair(url: str, code: str, name: str = "dev", **trust):
    # the benchmark counts this process's resident memory (a test worker that may hold several
    # exports) as the runtime's footprint: the device has 2 GB beyond it
    spare = 2048.0 + (current_rss_mb() or 0.0)
    profile = {"arch": "x86_64", "memory_mb": spare + 2048.0, "memory_available_mb": spare,
               "num_samples": 200}

    def benchmark(offer, models, fetch):
        return _benchmark(offer, models, fetch, None, None, None, profile["memory_available_mb"])

    with PairClient(url, timeout_s=60, **trust) as client:
        return client.pair(code, name, profile, benchmark)


def _kind(url: str, code: str, **trust) -> str:
    with pytest.raises(PairingError) as info:
        _pair(url, code, **trust)
    return info.value.kind, str(info.value)


def test_codes_fail_each_with_its_own_error_and_wrong_codes_lock_pairing(
    secured_mosquitto, tmp_path, one_torch_thread, caplog, program_for
):
    secured = secured_mosquitto
    programs = ProgramCache(["torchspec/1", "pte/1"])  # the fleet offers ExecuTorch programs too
    spec, recipe = _method().tier_plan(None)
    programs.put(spec, recipe, "pte/1", program_for(spec, recipe.loss_dict(), recipe.batch_size))
    service, registry, codes = _serve(
        secured, tmp_path / "run", LockoutPolicy(3, 60.0, 4.0), programs, tiers=[]
    )
    try:
        code, _ = codes.issue(600)
        accept = _pair(secured.url, code, name="pi-kitchen")
        assert accept.device_id == "pi-kitchen" and accept.username == "pi-kitchen"
        assert accept.tier is None and "full model" in accept.tier_reason  # this fleet has no tiers
        assert probe_login(secured.address, accept.username, accept.password) == "Success"
        assert registry.is_known("pi-kitchen")
        # the step time of the fleet's model on each runtime here, from the programs the fleet offers
        (timed,) = registry.device("pi-kitchen")["pair_profile"]["bench"]["tiers"].values()
        runtimes = {r["runtime"]: r["format"] for r in timed["runtimes"]}
        assert runtimes.pop("executorch-native", "pte/1") == "pte/1"  # timed too where its shim is built
        assert runtimes == {"torch": "torchspec/1", "executorch": "pte/1"}
        assert all(r["ms_per_step"] > 0 for r in timed["runtimes"]), timed

        kind, text = _kind(secured.url, code)
        assert kind == "code_used" and "already used" in text
        expired, _ = codes.issue(0.5)
        time.sleep(1.0)
        kind, text = _kind(secured.url, expired)
        assert kind == "code_expired" and "expired" in text
        assert registry.pair_failures(since=0) == []  # used and expired codes are no guesses

        good, _ = codes.issue(600)
        with caplog.at_level(logging.WARNING, logger="server_toolkit.fleet.pair_codes"):
            for guess in ("AAAA-AAAA", "BBBB-BBBB", "CCCC-CCCC"):
                kind, text = _kind(secured.url, guess)
                assert kind == "code_wrong" and "not valid" in text
            kind, text = _kind(secured.url, good)  # even the right code, while locked
        assert kind == "locked" and "locked" in text
        assert any("locked" in r.getMessage() for r in caplog.records)  # the server logs the lockout
        time.sleep(4.5)
        assert _pair(secured.url, good, name="pi-kitchen").device_id == "pi-kitchen-2"  # unlocked; name taken
        assert service.paired == ["pi-kitchen", "pi-kitchen-2"]
    finally:
        service.close()


def test_revoked_device_cannot_reconnect_and_strangers_cannot_connect(
    secured_mosquitto, tmp_path, one_torch_thread
):
    secured = secured_mosquitto
    run_dir = tmp_path / "run"
    service, registry, codes = _serve(secured, run_dir, LockoutPolicy())
    try:
        accept = _pair(secured.url, codes.issue(600)[0], name="cam")
        assert probe_login(secured.address, "cam", accept.password) == "Success"
        # every tier's sub-model was timed on the device; the largest fits this test machine
        timed = registry.device("cam")["pair_profile"]["bench"]["tiers"]
        assert set(timed) == set(TIERS) and all(t["runtimes"][0]["ms_per_step"] > 0 for t in timed.values())
        assert accept.tier == "1.0" and "tier 1.0" in accept.tier_reason, accept.tier_reason
        # strangers: no account, a made-up account, a real account with a wrong password
        assert probe_login(secured.address, None, None) != "Success"
        assert probe_login(secured.address, "cam2", accept.password) != "Success"
        assert probe_login(secured.address, "cam", "guess") != "Success"

        revoke = subprocess.run(
            [
                sys.executable,
                "-m",
                "server_toolkit.cli",
                "devices",
                "revoke",
                "--run-dir",
                str(run_dir),
                "cam",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert revoke.returncode == 0, revoke.stderr
        assert "broker account of cam deleted" in revoke.stdout
        assert probe_login(secured.address, "cam", accept.password) != "Success"
        time.sleep(2.5)  # the running server's registry sees the other process's write
        assert not registry.is_known("cam") and registry.device("cam")["status"] == "revoked"

        # a device can unpair itself (proving its password); the wrong password is refused
        other = _pair(secured.url, codes.issue(600)[0], name="cam")
        assert other.device_id == "cam-2"  # a revoked id is never reused
        with PairClient(secured.url) as client, pytest.raises(PairingError, match="not_paired"):
            client.unpair("cam-2", "wrong")
        with PairClient(secured.url) as client:
            client.unpair("cam-2", other.password)
        assert probe_login(secured.address, "cam-2", other.password) != "Success"
        assert not registry.is_known("cam-2")
    finally:
        service.close()


def test_trust_and_reachability_failures_are_told_apart(secured_mosquitto_tls, tmp_path):
    secured = secured_mosquitto_tls
    service, registry, codes = _serve(secured, tmp_path / "run", LockoutPolicy())
    try:
        code, _ = codes.issue(600)
        kind, text = _kind(secured.url, code, ca_fingerprint="sha256:" + "ab" * 32)
        assert kind == "tls_trust" and "not the sha256:abab" in text
        kind, text = _kind(secured.url, code)  # the system's CAs do not know the fleet's CA
        assert kind == "tls_trust" and "not trusted" in text
        dead = secured.url.rsplit(":", 1)[0] + ":1"
        kind, text = _kind(dead, code, ca_file=secured.ca_file)
        assert kind == "unreachable" and "cannot reach" in text
        kind, text = _kind("mqtt://192.0.2.1:1883", code)
        assert kind == "insecure"
        assert registry.pair_codes(since=0)[0]["used_at"] is None  # nothing spent the code
    finally:
        service.close()
