"""``fedsdk-server certs …`` and ``fedsdk-server security …``: TLS certificates and broker accounts."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .aliases import Aliased

console = Console()


@click.group()
def certs() -> None:
    """The fleet's certificate authority and the broker's TLS certificate."""


@certs.command("init")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where ca.pem, ca.key, server.pem, server.key go.")
@click.option("--host", "hosts", multiple=True,
              help="Name or IP address devices use to reach the broker (repeatable; "
                   "default: this host name, localhost, 127.0.0.1).")
@click.option("--new-ca", is_flag=True, help="Replace an existing CA (every paired device must re-pair).")
def certs_init(directory, hosts, new_ca) -> None:
    """Make the fleet CA (kept if it exists) and a broker certificate signed by it."""
    from ..broker.certs import default_hosts, fingerprints, init_certs, server_hosts

    hosts = list(hosts) or default_hosts()
    kept = (directory / "ca.pem").exists() and not new_ca
    files = init_certs(directory, hosts, new_ca=new_ca)
    table = Table("file", "SHA-256 fingerprint")
    for name, fingerprint in fingerprints(files).items():
        table.add_row(str(directory / name), fingerprint)
    console.print(table)
    console.print(f"CA {'kept' if kept else 'created'}; broker certificate valid for: "
                  f"{', '.join(server_hosts(files))}")
    console.print(f"keep {files.ca_key} secret (it can sign certificates devices would trust). Next: "
                  f"fedsdk-server security init --security-dir DIR --fleet FLEET --tls-dir {directory}")


@certs.command("show")
@click.option("--dir", "directory", type=click.Path(exists=True, file_okay=False, path_type=Path),
              required=True, help="The certificate directory (`certs init`).")
def certs_show(directory) -> None:
    """Print the fingerprints and the hosts of the broker certificate."""
    from ..broker.certs import CertFiles, fingerprints, server_hosts

    try:
        files = CertFiles(directory).check()
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    for name, fingerprint in fingerprints(files).items():
        console.print(f"{name}: {fingerprint}")
    console.print(f"server.pem hosts: {', '.join(server_hosts(files))}")


@click.group()
def security() -> None:
    """Broker accounts and ACL of a fleet (mosquitto password + ACL files)."""


@security.command("init")
@click.option("--security-dir", "--dir", "directory", cls=Aliased, aliases=["--dir"],
              type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The broker security directory to create.")
@click.option("--fleet", required=True, help="Fleet name (one fleet per broker).")
@click.option("--tls-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Certificates from `certs init` (default: --dir itself if it holds ca.pem).")
@click.option("--no-tls", is_flag=True, help="Plain TCP listener (loopback only unless --insecure).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address the broker listens on (0.0.0.0: every interface, for devices on other machines).")
@click.option("--port", type=int, default=None, help="Listener port (default 8883 with TLS, else 1883).")
@click.option("--reload-command", default=None,
              help="Command that makes mosquitto re-read its files, e.g. 'systemctl reload mosquitto' "
                   "(default: SIGHUP to the pid in DIR/mosquitto.pid).")
@click.option("--insecure", is_flag=True, help="Allow a plain-TCP listener on a non-loopback address.")
def security_init(directory, fleet, tls_dir, no_tls, host, port, reload_command, insecure) -> None:
    """Create the server and pairing accounts, the ACL and a mosquitto.conf using them."""
    import shlex

    from sdk_device.transport.tls import is_loopback

    from ..broker.certs import CertFiles
    from ..broker.mosquitto import mosquitto_config
    from ..broker.mosquitto_auth import MosquittoAuthFiles, SecurityDirError

    if tls_dir is None and not no_tls and (directory / "ca.pem").exists():
        tls_dir = directory
    if no_tls:
        tls_dir = None
    if tls_dir is None and not no_tls:
        raise click.ClickException(
            f"no certificates: run `fedsdk-server certs init --dir {directory}` first, pass --tls-dir, "
            "or --no-tls for a loopback-only broker")
    if tls_dir is None and not is_loopback(host) and not insecure:
        raise click.ClickException(f"a plain-TCP broker on {host} would send passwords in clear text: "
                                   "use TLS, --host 127.0.0.1, or --insecure")
    try:
        if tls_dir is not None:
            CertFiles(tls_dir).check()
        security = MosquittoAuthFiles.create(
            directory, fleet, listener={"host": host, "port": port or (8883 if tls_dir else 1883)},
            tls_dir=tls_dir, reload_command=shlex.split(reload_command) if reload_command else None)
    except (FileNotFoundError, SecurityDirError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    listener = security.state["listener"]
    conf = directory / "mosquitto.conf"
    (directory / "data").mkdir(exist_ok=True)  # mosquitto's persistence
    conf.write_text(mosquitto_config(listener["host"], listener["port"], (directory / "data").resolve(),
                                     directory.resolve(), Path(tls_dir).resolve() if tls_dir else None))
    scheme = "mqtts" if tls_dir else "mqtt"
    console.print(f"fleet {fleet}: accounts fedsdk-server, fedsdk-pair in {directory}; "
                  f"broker listens on {scheme}://{listener['host']}:{listener['port']}")
    console.print(f"start the broker:  fedsdk-server broker --mosquitto --security-dir {directory}\n"
                  f"   (or: mosquitto -c {conf})\n"
                  f"serve the fleet:   fedsdk-server run --security-dir {directory} --fleet {fleet} "
                  "--run-dir RUN_DIR ...")


@security.command("show")
@click.option("--security-dir", "--dir", "directory", cls=Aliased, aliases=["--dir"],
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              required=True, help="The broker security directory (`security init`).")
def security_show(directory) -> None:
    """Fleet, listener and accounts of a broker security directory."""
    from ..broker.mosquitto_auth import MosquittoAuthFiles, SecurityDirError

    try:
        sec = MosquittoAuthFiles(directory)
    except SecurityDirError as exc:
        raise click.ClickException(str(exc)) from None
    listener, tls_dir = sec.state["listener"], sec.state.get("tls_dir")
    transport = f"TLS, certificates in {tls_dir}" if tls_dir else "plain TCP"
    console.print(f"fleet {sec.fleet}; listener {listener['host']}:{listener['port']} ({transport})")
    console.print(f"devices with broker accounts ({len(sec.devices())}): {', '.join(sec.devices()) or '-'}")


def _security_for(directory: Path):
    """DIR's security backend, confirming changes against DIR's own broker (ClickException if
    DIR is not a security directory). ``devices revoke`` uses it too."""
    from ..broker.mosquitto_auth import SecurityDirError
    from ..broker.secured import server_connection

    try:
        return server_connection(directory)[2]
    except (SecurityDirError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None


def _change_account(directory: Path, change) -> None:
    """Run ``change(security)`` on DIR's security backend; errors become ClickExceptions."""
    from ..broker.mosquitto_auth import SecurityDirError

    security = _security_for(directory)
    try:
        change(security)
    except (SecurityDirError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@security.command("grant")
@click.option("--security-dir", "--dir", "directory", cls=Aliased, aliases=["--dir"],
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              required=True, help="The broker security directory (`security init`).")
@click.argument("device_id")
def security_grant(directory, device_id) -> None:
    """Give DEVICE_ID a broker account by hand (pairing does this for you); prints its password."""
    from ..broker.mosquitto_auth import new_password

    password = new_password()
    _change_account(directory, lambda sec: sec.grant_device(device_id, password))
    console.print(f"device {device_id}: username {device_id}, password {password} (shown once)")


@security.command("revoke")
@click.option("--security-dir", "--dir", "directory", cls=Aliased, aliases=["--dir"],
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              required=True, help="The broker security directory (`security init`).")
@click.argument("device_id")
def security_revoke(directory, device_id) -> None:
    """Delete DEVICE_ID's broker account; its live session is cut at once."""
    _change_account(directory, lambda sec: sec.revoke_device(device_id))
    console.print(f"device {device_id}: broker account removed")
