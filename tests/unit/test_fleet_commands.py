"""`pair-code` and `devices …` find a fleet by its security directory or by a run directory
of it, and work on the fleet's file there (server_toolkit/cli/fleet_options.py)."""

from __future__ import annotations

from click.testing import CliRunner

from server_toolkit.broker.mosquitto_auth import MosquittoAuthFiles
from server_toolkit.cli import main
from server_toolkit.fleet.fleet_info import FleetInfo


def test_devices_added_to_the_security_directory_are_listed_from_any_run_of_the_fleet(tmp_path):
    runner = CliRunner()
    MosquittoAuthFiles.create(tmp_path / "sec", "lab")
    added = runner.invoke(main, ["devices", "add", "--security-dir", str(tmp_path / "sec"), "a", "b"])
    assert added.exit_code == 0, added.output
    assert (tmp_path / "sec" / "fleet.sqlite").is_file()
    for run in ("run1", "run2"):  # what `run --security-dir sec` writes in each run directory
        FleetInfo(fleet="lab", broker_url="mqtt://127.0.0.1:1883",
                  security_dir=str(tmp_path / "sec")).save(tmp_path / run)
        listed = runner.invoke(main, ["devices", "list", "--run-dir", str(tmp_path / run)])
        assert listed.exit_code == 0 and "a " in listed.output and "b " in listed.output, listed.output
    retiered = runner.invoke(main, ["devices", "retier", "--run-dir", str(tmp_path / "run2"), "a", "0.5"])
    assert retiered.exit_code == 0, retiered.output
    shown = runner.invoke(main, ["devices", "show", "--security-dir", str(tmp_path / "sec"), "a"])
    assert shown.exit_code == 0 and "0.5" in shown.output and "give --run-dir" in shown.output, shown.output
    assert not (tmp_path / "run1" / "registry.sqlite").exists()  # nothing of the fleet went to a run


def test_a_pairing_code_is_made_for_the_fleet_with_its_key_in_the_security_directory(tmp_path):
    MosquittoAuthFiles.create(tmp_path / "sec", "lab")
    made = CliRunner().invoke(main, ["pair-code", "--security-dir", str(tmp_path / "sec"),
                                     "--server", "mqtt://127.0.0.1:1883"])
    assert made.exit_code == 0, made.output
    assert "fedsdk pair --server mqtt://127.0.0.1:1883 --code " in made.output
    assert (tmp_path / "sec" / "pairing.key").is_file()


def test_a_fleet_command_without_its_fleet_or_with_a_wrong_directory_says_so_in_one_line(tmp_path):
    runner = CliRunner()
    neither = runner.invoke(main, ["devices", "list"])
    assert neither.exit_code == 2 and "give the fleet's --security-dir" in neither.output
    (tmp_path / "plain").mkdir()
    wrong = runner.invoke(main, ["devices", "list", "--security-dir", str(tmp_path / "plain")])
    assert wrong.exit_code == 1 and "is not a broker security directory" in wrong.output
    MosquittoAuthFiles.create(tmp_path / "sec", "lab")
    empty = runner.invoke(main, ["devices", "show", "--security-dir", str(tmp_path / "sec"), "x"])
    assert empty.exit_code == 1 and "no fleet registry at" in empty.output
