"""``--resume``: the run's files readable (config.json, state.json, the checkpoint), and the
flags given beside it consistent with the stored configuration.

Decisions: a resumed run reuses everything it stored (method, model, dataset, devices, tiers,
recipe, seeds, partition); ``--rounds N`` is the run's *total* (it continues up to round N).
A flag given beside ``--resume`` that differs from the stored value is an error (the run
would silently ignore it otherwise); the same value, or a flag of how to watch or wait
(dashboard, logging, timeouts), is fine."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..rounds.checkpoint import CheckpointError, check_checkpoint

# simulate flag -> (config.json key, how the flag's value becomes the stored one)
STORED_AS = {"round_timeout": "round_timeout_s", "fleet_timeout": "fleet_timeout_s"}
RECIPE_KEYS = {"local_epochs": "epochs", "batch_size": "batch_size", "lr": "lr", "optimizer": "optimizer",
               "max_steps": "max_steps"}
FREE_ON_RESUME = {"rounds", "resume_dir", "resume", "run_dir", "dashboard", "dashboard_token",
                  "dashboard_hold", "log_to", "round_timeout", "fleet_timeout", "min_devices", "broker_url",
                  "device_python", "config_file"}


def read_json(path: Path, what: str) -> dict:
    """``path``'s JSON object; ClickException naming the file and what to do otherwise."""
    if not path.is_file():
        raise click.ClickException(f"{path} is missing: {what}")
    try:
        body = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{path} is damaged ({exc}): {what}") from None
    if not isinstance(body, dict):
        raise click.ClickException(f"{path} is not a JSON object: {what}")
    return body


def stored_value(name: str, value: object, config: dict) -> tuple[str, object, object] | None:
    """(config key, the flag's value as stored, the stored value) when flag ``name`` maps to config.json."""
    if name in RECIPE_KEYS:
        stored = (config.get("recipe") or {}).get(RECIPE_KEYS[name])
        if name == "max_steps" and stored is None:  # a recipe leaves max_steps out when 0 (no bound)
            stored = 0
        return RECIPE_KEYS[name], value, stored
    key = STORED_AS.get(name, name)
    if key not in config:
        return None
    if name == "tiers":
        value = [t.strip() for t in value.split(",")] if value else None
    elif name == "program_formats":
        value = [f.strip() for f in value.split(",")]
    elif name == "method_options":
        from .options import parse_options

        value = parse_options(value)
    elif name == "norm_bound":
        value = value or None
    return key, value, config[key]


def validate(params: dict) -> None:
    """Check a ``--resume``'s files and flags (nothing to do for a new run)."""
    if params["_command"] == "simulate":
        run_dir = params.get("resume_dir")
    else:
        run_dir = params.get("run_dir") if params.get("resume") else None
    if run_dir is None:
        return
    fix = "restore it from a backup, or start a new run"
    config = read_json(run_dir / "config.json", f"{run_dir} is not a run directory to resume; {fix}")
    if (run_dir / "state.json").exists():
        state = read_json(run_dir / "state.json", f"the run's round state is damaged; {fix}")
        try:
            check_checkpoint(run_dir, state)
        except CheckpointError as exc:
            raise click.ClickException(str(exc)) from None
        done = int(state.get("round", 0))
    else:
        done = 0
    for name in sorted(params["_given"] - FREE_ON_RESUME):
        found = stored_value(name, params[name], config)
        if found is None:
            continue
        key, given, stored = found
        if given != stored and not (name == "method" and _same_method(given, stored)):
            raise click.UsageError(
                f"--resume {run_dir} keeps its stored configuration: {_flag(name)} {params[name]} "
                f"differs from the stored {key}={json.dumps(stored)}; drop the flag, or start a new run")
    total = max(int(config.get("rounds", 0)), params.get("rounds") or 0)
    click.echo(f"resuming {run_dir} after round {done}: its stored method, model, dataset, devices, tiers, "
               f"recipe and seeds are reused; it runs up to round {total} (--rounds is the total)", err=True)


def _same_method(given: str, stored: str) -> bool:
    from ..methods import canonical_name

    return canonical_name(given) == canonical_name(stored)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
