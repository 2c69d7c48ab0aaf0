"""``fedsdk pair``, ``fedsdk status``, ``fedsdk unpair``: a device joins and leaves a fleet."""

from __future__ import annotations

import json
import secrets
import socket
import sys
import time
from pathlib import Path

import click
from rich.console import Console

from . import device_config
from .device_config import DeviceConfig

console = Console(highlight=False, soft_wrap=True)
SERVICE_UNIT = Path("/etc/systemd/system/fedsdk-agent.service")


def _ok(text: str) -> None:
    console.print(f"[green]✓[/] {text}")


def _fail(err) -> None:
    """Print a PairingError and exit with its code."""
    console.print(f"[red]✗ {err}[/]")
    sys.exit(err.exit_code)


@click.command()
@click.option(
    "--server",
    "server_url",
    required=True,
    metavar="URL",
    help="The fleet's broker: mqtts://HOST:8883 (or mqtt://127.0.0.1:1883 on this machine).",
)
@click.option("--code", prompt="Pairing code (from `fedsdk-server pair-code`)", help="The one-time code.")
@click.option("--name", default=None, help="This device's name in the fleet (default: the host name).")
@click.option(
    "--data",
    "data_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Local training data (.npz with x, y); stored for `fedsdk run`.",
)
@click.option("--ca-fingerprint", help="sha256:… of the server's CA, as `pair-code` prints it (mqtts).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="The server's CA file (mqtts).")
@click.option(
    "--insecure", is_flag=True, help="Allow plain mqtt:// to another machine (trusted network only)."
)
@click.option(
    "--runtime", "runtimes", multiple=True, help="Benchmark only these runtimes (default: all here)."
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The agent's blob cache (default: $XDG_STATE_HOME/fedsdk/work, or $FEDSDK_CONFIG_DIR/work).",
)
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for each server answer.")
@click.option("--force", is_flag=True, help="Pair again even if this device is already paired.")
@device_config.config_dir_option
def pair(
    server_url, code, name, data_path, ca_fingerprint, ca_file, insecure, runtimes, work_dir, timeout, force
) -> None:
    """Join a fleet with a one-time code: profile this device, get its own credentials and tier.

    Exit codes: 0 paired; 3 broker unreachable; 4 TLS trust failure; 5 pairing account refused;
    6 no server answered; 7 wrong code; 8 expired code; 9 code already used; 10 pairing locked;
    11 plain TCP to a remote host without --insecure; 12 no training runtime here.
    """
    from .bench_cli import load_data_option
    from .pairing import PairClient, PairingError
    from .profile import device_profile
    from .runtimes.registry import available_runtimes, evaluation_only

    existing = _load_config()
    if existing and not force:
        raise click.ClickException(
            f"this device is already paired as {existing.device_id!r} in fleet {existing.fleet!r} "
            f"({device_config.config_dir() / device_config.CONFIG_FILE}). Run `fedsdk unpair` first, "
            "pass --force to replace that pairing, or give this device a directory of its own with "
            "--config-dir DIR (several devices on one host: one directory each)."
        )
    name = name or socket.gethostname() or "device"
    x, y = load_data_option(data_path)
    here = [r for r in available_runtimes() if r not in evaluation_only()]
    here = [r for r in here if not runtimes or r in runtimes]
    if not here:
        _fail(
            PairingError(
                "no_runtime",
                "no training runtime is installed here: "
                "pip install 'fedsdk[torch]' (or an ExecuTorch / ONNX Runtime build)",
            )
        )
    profile = device_profile(here)
    profile["num_samples"] = len(y) if y is not None else None
    console.print(f"[bold]fedsdk pair[/] → {server_url} as [bold]{name}[/]")
    console.print(
        f"  this device: {profile.get('board') or profile['arch']}, {profile.get('cpu_model') or '?'}, "
        f"{profile['cpu_count']} cores, {_mb(profile['memory_mb'])} RAM "
        f"({_mb(profile['memory_available_mb'])} free), {profile['os']}, Python {profile['python']}, "
        f"runtimes: {', '.join(here)}"
    )

    def benchmark(offer, models, fetch) -> dict:
        return _benchmark(offer, models, fetch, x, y, list(runtimes) or None, profile["memory_available_mb"])

    try:
        with PairClient(
            server_url,
            ca_file=ca_file,
            ca_fingerprint=ca_fingerprint,
            insecure=insecure,
            timeout_s=timeout,
            say=_ok,
        ) as client:
            with console.status("pairing…"):
                accept = client.pair(code, name, profile, benchmark)
            ca_pem = accept.ca_pem or client.ca_pem
    except PairingError as err:
        _fail(err)
    directory = device_config.ensure_dir(device_config.config_dir())
    stored_ca = None
    if ca_pem:
        stored_ca = str(device_config.write_private(directory / device_config.CA_FILE, ca_pem))
    config = DeviceConfig(
        broker_url=client.url,
        fleet=accept.fleet,
        device_id=accept.device_id,
        username=accept.username,
        password=accept.password,
        name=name,
        tier=accept.tier,
        tier_reason=accept.tier_reason,
        ca_file=stored_ca,
        data_path=str(data_path.resolve()) if data_path else None,
        work_dir=str(work_dir.resolve() if work_dir else device_config.default_work_dir()),
        insecure=insecure,
        paired_at=time.time(),
        client_id=f"fedsdk-dev-{accept.device_id}-{secrets.token_hex(8)}",
    )
    path = config.save(directory)
    _ok(
        f"paired as [bold]{accept.device_id}[/] in fleet [bold]{accept.fleet}[/]"
        + (f", tier [bold]{accept.tier}[/]" if accept.tier is not None else "")
    )
    if accept.tier_reason:
        console.print(f"  {accept.tier_reason}")
    console.print(f"  configuration saved to {path} (mode 600)")
    given = click.get_current_context().meta.get(device_config.OPTION_GIVEN)
    start = "fedsdk run" + (f" --config-dir {directory}" if given else "")
    start += "" if data_path else " --data YOUR_DATA.npz"
    console.print(f"\nStart training with:  [bold]{start}[/]")
    if SERVICE_UNIT.exists():  # installed by firmware_scripts/install-device.sh
        console.print("or run it as the installed service:  [bold]sudo systemctl start fedsdk-agent[/]")


def _benchmark(offer, models: dict, fetch, x, y, allowed, available_mb: float | None = None) -> dict:
    """Time a training step of each offered model (smallest first) on each runtime here; a
    model whose estimated training memory exceeds ``available_mb`` is skipped, not tried."""
    from fedcore.modelspec import loads
    from fedcore.recipe import Recipe

    from .benchmark import bench_programs, trainable
    from .profile import peak_rss_mb
    from .protocol.blobs import decode_tensors

    recipe = Recipe.from_dict(offer.recipe)
    console.print(
        f"  timing a training step (batch {recipe.batch_size}, {recipe.optimizer}) of the fleet's "
        f"model{'s' if len(models) > 1 else ''} on each runtime:"
    )
    tiers, base_mb, shape_checked = {}, 0.0, False
    for name, model in sorted(models.items(), key=lambda kv: kv[1].train_memory_mb or 0.0):
        label = f"tier {name}" if name else "model"
        if available_mb and model.train_memory_mb and model.train_memory_mb > available_mb:
            console.print(
                f"    {label:<10} skipped: needs ~{model.train_memory_mb:.0f} MB, {available_mb:.0f} MB free"
            )
            tiers[name] = {"runtimes": [], "skipped": "memory"}
            continue
        wanted = {"torchspec/1", *trainable(model.programs, allowed).values()}
        programs = {fmt: fetch(ref) for fmt, ref in model.programs.items() if fmt in wanted}
        spec = loads(programs["torchspec/1"])
        if x is not None and not shape_checked and tuple(x.shape[1:]) != tuple(spec["input_shape"]):
            console.print(
                f"[yellow]! your data's samples have shape {tuple(x.shape[1:])} but the fleet's "
                f"model takes {tuple(spec['input_shape'])}: training will fail until the data fits[/]"
            )
        shape_checked = True

        def on_runtime(runtime, row, label=label) -> None:
            if row is None:
                return
            if row.ms_per_step is not None:
                console.print(f"    {label:<10} {runtime:<12} {row.ms_per_step:8.1f} ms per step")
            else:
                console.print(f"    {label:<10} {runtime:<12} [yellow]failed: {row.error}[/]")

        out = bench_programs(
            programs,
            decode_tensors(fetch(model.weights)),
            recipe,
            x,
            y,
            allowed=allowed,
            on_runtime=on_runtime,
        )
        tiers[name] = {"runtimes": out["runtimes"]}
        base_mb = max(base_mb, out["base_rss_mb"])
    return {
        "tiers": tiers,
        "batch_size": recipe.batch_size,
        "steps": 5,
        "base_rss_mb": base_mb,
        "peak_rss_mb": peak_rss_mb(),
        "measured_at": time.time(),
    }


def _mb(value) -> str:
    if not value:
        return "?"
    return f"{value / 1024:.1f} GB" if value >= 1024 else f"{value:.0f} MB"


def _load_config() -> DeviceConfig | None:
    try:
        return DeviceConfig.load()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for the broker.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@device_config.config_dir_option
def status(timeout, as_json) -> None:
    """Is this device paired, is its server reachable, what did it do last?

    Exit code 0 when paired and the broker accepts the device's credentials, 1 when not
    paired, 3 when the broker cannot be reached or refuses the device.
    """
    config = _load_config()
    where = device_config.config_dir() / device_config.CONFIG_FILE
    if config is None:
        if as_json:
            click.echo(json.dumps({"paired": False, "config": str(where)}))
        else:
            console.print(
                f"not paired (no {where}). Pair with: fedsdk pair --server mqtts://HOST:8883 --code CODE"
            )
        sys.exit(1)
    reach = _check_server(config, timeout)
    last = _last_task(Path(config.work_dir))
    info = {
        "paired": True,
        "config": str(where),
        "device_id": config.device_id,
        "fleet": config.fleet,
        "tier": config.tier,
        "broker_url": config.broker_url,
        "paired_at": config.paired_at,
        "data_path": config.data_path,
        "work_dir": config.work_dir,
        **reach,
        "last_task": last,
    }
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        tier = f", tier {config.tier}" if config.tier is not None else ""
        console.print(
            f"paired: [bold]{config.device_id}[/] in fleet [bold]{config.fleet}[/]{tier} "
            f"(since {time.strftime('%Y-%m-%d %H:%M', time.localtime(config.paired_at))})"
        )
        if reach["reachable"]:
            server = {"online": "[green]online[/]", "offline": "[yellow]offline[/]"}.get(
                reach["server_status"], "[yellow]unknown (never seen)[/]"
            )
            console.print(
                f"broker: {config.broker_url} reachable, credentials accepted; fleet server {server}"
            )
        else:
            console.print(f"broker: {config.broker_url} [red]{reach['error']}[/]")
        if last:
            console.print(f"last task: round {last['round']} ({_ago(last['received_at'])})")
        else:
            console.print("last task: none yet (is `fedsdk run` running?)")
        console.print(f"data: {config.data_path or '- (pass --data to fedsdk run)'}; config: {where}")
    sys.exit(0 if reach["reachable"] else 3)


def _check_server(config: DeviceConfig, timeout_s: float) -> dict:
    """Connect with the device's own credentials and read the fleet server's retained status."""
    import secrets
    import threading

    from .protocol.topics import FleetTopics
    from .transport.mqtt_link import BrokerAddress, MqttLink

    topics = FleetTopics(config.fleet)
    seen: dict[str, str] = {}
    arrived = threading.Event()

    def on_message(topic: str, payload: bytes) -> None:
        seen["status"] = payload.decode("utf-8", "replace")
        arrived.set()

    link = MqttLink(
        BrokerAddress.parse(config.broker_url),
        f"fedsdk-status-{secrets.token_hex(6)}",
        on_message,
        subscriptions=[topics.server_status],
        username=config.username,
        password=config.password,
        ca_file=config.ca_file,
        clean_session=True,
        insecure=config.insecure,
    )
    try:
        link.connect(timeout_s)
    except ConnectionError as exc:
        from .pairing import explain_connect_error

        return {
            "reachable": False,
            "server_status": None,
            "error": str(explain_connect_error(exc, config.broker_url)),
        }
    try:
        arrived.wait(timeout_s)
    finally:
        link.close()
    return {"reachable": True, "server_status": seen.get("status"), "error": None}


def _last_task(work_dir: Path) -> dict | None:
    from .protocol import messages as msgs

    path = work_dir / "last_task.json"
    if not path.is_file():
        return None
    try:
        task = msgs.decode(path.read_bytes())
    except ValueError:
        return None
    return {"round": task.round, "task_id": task.task_id, "received_at": path.stat().st_mtime}


def _ago(t: float) -> str:
    s = max(0, time.time() - t)
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.1f} h ago"


@click.command()
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for the server.")
@device_config.config_dir_option
def unpair(yes, timeout) -> None:
    """Leave the fleet: ask the server to revoke this device (if reachable), delete the local config."""
    from .pairing import PairClient, PairingError

    config = _load_config()
    if config is None:
        console.print("not paired: nothing to do")
        return
    if not yes:
        click.confirm(
            f"Unpair {config.device_id!r} from fleet {config.fleet!r}? Its credentials stop working",
            abort=True,
        )
    try:
        with PairClient(
            config.broker_url, ca_file=config.ca_file, insecure=config.insecure, timeout_s=timeout
        ) as client:
            client.unpair(config.device_id, config.password)
        _ok(f"the server revoked {config.device_id}")
    except PairingError as err:
        console.print(
            f"[yellow]! the server did not confirm ({err}).\n  Its operator can revoke the device "
            f"with: fedsdk-server devices revoke {config.device_id} --run-dir RUN_DIR[/]"
        )
    for path in device_config.forget():
        _ok(f"deleted {path}")
