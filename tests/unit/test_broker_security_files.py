"""Unit tests of the broker security files, the fleet CA and the plain-TCP policy."""

from __future__ import annotations

import os
import shutil
import ssl
import stat
import subprocess

import pytest

from sdk_device.transport.mqtt_link import BrokerAddress, MqttLink
from sdk_device.transport.tls import (
    InsecureTransportError,
    certificate_fingerprint,
    check_plain_tcp,
    is_loopback,
)
from server_toolkit.broker.certs import CertFiles, fingerprints, init_certs, server_hosts
from server_toolkit.broker.mosquitto_auth import (
    ACL_FILE,
    PASSWD_FILE,
    STATE_FILE,
    MosquittoAuthFiles,
    SecurityDirError,
    hash_password,
    read_passwd,
    verify_password,
)
from server_toolkit.broker.security import BrokerSecurity, acl_rules, check_device_account, pair_topic

# -- password hashes ----------------------------------------------------------------------


def test_hash_roundtrip_and_format():
    hashed = hash_password("s3cret")
    assert hashed.startswith("$7$1000$")
    assert verify_password("s3cret", hashed)
    assert not verify_password("s3cret ", hashed)
    assert not verify_password("s3cret", "$6$abc$def")
    assert not verify_password("s3cret", "garbage")
    assert hash_password("x") != hash_password("x")  # fresh salt each time


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd not installed")
def test_our_verifier_accepts_mosquitto_passwd_hashes(tmp_path):
    """Same format as mosquitto's own tool: our verifier checks its hashes."""
    path = tmp_path / "pw"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(path), "dev1", "pa ss"], check=True)
    hashed = read_passwd(path)["dev1"]
    assert hashed.startswith("$7$")
    assert verify_password("pa ss", hashed) and not verify_password("pass", hashed)


# -- ACL text and names ---------------------------------------------------------------------


def test_acl_rules_confine_each_account():
    text = acl_rules("lab", ["pi-2", "pi-1"])
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    blocks = {b.splitlines()[0]: b.splitlines()[1:] for b in "\n".join(lines).split("\n\n") if "user " in b}
    assert blocks["user fedsdk-server"] == [
        "topic readwrite fedsdk/v1/lab/#",
        "topic readwrite fedsdk/v1/pair/#",
    ]
    assert blocks["user pi-1"] == [
        "topic readwrite fedsdk/v1/lab/dev/pi-1/#",
        "topic read fedsdk/v1/lab/server/status",
        "topic read fedsdk/v1/lab/broadcast/#",
    ]
    assert blocks["user fedsdk-pair"] == []
    assert text.rstrip().splitlines()[-1] == "pattern readwrite fedsdk/v1/pair/%c/#"
    assert text.index("user pi-1") < text.index("user pi-2")


@pytest.mark.parametrize("bad", ["fedsdk-server", "fedsdk-pair", "fedsdk-x", "a/b", "+", "#", "", "x" * 65])
def test_device_account_names(bad):
    with pytest.raises(ValueError):
        check_device_account(bad)


def test_pair_topic():
    assert pair_topic("c-1", "req") == "fedsdk/v1/pair/c-1/req"
    with pytest.raises(ValueError):
        pair_topic("a/b", "req")


# -- the security directory -----------------------------------------------------------------


def test_security_dir_create_grant_revoke_without_a_broker(tmp_path):
    d = tmp_path / "sec"
    security = MosquittoAuthFiles.create(d, "lab")
    assert isinstance(security, BrokerSecurity)
    for name in (STATE_FILE, PASSWD_FILE, ACL_FILE):
        assert stat.S_IMODE(os.stat(d / name).st_mode) == 0o600
    user, password = security.server_credentials()
    assert user == "fedsdk-server" and len(password) >= 20
    assert verify_password(password, read_passwd(d / PASSWD_FILE)["fedsdk-server"])
    assert verify_password("fedsdk-pair", read_passwd(d / PASSWD_FILE)["fedsdk-pair"])
    assert security.devices() == []

    # No mosquitto runs: the grant is written, then a clear error says the broker was not told.
    with pytest.raises(SecurityDirError, match="is mosquitto running"):
        security.grant_device("pi-1", "pw-1")
    assert security.devices() == ["pi-1"]
    assert verify_password("pw-1", read_passwd(d / PASSWD_FILE)["pi-1"])
    assert "user pi-1" in (d / ACL_FILE).read_text()
    with pytest.raises(SecurityDirError):
        security.revoke_device("pi-1")
    assert security.devices() == [] and "pi-1" not in (d / ACL_FILE).read_text()

    with pytest.raises(ValueError):
        security.grant_device("fedsdk-server", "takeover")
    with pytest.raises(ValueError):
        security.grant_device("pi-1", "")
    with pytest.raises(SecurityDirError, match="exists already"):
        MosquittoAuthFiles.create(d, "lab")
    with pytest.raises(SecurityDirError, match="security init"):
        MosquittoAuthFiles(tmp_path / "nowhere")


