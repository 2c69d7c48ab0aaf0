"""``fedsdk-server pair-code`` and ``fedsdk-server devices show|revoke|retier``; the pairing
options of ``fedsdk-server run``."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .fleet_options import fleet_options, open_fleet
from .options import kernels_option, programs_option

console = Console(highlight=False, soft_wrap=True)


def parse_duration(text: str) -> float:
    """``"90"``/``"90s"``, ``"10m"``, ``"2h"``, ``"1d"`` -> seconds; ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 10m, 2h)")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def _duration(ctx, param, value):
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def parse_tiers(text: str | None) -> list[str]:
    """``"1.0,0.5"`` -> ``["1.0", "0.5"]`` (empty: no tiers)."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def pairing_options(f):
    """The options ``fedsdk-server run`` takes for pairing and tiers."""
    for opt in reversed(
        [
            click.option(
                "--tiers",
                default=None,
                help="Tiers new devices are assigned from (by measured memory and step time), e.g. "
                "1.0,0.5,0.25 (width methods) or 1,2,3 (exit methods). Default: no tiers.",
            ),
            programs_option,
            kernels_option,
            click.option(
                "--device-url",
                default=None,
                help="The broker URL devices use (default: --broker, or the broker certificate's host name).",
            ),
            click.option(
                "--pair-max-failures",
                default=5,
                show_default=True,
                help="Wrong pairing codes that lock pairing (within --pair-lockout).",
            ),
            click.option(
                "--pair-lockout",
                default="5m",
                show_default=True,
                callback=_duration,
                help="How long pairing stays locked after too many wrong codes.",
            ),
        ]
    ):
        f = opt(f)
    return f


def _server_running(info) -> bool | None:
    """Whether the `run` process that wrote ``info`` is alive (None: another host, cannot tell)."""
    if not info.server_pid or info.server_host != socket.gethostname():
        return None
    try:
        os.kill(info.server_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@click.command("pair-code")
@fleet_options
@click.option(
    "--ttl",
    default="10m",
    show_default=True,
    callback=_duration,
    help="How long the code stays valid (e.g. 90s, 10m, 2h).",
)
@click.option(
    "--tier",
    default="auto",
    show_default=True,
    help="auto (from the device's measured profile) or a tier name of the fleet.",
)
@click.option(
    "--server",
    "server_url",
    default=None,
    help="The broker URL the device should use (default: the one `run` serves).",
)
@click.option("--count", default=1, show_default=True, help="How many codes (one per device).")
def pair_code(run_dir, security_dir, ttl, tier, server_url, count) -> None:
    """Make one-time pairing codes and print the exact command to type on the device.

    The fleet is found by --security-dir (its broker security directory) or by --run-dir (a
    run directory of it); a device paired once belongs to every later run of the fleet."""
    from sdk_device.transport.mqtt_link import BrokerAddress
    from sdk_device.transport.tls import certificate_fingerprint, is_loopback

    from ..fleet.pair_codes import LockoutPolicy, PairCodes

    fleet = open_fleet(run_dir, security_dir, must_exist=False)
    info = fleet.info
    serve = f"--security-dir {fleet.security_dir}" if fleet.security_dir else f"--run-dir {run_dir}"
    if info is None and not server_url:
        raise click.ClickException(
            f"`fedsdk-server run {serve}` has not served yet, so the fleet's "
            "broker is unknown: start it first (or pass --server URL)"
        )
    tier_name = None if tier == "auto" else tier
    if tier_name is not None and info is not None and tier_name not in info.tiers:
        known = ", ".join(info.tiers) or "none (the fleet has no --tiers)"
        raise click.ClickException(f"tier {tier_name!r} is not one of the fleet's tiers: {known}")
    try:
        url = BrokerAddress.parse(server_url or info.broker_url).url
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    address = BrokerAddress.parse(url)
    policy = LockoutPolicy(**info.lockout) if info and info.lockout else None
    codes = PairCodes(fleet.members, fleet.home, policy)
    trust = ""
    if address.tls and info is not None and info.ca_file:
        trust = f" --ca-fingerprint {certificate_fingerprint(Path(info.ca_file).read_text())}"
    insecure = " --insecure" if not address.tls and not is_loopback(address.host) else ""
    for _ in range(count):
        code, expires_at = codes.issue(ttl, tier_name)
        until = time.strftime("%H:%M", time.localtime(expires_at))
        console.print(f"pairing code [bold]{code}[/]  (single use, valid until {until}; tier: {tier})")
        console.print("on the device, run:")
        console.print(f"  [bold]fedsdk pair --server {url}{trust} --code {code}[/]", soft_wrap=True)
    console.print("  (add --data FILE.npz to store the device's training data, --name NAME to name it)")
    if insecure:
        console.print(
            f"[yellow]! {url} is plain TCP: the device must add --insecure, and its code and password "
            "cross the network in clear. Prefer TLS (fedsdk-server certs init).[/]"
        )
    if is_loopback(address.host):
        console.print(
            f"[yellow]! {address.host} is this machine: a device elsewhere needs this server's "
            "address (--server here, or `run --device-url`).[/]"
        )
    locked = codes.locked_until()
    fleet.close()
    if locked:
        console.print(
            f"[yellow]! pairing is locked after wrong codes until "
            f"{time.strftime('%H:%M:%S', time.localtime(locked))}[/]"
        )
    if info is not None and _server_running(info) is False:
        console.print(
            f"[yellow]! `fedsdk-server run {serve}` is not running: start it, "
            "the device pairs through it[/]"
        )


@click.command("show")
@fleet_options
@click.argument("device_id")
def devices_show(run_dir, security_dir, device_id) -> None:
    """Everything known of one device, and why it has its tier (updates accepted: with --run-dir)."""
    fleet = open_fleet(run_dir, security_dir)
    registry = fleet.members
    d = registry.device(device_id)
    if d is None:
        raise click.ClickException(f"no device {device_id!r} in the fleet at {fleet.home}")

    def when(t):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"

    profile = d["pair_profile"] or d["profile"] or {}
    facts = Table(show_header=False, box=None)
    for label, value in [
        ("device", f"{d['device_id']} (name {d['name']})"),
        ("status", d["status"] + (f", revoked {when(d['revoked_at'])}" if d["revoked"] else "")),
        ("tier", d["tier"] if d["tier"] is not None else "- (full model)"),
        ("paired", when(d.get("paired_at"))),
        ("last seen", when(d["last_seen"])),
        ("board / cpu", f"{profile.get('board') or '-'} / {profile.get('cpu_model') or '-'}"),
        ("arch, cores", f"{profile.get('arch', '-')}, {profile.get('cpu_count', '-')}"),
        ("memory", _memory(profile)),
        ("os, python", f"{profile.get('os', '-')}, {profile.get('python', '-')}"),
        ("runtimes", ", ".join(d["runtimes"] or profile.get("runtimes") or []) or "-"),
        ("samples", str(d["num_samples"] or profile.get("num_samples") or "-")),
        ("updates accepted", str(registry.count_device_updates(device_id))
         if hasattr(registry, "count_device_updates") else "- (give --run-dir)"),
    ]:
        facts.add_row(f"[bold]{label}[/]", value)
    console.print(facts)
    bench = profile.get("bench") or {}
    if bench.get("tiers"):
        table = Table(
            "tier",
            "runtime",
            "format",
            "ms per step",
            "note",
            title=f"training steps timed at pairing (batch {bench.get('batch_size')})",
        )
        for tier, entry in bench["tiers"].items():
            if entry.get("skipped"):
                table.add_row(tier or "-", "-", "-", "-", f"skipped ({entry['skipped']})")
            for r in entry.get("runtimes", []):
                ms = f"{r['ms_per_step']:.1f}" if r.get("ms_per_step") is not None else "-"
                table.add_row(tier or "-", r["runtime"], r["format"], ms, r.get("error", ""))
        console.print(table)
    _print_reason(d["tier_reason"])


def _memory(profile: dict) -> str:
    total, free = profile.get("memory_mb"), profile.get("memory_available_mb")
    if not total:
        return "-"
    return f"{total:.0f} MB" + (f" ({free:.0f} MB available at pairing)" if free else "")


def _print_reason(reason: dict | None) -> None:
    if not reason:
        console.print("tier decision: none recorded (registered by hand)")
        return
    console.print(
        f"[bold]tier decision[/] ({reason.get('mode')}): {reason.get('summary') or reason.get('note', '')}"
    )
    if reason.get("mode") != "auto":
        return
    budget = reason.get("memory_budget_mb")
    console.print(
        f"  memory budget {budget:.0f} MB ({reason['memory_available_mb']:.0f} MB available x share)"
        if budget
        else "  memory budget: unknown (the device did not report its memory)"
    )
    console.print(
        f"  time budget {reason['time_budget_s']:.0f} s of local training per round; "
        f"{reason['steps_per_round']} steps per round ({reason['samples']} samples"
        f"{' assumed' if reason['samples_assumed'] else ''})"
    )
    table = Table("tier", "params", "MFLOPs", "memory MB", "step ms", "round s", "fits")
    notes = []
    for r in reason["tiers"]:
        name = r["tier"] if r["tier"] is not None else "full"
        fits = (
            "yes"
            if r["fits_memory"] and r["fits_time"]
            else "no: memory"
            if not r["fits_memory"]
            else "no: time"
        )
        step = "-"
        if r["step_ms"] is not None:
            scaled = r.get("step_source") not in (None, "measured")
            step = f"{r['step_ms']:.1f}{'*' if scaled else ''} {r.get('runtime') or ''}".strip()
            if scaled:
                notes.append(f"* tier {name}: not timed on the device; step {r['step_source']} by FLOPs")
        table.add_row(
            f"{name}{' ←' if r['tier'] == reason['tier'] else ''}",
            f"{r['params']:,}",
            f"{r['mflops']:.2f}",
            f"{r['memory_mb']:.0f}",
            step,
            f"{r['round_s']:.1f}" if r["round_s"] is not None else "-",
            fits,
        )
    console.print(table)
    for note in notes:
        console.print(note)


@click.command("revoke")
@fleet_options
@click.argument("device_id")
def devices_revoke(run_dir, security_dir, device_id) -> None:
    """Revoke a device: its broker account is deleted (its session is cut) and the server refuses it."""
    fleet = open_fleet(run_dir, security_dir)
    registry = fleet.members
    if registry.device(device_id) is None:
        raise click.ClickException(f"no device {device_id!r} in the fleet at {fleet.home}")
    if fleet.security_dir is not None:
        from .security import _security_for

        _security_for(fleet.security_dir).revoke_device(device_id)
        console.print(f"broker account of {device_id} deleted (live session cut)")
    else:
        console.print(
            "[yellow]! no broker security directory: only the registry refuses the device "
            "(the broker enforces no accounts)[/]"
        )
    registry.revoke(device_id)
    fleet.close()
    console.print(f"{device_id} revoked: the server refuses it from now on")


@click.command("retier")
@fleet_options
@click.argument("device_id")
@click.argument("tier")
def devices_retier(run_dir, security_dir, device_id, tier) -> None:
    """Set a device's tier (a tier name, or "auto" to decide again from its pairing profile).
    It applies from the next round."""
    fleet = open_fleet(run_dir, security_dir)
    registry, info = fleet.members, fleet.info
    d = registry.device(device_id)
    if d is None:
        raise click.ClickException(f"no device {device_id!r} in the fleet at {fleet.home}")
    if tier == "auto":
        if info is None or not d["pair_profile"]:
            raise click.ClickException(
                "auto needs the device's pairing profile and the fleet's tiers "
                "(from `fedsdk-server run`); give a tier name instead"
            )
        choice = info.choose_tier(d["pair_profile"])
        new_tier, reason = choice.tier, choice.reason
    else:
        if info is not None and info.tiers and tier not in info.tiers:
            raise click.ClickException(
                f"tier {tier!r} is not one of the fleet's tiers: {', '.join(info.tiers)}"
            )
        new_tier, reason = (
            tier,
            {"mode": "manual", "tier": tier, "note": "set with `fedsdk-server devices retier`"},
        )
    registry.set_tier(device_id, new_tier, reason)
    fleet.close()
    console.print(
        f"{device_id}: tier {d['tier'] or '-'} -> {new_tier or '- (full model)'} (from its next round)"
    )
    _print_reason(reason)
