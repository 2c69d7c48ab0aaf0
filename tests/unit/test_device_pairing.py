"""Unit tests of the device side of pairing: stored config, pairing topics, fingerprints,
connection error messages, the step-time benchmark and the device CLI without a server."""

from __future__ import annotations

import json
import ssl
import stat

import pytest
from click.testing import CliRunner

from sdk_device import device_config
from sdk_device.cli import main
from sdk_device.device_config import DeviceConfig
from sdk_device.pairing import PairClient, PairingError, explain_connect_error, normalize_fingerprint
from sdk_device.protocol.pair_topics import PairTopics, new_client_id


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSDK_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def _config(**overrides) -> DeviceConfig:
    values = {
        "broker_url": "mqtts://server:8883",
        "fleet": "lab",
        "device_id": "pi",
        "username": "pi",
        "password": "secret-password",
        "tier": "0.5",
    }
    return DeviceConfig(**{**values, **overrides})


def test_config_directory_follows_env_then_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDSDK_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert device_config.config_dir() == tmp_path / "xdg" / "fedsdk"
    assert device_config.default_work_dir() == tmp_path / "state" / "fedsdk" / "work"
    monkeypatch.setenv("FEDSDK_CONFIG_DIR", str(tmp_path / "mine"))
    assert device_config.config_dir() == tmp_path / "mine"
    assert device_config.default_work_dir() == tmp_path / "mine" / "work"


def test_config_is_saved_private_and_loaded_back(config_home, caplog):
    assert DeviceConfig.load() is None
    path = _config().save()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_home.stat().st_mode) == 0o700
    assert DeviceConfig.load() == _config()
    path.chmod(0o644)
    DeviceConfig.load()
    assert "readable by others" in caplog.text
    _config(device_id="pi2").save()  # rewriting an existing file makes it private again
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (config_home / "ca.pem").write_text("x")
    assert {p.name for p in device_config.forget()} == {"device.json", "ca.pem"}
    assert DeviceConfig.load() is None
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        DeviceConfig.load()


def test_pairing_topics_confine_a_client_to_its_own_subtree():
    topics, cid = PairTopics(), new_client_id()
    assert cid.startswith("pair-") and len(cid) == 37 and new_client_id() != cid
    assert topics.up(cid) == f"fedsdk/v1/pair/{cid}/req" and topics.down(cid) == f"fedsdk/v1/pair/{cid}/resp"
    assert topics.down_chunk(cid).endswith("/resp/chunk")
    assert topics.device_subscriptions(cid) == [topics.down(cid), topics.down_chunk(cid)]
    assert topics.parse_device_topic(f"fedsdk/v1/pair/{cid}/req") == (cid, "up")
    assert topics.parse_device_topic(f"fedsdk/v1/pair/{cid}/req/chunk") == (cid, "up/chunk")
    for bad in (
        f"fedsdk/v1/pair/{cid}/resp",
        "fedsdk/v1/pair/_server/req",
        "fedsdk/v1/lab/dev/x/up",
        "fedsdk/v1/pair/a+b/req",
    ):
        with pytest.raises(ValueError):
            topics.parse_device_topic(bad)
    with pytest.raises(ValueError):
        topics.up("_server")


def test_fingerprints_are_normalized():
    hexa = "AB" * 32
    colons = ":".join(["AB"] * 32)
    assert normalize_fingerprint(f"sha256:{hexa}") == normalize_fingerprint(colons) == f"sha256:{'ab' * 32}"
    with pytest.raises(PairingError) as info:
        normalize_fingerprint("sha256:abc")
    assert info.value.kind == "usage"


