"""The paired device's stored configuration: ``<config dir>/device.json`` (mode 0600).

Where: the ``--config-dir`` option of ``fedsdk pair/run/status/unpair`` when given, else
``$FEDSDK_CONFIG_DIR`` when set (services), else ``$XDG_CONFIG_HOME/fedsdk``, else
``~/.config/fedsdk``. One directory holds one paired device: several devices on one host
each use their own directory. The directory is created 0700. It also holds ``ca.pem`` (the CA
the server handed over at pairing). The agent's work directory (blob cache) defaults to
``<config dir>/work`` with ``--config-dir`` or ``$FEDSDK_CONFIG_DIR``, else ``$XDG_STATE_HOME/fedsdk/work``
(``~/.local/state/fedsdk/work``). The file holds the device's broker password: it is written
0600 and ``load`` warns when someone loosened that.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import click

from .transport.blob_store import atomic_write

log = logging.getLogger(__name__)

ENV_DIR = "FEDSDK_CONFIG_DIR"
CONFIG_FILE = "device.json"
CA_FILE = "ca.pem"
OPTION_GIVEN = "fedsdk.config_dir_given"


def config_dir() -> Path:
    """Where this user's fedsdk device configuration lives (see the module docstring)."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "fedsdk"


def _use_config_dir(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """``--config-dir`` wins over ``$FEDSDK_CONFIG_DIR``: it sets the variable for this process
    (and so for the default work dir and any child process); ``ctx.meta[OPTION_GIVEN]`` says
    it was given (``fedsdk pair`` then repeats it in the command it prints)."""
    if value is not None:
        os.environ[ENV_DIR] = str(value.expanduser().resolve())
        ctx.meta[OPTION_GIVEN] = True
    return value


config_dir_option = click.option(
    "--config-dir", type=click.Path(file_okay=False, path_type=Path), default=None, expose_value=False,
    is_eager=True, callback=_use_config_dir,
    help="This device's configuration directory (default: $FEDSDK_CONFIG_DIR, else ~/.config/fedsdk). "
         "One directory per device: several devices on one host each pair with their own.")


def default_work_dir() -> Path:
    """The agent's default blob cache (see the module docstring)."""
    if os.environ.get(ENV_DIR):
        return config_dir() / "work"
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "fedsdk" / "work"


@dataclass
class DeviceConfig:
    """What ``fedsdk pair`` received and ``fedsdk run`` needs."""

    broker_url: str
    fleet: str
    device_id: str
    username: str
    password: str
    name: str = ""
    tier: str | None = None
    tier_reason: str = ""
    ca_file: str | None = None  # absolute path (the stored ca.pem, or the file the user gave)
    data_path: str | None = None
    work_dir: str = ""
    insecure: bool = False  # plain mqtt:// to a non-loopback broker was allowed at pairing
    paired_at: float = 0.0
    # The MQTT client id, with a random part: the public pairing account could otherwise
    # connect with a device's guessable id and knock the device off the broker (a broker
    # lets a new connection take over an existing client id). Empty: the default id.
    client_id: str = ""

    def save(self, directory: Path | None = None) -> Path:
        """Write ``device.json`` (0600, atomically) in ``directory``; returns its path."""
        directory = ensure_dir(directory or config_dir())
        return write_private(directory / CONFIG_FILE, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path | None = None) -> DeviceConfig | None:
        """The stored configuration, or None when this device is not paired."""
        path = (directory or config_dir()) / CONFIG_FILE
        if not path.is_file():
            return None
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning(
                "%s is readable by others (mode %o): it holds the broker password; chmod 600 it", path, mode
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}): pair again or fix it") from None
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise ValueError(f"{path} lacks a field ({exc}): pair again") from None


def ensure_dir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return directory


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600 (never world-readable, even briefly)."""
    atomic_write(path, text.encode())
    return path


def forget(directory: Path | None = None) -> list[Path]:
    """Delete the stored configuration and CA; returns the files removed."""
    directory = directory or config_dir()
    removed = []
    for name in (CONFIG_FILE, CA_FILE):
        path = directory / name
        if path.exists():
            path.unlink()
            removed.append(path)
    return removed
