"""One CLI: every option of every ``fedsdk-server`` and ``fedsdk`` command has help text, both
have ``--version``, old option spellings still parse (hidden), and ``run`` / ``simulate``
share their defaults."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from sdk_device.cli import main as device_main
from server_toolkit.cli import main as server_main


def commands(group: click.Group, path: str = ""):
    for name, command in group.commands.items():
        yield f"{path} {name}".strip(), command
        if isinstance(command, click.Group):
            yield from commands(command, f"{path} {name}")


ALL = [(f"fedsdk-server {p}", c) for p, c in commands(server_main)] + [(f"fedsdk {p}", c)
                                                                      for p, c in commands(device_main)]


@pytest.mark.parametrize(("path", "command"), ALL, ids=[p for p, _ in ALL])
def test_every_option_of_every_command_has_help_text(path, command):
    missing = [p.name for p in command.params
               if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert not missing, f"{path}: options without help: {missing}"
    assert (command.help or "").strip(), f"{path} has no description"


@pytest.mark.parametrize("cli", [server_main, device_main], ids=["fedsdk-server", "fedsdk"])
def test_both_command_lines_print_their_version(cli):
    done = CliRunner().invoke(cli, ["--version"])
    assert done.exit_code == 0 and "0." in done.output


def test_old_option_spellings_parse_but_are_not_shown():
    runner = CliRunner()
    shown = runner.invoke(server_main, ["run", "--help"]).output
    assert "--security-dir" in shown and "--broker-security" not in shown
    shown = runner.invoke(server_main, ["security", "grant", "--help"]).output
    assert "--security-dir" in shown and "--dir " not in shown
    parsed = runner.invoke(server_main, ["security", "show", "--dir", "/nonexistent-security-dir"])
    assert "/nonexistent-security-dir" in parsed.output and "No such option" not in parsed.output


def test_run_and_simulate_share_the_round_timeout_default():
    defaults = {name: {p.name: p.default for p in server_main.commands[name].params}["round_timeout"]
                for name in ("run", "simulate")}
    assert defaults["run"] == defaults["simulate"] == 300.0


def test_method_help_lists_the_registered_methods():
    shown = CliRunner().invoke(server_main, ["simulate", "--help"], terminal_width=400).output
    assert "heterofl" in shown and "fedavg" in shown


def test_devices_list_shows_last_seen_and_no_stale_online(tmp_path, monkeypatch):
    import time

    from server_toolkit.fleet.registry import FleetRegistry

    registry = FleetRegistry(tmp_path / "registry.sqlite")
    registry.add_device("pi-1")
    registry.record_hello("pi-1", {"arch": "aarch64"}, ["torch"], 100)
    registry.close()
    runner = CliRunner()
    listing = ["devices", "list", "--run-dir", str(tmp_path)]
    now = runner.invoke(server_main, listing, terminal_width=200).output
    assert "online" in now and "s ago" in now
    later = time.time() + 600  # everything stopped ten minutes ago
    monkeypatch.setattr(time, "time", lambda: later)
    stale = runner.invoke(server_main, listing, terminal_width=200).output
    assert "online" not in stale and "offline" in stale and "min ago" in stale


def test_loading_the_server_cli_does_not_import_torch():
    """Usage errors must come back at once: torch (~2 s to import) loads only when a command needs it."""
    code = "import sys, server_toolkit.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