def test_connection_failures_get_distinct_kinds():
    def failure(cause: BaseException | None, text: str = "cannot reach MQTT broker") -> str:
        exc = ConnectionError(text)
        exc.__cause__ = cause
        return explain_connect_error(exc, "mqtts://h:8883").kind

    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    assert failure(verify) == "tls_trust"
    assert failure(ConnectionRefusedError(111, "Connection refused")) == "unreachable"
    assert failure(None, "MQTT broker at mqtt://h:1 refused us: Not authorized") == "refused"
    assert failure(None, "MQTT broker at mqtt://h:1 refused us: no answer within 15 s") == "unreachable"


def test_plain_tcp_to_another_machine_needs_insecure():
    with pytest.raises(PairingError) as info:
        PairClient("mqtt://192.0.2.7:1883")
    assert info.value.kind == "insecure" and info.value.exit_code == 11
    PairClient("mqtt://192.0.2.7:1883", insecure=True).close()
    PairClient("mqtt://127.0.0.1:1883").close()
    with pytest.raises(PairingError, match="not both"):
        PairClient("mqtts://h:8883", ca_file="x", ca_fingerprint="ab" * 32)


def test_benchmark_times_each_runtime_on_the_model(one_torch_thread):
    from fedcore import modelspec
    from fedcore.recipe import Recipe
    from sdk_device.benchmark import REFERENCE_SPEC, bench_programs, fastest, initial_weights

    programs = {"torchspec/1": modelspec.dumps(REFERENCE_SPEC)}
    seen = []
    bench = bench_programs(
        programs,
        initial_weights(REFERENCE_SPEC),
        Recipe(batch_size=8),
        steps=2,
        on_runtime=lambda name, row: seen.append((name, row is None)),
    )
    (row,) = bench["runtimes"]
    assert row["runtime"] == "torch" and row["ms_per_step"] > 0 and row["error"] == ""
    assert seen == [("torch", True), ("torch", False)]
    assert bench["batch_size"] == 8 and bench["base_rss_mb"] > 10 and bench["peak_rss_mb"] >= 10
    assert fastest(bench) == row
    bad = bench_programs(
        {"torchspec/1": programs["torchspec/1"]},
        {"nope": initial_weights(REFERENCE_SPEC)["layers.0.weight"]},
        Recipe(batch_size=8),
        steps=1,
    )
    assert bad["runtimes"][0]["ms_per_step"] is None and bad["runtimes"][0]["error"]  # reported, not raised


def test_cli_without_a_pairing_says_what_to_do(config_home):
    runner = CliRunner()
    result = runner.invoke(main, ["run"])
    assert result.exit_code == 1 and "not paired" in result.output and "fedsdk pair" in result.output
    result = runner.invoke(main, ["status"])
    assert result.exit_code == 1 and "not paired" in result.output
    result = runner.invoke(main, ["unpair", "--yes"])
    assert result.exit_code == 0 and "nothing to do" in result.output
    _config().save()
    result = runner.invoke(main, ["pair", "--server", "mqtt://127.0.0.1:1", "--code", "AAAA-AAAA"])
    assert result.exit_code == 1 and "already paired as 'pi'" in result.output
    result = runner.invoke(main, ["run"])  # paired, but no data stored or given
    assert result.exit_code == 1 and "no training data" in result.output


def test_pair_to_a_closed_port_is_unreachable(config_home):
    result = CliRunner().invoke(
        main, ["pair", "--server", "mqtt://127.0.0.1:1", "--code", "AAAA-AAAA", "--timeout", "5"]
    )
    assert result.exit_code == 3, result.output
    assert "cannot reach the broker" in result.output
    assert DeviceConfig.load() is None


def test_bench_prints_the_profile_and_a_reference_step_time(config_home, one_torch_thread):
    result = CliRunner().invoke(main, ["bench", "--steps", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["model"] == "reference" and out["profile"]["cpu_count"] >= 1
    assert (
        out["bench"]["runtimes"][0]["runtime"] == "torch" and out["bench"]["runtimes"][0]["ms_per_step"] > 0
    )
    text = CliRunner().invoke(main, ["bench", "--steps", "1"]).output
    assert "memory" in text and "reference CNN" in text and "ms per step" in text
