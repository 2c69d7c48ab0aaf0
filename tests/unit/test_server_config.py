"""One typed configuration (``server_toolkit/server_config.py``): ``run`` and ``simulate`` build
it once from flags and the config file, share its groups and what it builds for the round loop,
and write the ``config.json`` they always wrote. The commands' bodies are stopped right where
they hand the configuration on (the serving and the simulation are tested elsewhere)."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from server_toolkit import serve
from server_toolkit.cli import main as server_main
from server_toolkit.cli.config_build import build_config
from server_toolkit.rounds.async_loop import AsyncConfig
from server_toolkit.server_config import RunConfig, ServerConfig
from server_toolkit.sim import simulate as sim
from server_toolkit.sim.simulate import SimulationConfig

RUN_CONFIG_JSON = ["method", "model", "dataset", "fleet", "rounds", "clients_per_round", "fraction",
                   "round_timeout_s", "seed", "recipe", "method_options", "mode", "buffer", "max_staleness",
                   "concurrency", "server_lr", "eval_every", "on_divergence", "holdout"]


class Captured(Exception):
    """Raised by the stand-ins below once they hold the configuration."""


STOPPED = "stopped where the configuration is handed on"


def _capture(monkeypatch, module, name: str, error: type[Exception], on_run: bool = False) -> list:
    """Replace ``module.name`` (the class the command hands its configuration) by a stand-in
    that keeps the configuration and raises ``error`` at once (``on_run``: from ``run()``)."""
    seen = []

    class StandIn:
        report = None

        def __init__(self, config, *args, **kwargs):
            seen.append(config)
            if not on_run:
                raise error(STOPPED)

        def run(self):
            raise error(STOPPED)

    monkeypatch.setattr(module, name, StandIn)
    return seen


def test_run_builds_one_run_config_from_its_flags_and_the_config_file(tmp_path, monkeypatch):
    seen = _capture(monkeypatch, serve, "FleetServer", serve.ServeError)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fedsdk.toml").write_text('[run]\nrounds = 7\ntiers = ["1.0", "0.5"]\n'
                                          'method-option = {mu = 0.1}\n')
    done = CliRunner().invoke(server_main, ["run", "--fleet", "f", "--run-dir", "r", "--method", "fedprox",
                                            "--lr", "0.05", "--norm-bound", "0", "--dp-clip", "1",
                                            "--dp-noise-multiplier", "0.5", "--dashboard-hold", "3"])
    assert done.exit_code == 1 and STOPPED in done.output, done.output
    (config,) = seen
    assert type(config) is RunConfig and isinstance(config, ServerConfig)
    assert (config.rounds, config.tiers, config.method_options) == (7, ["1.0", "0.5"], {"mu": 0.1})
    assert config.device_recipe().lr == 0.05 and config.norm_bound is None  # 0: off
    assert config.privacy["clip"] == 1.0 and config.privacy["noise_multiplier"] == 0.5
    assert config.round_timeout_s == 300.0 and config.fleet_timeout_s == 600.0  # run's defaults
    assert config.program_formats == ["torchspec/1"] and config.pair_lockout == 300.0
    assert list(config.summary()) == RUN_CONFIG_JSON


def test_simulate_builds_a_simulation_config_that_is_the_same_server_config(tmp_path, monkeypatch):
    seen = _capture(monkeypatch, sim, "Simulation", ValueError, on_run=True)
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(server_main, ["simulate", "--run-dir", "r", "--devices", "4", "--rounds", "2",
                                            "--method", "heterofl", "--tiers", "1.0,0.5", "--mode", "async",
                                            "--local-epochs", "1"])
    assert done.exit_code == 1 and STOPPED in done.output, done.output
    (config,) = seen
    assert isinstance(config, ServerConfig) and (config.devices, config.rounds) == (4, 2)
    assert config.tiers == ["1.0", "0.5"] and config.device_recipe().epochs == 1
    assert (config.mode, config.buffer, config.server_lr) == ("async", AsyncConfig.buffer, 1.0)  # defaults
    assert config.async_settings() == AsyncConfig(buffer=AsyncConfig.buffer, server_lr=1.0)
    assert config.fleet_timeout_s == 180.0 and config.norm_bound == 10.0  # simulate's defaults
    assert SimulationConfig(**json.loads(config.to_json())) == config  # config.json loads back (--resume)


def test_run_and_simulate_hand_the_round_loop_the_same_settings():
    shared = dict(rounds=3, clients_per_round=2, round_timeout_s=30.0, seed=4, norm_bound=5.0,
                  secagg={"threshold": 0.5, "neighbours": None}, min_devices=2)
    run_loop = RunConfig(**shared).loop_config({"d1": "0.5"})
    sim_loop = SimulationConfig(**shared).loop_config({"d1": "0.5"})
    assert run_loop == sim_loop and run_loop.norm_bound is None  # secure aggregation: no update in the clear
    assert (run_loop.rounds, run_loop.min_devices, run_loop.tier_map) == (3, 2, {"d1": "0.5"})


def test_an_option_with_no_place_in_the_configuration_is_a_programming_error():
    command = server_main.commands["run"]
    ctx = command.make_context("run", ["--fleet", "f", "--run-dir", "r"])
    options = {**ctx.params, "secagg": None, "no_such_option": 1}
    for name in ("secagg_threshold", "secagg_neighbours"):  # what secagg_options turns into `secagg`
        options.pop(name)
    with pytest.raises(TypeError, match="no_such_option"):
        build_config(RunConfig, options)
    config, observe, _ = build_config(RunConfig, {k: v for k, v in options.items() if k != "no_such_option"})
    assert config.fleet == "f" and observe.dashboard_hold == 0.0


def test_the_options_run_and_simulate_share_read_alike_in_both():
    def options(name: str) -> dict[str, click.Option]:
        return {p.name: p for p in server_main.commands[name].params if isinstance(p, click.Option)}

    run, simulate = options("run"), options("simulate")
    alike = ["method", "rounds", "clients_per_round", "fraction", "over_select", "round_timeout",
             "norm_bound", "program_formats", "local_epochs", "batch_size", "lr", "max_steps", "optimizer",
             "on_divergence", "holdout", "method_options", "dp_clip", "secagg", "mode", "dashboard", "log_to",
             "config_file"]
    for name in alike:
        assert (run[name].opts, run[name].help, run[name].default) == \
            (simulate[name].opts, simulate[name].help, simulate[name].default), name
