"""Run a real mosquitto broker as a child process (tests, benchmarks, ``fedsdk-server broker``).

mosquitto is the production broker. Debian/Ubuntu: ``apt-get install -y mosquitto``.
Anonymous by default (loopback tests); with ``security_dir`` it requires the accounts and
ACL of that broker security directory (``mosquitto_auth``), with ``tls_dir`` it speaks TLS
with the certificates of ``fedsdk-server certs init``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sdk_device.transport.mqtt_link import BrokerAddress

# QoS-1 messages mosquitto holds per client session beyond its in-flight window. The server's
# session must hold about 3 x the fleet (a restart receives every retained status and every
# re-hello at once; 10,000 dropped 9,045 publishes with 10,000 devices: docs/operations.md §5).
# 100,000 covers ~30,000 devices, at worst ~100 MB of queued hellos in the broker.
DEFAULT_MAX_QUEUED = 100_000


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host`` (racy by nature, fine for loopback tests)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Block until something accepts TCP connections on host:port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker process exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listened on {host}:{port} within {timeout_s} s")


def mosquitto_config(
    host: str,
    port: int,
    persistence_dir: Path,
    security_dir: Path | None = None,
    tls_dir: Path | None = None,
    extra: str = "",
    max_queued_messages: int = DEFAULT_MAX_QUEUED,
    persistence: bool = True,
) -> str:
    """A mosquitto 2.0 configuration: one listener, persistence, fedsdk's size limits, and
    the accounts/ACL of ``security_dir`` and the certificates of ``tls_dir`` when given.
    ``max_queued_messages`` is per client session; the server's must hold about 3 × the
    fleet size (docs/operations.md §1): the default suits fleets of up to ~30,000 devices.
    ``persistence=False``: sessions, queued messages and retained statuses die with the
    process (fault tests: a broker that restarts empty)."""
    # Run as root (CI), mosquitto would switch to user "mosquitto" and then fail to read
    # certificates or write persistence in our private work directory: keep the user.
    lines = ["user root"] if os.geteuid() == 0 else []
    lines.append(f"listener {port} {host}")
    if tls_dir is not None:
        lines += [f"cafile {tls_dir}/ca.pem", f"certfile {tls_dir}/server.pem",
                  f"keyfile {tls_dir}/server.key", "tls_version tlsv1.2"]
    if security_dir is not None:
        lines += ["allow_anonymous false", f"password_file {security_dir}/mosquitto.passwd",
                  f"acl_file {security_dir}/mosquitto.acl", f"pid_file {security_dir}/mosquitto.pid",
                  "persistent_client_expiration 30d"]  # drop sessions of long-gone (revoked) devices
    else:
        lines.append("allow_anonymous true")
    lines += [
        f"persistence {'true' if persistence else 'false'}",
        f"persistence_location {persistence_dir}/",
        f"max_queued_messages {max_queued_messages}",
        "max_inflight_messages 20",
        "max_packet_size 16777216",  # bytes; fedsdk chunks are <= 4 MiB + header
        "set_tcp_nodelay true",
        extra,
        "",
    ]
    return "\n".join(lines)


class MosquittoBroker:
    """A mosquitto process on a loopback port, with persistence in its own directory.

    Use as a context manager, or ``start()`` / ``stop()``.
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        workdir: str | Path | None = None,
        extra_config: str = "",
        executable: str | None = None,
        security_dir: str | Path | None = None,
        tls_dir: str | Path | None = None,
        max_queued_messages: int = DEFAULT_MAX_QUEUED,
        persistence: bool = True,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fedsdk-mosquitto-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.extra_config = extra_config
        self.max_queued_messages = max_queued_messages
        self.persistence = persistence
        self.executable = executable or shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.security_dir = Path(security_dir).resolve() if security_dir else None
        self.tls_dir = Path(tls_dir).resolve() if tls_dir else None
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress(self.host, self.port, tls=self.tls_dir is not None)

    @property
    def url(self) -> str:
        return self.address.url

    def config_text(self) -> str:
        return mosquitto_config(self.host, self.port, self.workdir, self.security_dir, self.tls_dir,
                                self.extra_config, self.max_queued_messages, self.persistence)

    def start(self, timeout_s: float = 10.0) -> MosquittoBroker:
        if not Path(self.executable).exists():
            raise FileNotFoundError(
                "mosquitto not found: install it (Debian/Ubuntu: apt-get install -y mosquitto)"
            )
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(self.config_text())
        self.proc = subprocess.Popen(
            [self.executable, "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "mosquitto.log", "ab"),  # noqa: SIM115
        )
        wait_for_port(self.host, self.port, timeout_s, self.proc)
        return self

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
