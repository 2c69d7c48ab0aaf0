"""Broker security for mosquitto: a password file and an ACL file, reloaded with SIGHUP.

The security directory (``fedsdk-server security init --security-dir DIR``) holds:

* ``security.json``   fleet name, the server account's password, the listener (0600);
* ``mosquitto.passwd`` mosquitto's password file: ``user:$7$<iterations>$<salt>$<hash>``
  (PBKDF2-SHA512, the format of mosquitto 2.0's ``mosquitto_passwd``);
* ``mosquitto.acl``    the ACL, regenerated from the accounts (``security.acl_rules``);
* ``mosquitto.pid``    written by mosquitto (``pid_file``), so we know whom to signal.

Why files and not the dynamic-security plugin: measured on mosquitto 2.0.11, dynsec ACLs do
not expand ``%c`` (a pairing client subscribing ``fedsdk/v1/pair/<own id>/#`` under a
``fedsdk/v1/pair/%c/#`` rule was refused), so one shared pairing account could not be kept
out of other devices' pairing answers. The ACL file expands ``%c``, and on SIGHUP mosquitto
re-reads both files and disconnects sessions whose account is gone (measured: a revoked
device's live session closed within the reload, its reconnect got "not authorised").

A change is confirmed live before ``grant_device``/``revoke_device`` return: every write
gives the marker account ``fedsdk-reload`` a fresh password, and we log in with it (when
the broker address is known) until the broker accepts it, i.e. has loaded this version.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from sdk_device.protocol.topics import check_name
from sdk_device.transport.blob_store import atomic_write
from sdk_device.transport.mqtt_link import BrokerAddress, probe_login

from .security import (
    PAIR_PASSWORD,
    PAIR_USERNAME,
    RESERVED_PREFIX,
    SERVER_USERNAME,
    acl_rules,
    check_device_account,
)

log = logging.getLogger(__name__)

STATE_FILE = "security.json"
PASSWD_FILE = "mosquitto.passwd"
ACL_FILE = "mosquitto.acl"
PID_FILE = "mosquitto.pid"
RELOAD_USERNAME = "fedsdk-reload"  # marker account: proves the broker loaded our last write
PBKDF2_ITERATIONS = 1000  # mosquitto_passwd uses 101; passwords here are 128-bit random anyway


def new_password() -> str:
    """A random password (128 bits, URL-safe text)."""
    return secrets.token_urlsafe(16)


def hash_password(password: str, iterations: int = PBKDF2_ITERATIONS, salt: bytes | None = None) -> str:
    """mosquitto 2.0's password-file hash: ``$7$<iterations>$<b64 salt>$<b64 PBKDF2-SHA512>``."""
    salt = salt if salt is not None else secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: str, hashed: str) -> bool:
    """True if ``password`` matches a ``$7$`` hash (as mosquitto checks it)."""
    try:
        _, kind, iterations, salt, digest = hashed.split("$")
        if kind != "7":
            return False
        expected = hashlib.pbkdf2_hmac("sha512", password.encode(), base64.b64decode(salt), int(iterations))
        return hmac.compare_digest(expected, base64.b64decode(digest))
    except ValueError:
        return False