def test_reload_command_replaces_sighup(tmp_path):
    marker = tmp_path / "reloaded"
    security = MosquittoAuthFiles.create(tmp_path / "sec", "lab", reload_command=["touch", str(marker)])
    security.grant_device("pi-1", "pw")  # no broker address: signalled, not probed
    assert marker.exists()


# -- certificates ---------------------------------------------------------------------------


def test_init_certs_makes_a_ca_and_a_server_cert_for_the_hosts(tmp_path):
    files = init_certs(tmp_path / "certs", ["fl.example", "10.1.2.3", "127.0.0.1"])
    assert files.check() is files
    assert stat.S_IMODE(os.stat(files.ca_key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(files.server_key).st_mode) == 0o600
    assert server_hosts(files) == ["fl.example", "10.1.2.3", "127.0.0.1"]
    prints = fingerprints(files)
    assert prints["ca.pem"].startswith("sha256:") and len(prints["ca.pem"]) == 7 + 64
    # The standard library's TLS stack loads the key with its certificate (they match).
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(str(files.server_pem), str(files.server_key))
    # openssl agrees that the server certificate chains to the CA, and on the fingerprint.
    if shutil.which("openssl"):
        out = subprocess.run(["openssl", "verify", "-CAfile", str(files.ca_pem), str(files.server_pem)],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        fp = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in",
                             str(files.ca_pem)], capture_output=True, text=True, check=True).stdout
        assert fp.strip().split("=")[1].replace(":", "").lower() == prints["ca.pem"].removeprefix("sha256:")


def test_rerun_keeps_the_ca_and_reissues_the_server_cert(tmp_path):
    first = fingerprints(init_certs(tmp_path, ["a.example"]))
    second = fingerprints(init_certs(tmp_path, ["b.example"]))
    assert first["ca.pem"] == second["ca.pem"]
    assert first["server.pem"] != second["server.pem"]
    assert server_hosts(CertFiles(tmp_path)) == ["b.example"]
    third = fingerprints(init_certs(tmp_path, ["b.example"], new_ca=True))
    assert third["ca.pem"] != first["ca.pem"]


def test_cert_files_check_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="ca.pem, server.pem, server.key.*certs init"):
        CertFiles(tmp_path).check()


def test_certificate_fingerprint_needs_a_certificate():
    with pytest.raises(ValueError):
        certificate_fingerprint("not a certificate")


# -- plain TCP policy -----------------------------------------------------------------------


def test_loopback_names():
    assert all(is_loopback(h) for h in ("localhost", "127.0.0.1", "127.8.9.1", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("10.0.0.2", "192.168.1.5", "server.local", "0.0.0.0"))


def test_plain_tcp_only_to_loopback_unless_insecure():
    check_plain_tcp("127.0.0.1", tls=False)
    check_plain_tcp("server.local", tls=True)
    check_plain_tcp("server.local", tls=False, insecure=True)
    with pytest.raises(InsecureTransportError, match="mqtts://.*--insecure"):
        check_plain_tcp("server.local", tls=False)


def test_mqtt_link_refuses_plain_remote_before_connecting():
    with pytest.raises(InsecureTransportError):
        MqttLink(BrokerAddress.parse("mqtt://10.9.8.7:1883"), "c", lambda t, p: None)
    MqttLink(BrokerAddress.parse("mqtt://10.9.8.7:1883"), "c", lambda t, p: None, insecure=True)
    MqttLink(BrokerAddress.parse("mqtts://10.9.8.7:8883"), "c", lambda t, p: None)


def test_reload_refuses_to_signal_a_pid_that_is_not_mosquitto(tmp_path):
    security = MosquittoAuthFiles.create(tmp_path / "sec", "lab")
    (tmp_path / "sec" / "mosquitto.pid").write_text(f"{os.getpid()}\n")  # this pytest process
    with pytest.raises(SecurityDirError, match="not mosquitto"):
        security.grant_device("pi-1", "pw")