def read_passwd(path: Path) -> dict[str, str]:
    """``{username: hash}`` of a mosquitto password file (comments and blank lines skipped)."""
    accounts: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                user, sep, hashed = line.partition(":")
                if sep:
                    accounts[user] = hashed
    return accounts


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``, readable by its owner only."""
    atomic_write(path, text.encode())


class SecurityDirError(RuntimeError):
    """The security directory is missing, incomplete, or the broker cannot be reloaded."""


class MosquittoAuthFiles:
    """``BrokerSecurity`` over mosquitto's password and ACL files (see the module docstring).

    ``broker`` (+ ``ca_file`` for mqtts) is where to confirm changes; without it a change
    is only signalled (the caller then cannot know when mosquitto has applied it).
    """

    def __init__(
        self,
        directory: str | Path,
        broker: BrokerAddress | None = None,
        ca_file: str | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        self.directory = Path(directory)
        state_path = self.directory / STATE_FILE
        if not state_path.is_file():
            raise SecurityDirError(
                f"{self.directory} is not a broker security directory (no {STATE_FILE}): "
                f"create it with `fedsdk-server security init --security-dir {self.directory} --fleet FLEET`"
            )
        self.state = json.loads(state_path.read_text())
        self.broker = broker
        self.ca_file = ca_file
        self.timeout_s = timeout_s
        self._lock = threading.Lock()

    # -- creation --------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        directory: str | Path,
        fleet: str,
        listener: dict | None = None,
        tls_dir: str | Path | None = None,
        reload_command: list[str] | None = None,
    ) -> MosquittoAuthFiles:
        """Make a security directory for ``fleet``: server and pairing accounts, no devices.

        ``listener`` is ``{"host": ..., "port": ...}`` of the broker (recorded for
        ``fedsdk-server broker`` and ``run``); ``tls_dir`` holds ``ca.pem``, ``server.pem``,
        ``server.key`` (``fedsdk-server certs init``); ``reload_command`` replaces SIGHUP
        to the pid in ``mosquitto.pid`` (e.g. ``["systemctl", "reload", "mosquitto"]``).
        """
        directory = Path(directory)
        check_name("fleet name", fleet)
        if (directory / STATE_FILE).exists():
            raise SecurityDirError(f"{directory / STATE_FILE} exists already: it holds the fleet's accounts")
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "format": 1,
            "fleet": fleet,
            "server_password": new_password(),
            "listener": listener or {"host": "127.0.0.1", "port": 1883},
            "tls_dir": str(Path(tls_dir).resolve()) if tls_dir else None,
            "reload_command": reload_command,
        }
        _write_private(directory / STATE_FILE, json.dumps(state, indent=2) + "\n")
        security = cls(directory)
        security._write({
            SERVER_USERNAME: hash_password(state["server_password"]),
            PAIR_USERNAME: hash_password(PAIR_PASSWORD),
        })
        return security

    # -- BrokerSecurity --------------------------------------------------------------------
    @property
    def fleet(self) -> str:
        return self.state["fleet"]

    def server_credentials(self) -> tuple[str, str]:
        return SERVER_USERNAME, self.state["server_password"]

    def devices(self) -> list[str]:
        """Device accounts on the broker, sorted."""
        accounts = read_passwd(self.directory / PASSWD_FILE)
        return sorted(u for u in accounts if not u.startswith(RESERVED_PREFIX))

    def grant_device(self, device_id: str, password: str) -> None:
        check_device_account(device_id)
        if not password:
            raise ValueError("a device account needs a non-empty password")
        with self._locked():
            accounts = read_passwd(self.directory / PASSWD_FILE)
            accounts[device_id] = hash_password(password)
            marker = self._write(accounts)
        self._apply(marker)
        log.info("broker account granted to device %s", device_id)

    def revoke_device(self, device_id: str) -> None:
        check_device_account(device_id)
        with self._locked():
            accounts = read_passwd(self.directory / PASSWD_FILE)
            if accounts.pop(device_id, None) is None:
                log.info("device %s had no broker account", device_id)
            marker = self._write(accounts)
        self._apply(marker)
        log.info("broker account of device %s revoked", device_id)

    # -- files and reload -----------------------------------------------------------------
    @contextmanager
    def _locked(self):
        """One writer at a time: threads of this process and other processes (flock)."""
        with self._lock, open(self.directory / ".lock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _write(self, accounts: dict[str, str]) -> str:
        """Write password and ACL files for ``accounts``; return the new marker password."""
        marker = new_password()
        accounts = {**accounts, RELOAD_USERNAME: hash_password(marker, iterations=1)}
        lines = ["# fedsdk broker accounts, managed by fedsdk-server: edits are overwritten."]
        lines += [f"{user}:{hashed}" for user, hashed in sorted(accounts.items())]
        devices = [u for u in accounts if not u.startswith(RESERVED_PREFIX)]
        # mosquitto reads both files on the next reload; each is replaced atomically.
        _write_private(self.directory / ACL_FILE, acl_rules(self.fleet, devices))
        _write_private(self.directory / PASSWD_FILE, "\n".join(lines) + "\n")
        return marker

    def reload(self) -> None:
        """Make mosquitto re-read the files: ``reload_command`` or SIGHUP to its pid file."""
        command = self.state.get("reload_command")
        if command:
            subprocess.run(command, check=True, capture_output=True, timeout=30)
            return
        pid_path = self.directory / PID_FILE
        try:
            pid = int(pid_path.read_text().strip())
            comm = Path(f"/proc/{pid}/comm")
            if comm.exists() and comm.read_text().strip() != "mosquitto":  # a stale pid, reused
                raise ProcessLookupError(f"process {pid} is {comm.read_text().strip()!r}, not mosquitto")
            os.kill(pid, signal.SIGHUP)
        except FileNotFoundError:
            raise SecurityDirError(
                f"no {pid_path}: is mosquitto running with {self.directory / 'mosquitto.conf'} "
                "(fedsdk-server broker --mosquitto --security-dir DIR)?"
            ) from None
        except (ValueError, ProcessLookupError, PermissionError) as exc:
            raise SecurityDirError(f"cannot signal mosquitto (pid file {pid_path}): {exc}") from None

    def _apply(self, marker: str) -> None:
        """Reload and, when the broker address is known, wait until the change is live."""
        self.reload()
        if self.broker is None:
            return
        deadline = time.monotonic() + self.timeout_s
        while True:
            result = probe_login(self.broker, RELOAD_USERNAME, marker, ca_file=self.ca_file,
                                 timeout_s=max(1.0, deadline - time.monotonic()))
            if result == "Success":
                return
            if time.monotonic() > deadline:
                raise SecurityDirError(
                    f"mosquitto at {self.broker.url} did not apply the new accounts within "
                    f"{self.timeout_s:.0f} s (last login probe: {result})"
                )
            time.sleep(0.05)


def running_mosquitto(directory: str | Path) -> int | None:
    """The pid of the mosquitto ``directory``'s pid file names, if that process is alive and
    is mosquitto; None otherwise (no file, a stale pid)."""
    try:
        pid = int((Path(directory) / PID_FILE).read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm == "mosquitto" else None
