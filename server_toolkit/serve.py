"""Serving a real fleet from a ``RunConfig`` (``fedsdk-server run``'s body): the server assembly,
the broker (embedded, external or secured), the fleet's registry and endpoint, the round loop of
the run's mode with its aggregation stack, and pairing while the rounds run.

Three steps, so that the command can open its observers and progress display in between:
``FleetServer(config)`` assembles (bad input: ``ServeError``), ``connect()`` reaches the broker
and opens the registry, ``prepare(observers)`` writes ``config.json`` and builds the loop,
``serve()`` runs it and, however it ends, closes everything and writes the summary.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .server_config import RunConfig


class ServeError(Exception):
    """A one-line reason the run cannot start or go on (bad input, the fleet lost, no updates)."""


class FleetServer:
    """One run of a real fleet; ``say`` prints a line for the operator."""

    def __init__(self, config: RunConfig, say: Callable[[str], None] = print) -> None:
        from .assembly import assemble, attach_server_data

        self.config, self.say = config, say
        self.broker = self.registry = self.endpoint = self.loop = self.report = None
        self.username = self.password = self.security = None
        c = config
        try:
            self.setup = assemble(c.method, c.model, c.dataset, c.data_dir, c.device_recipe(),
                                  c.method_options, c.seed)
            described = attach_server_data(self.setup.method, self.setup.data, c.server_data, c.seed)
        except (ValueError, TypeError) as exc:
            raise ServeError(str(exc)) from None
        if described:
            say(described)
        elif c.server_data:
            say(f"[yellow]--server-data ignored: {c.method} uses no server data[/]")

    def connect(self) -> None:
        """The broker's address (starting the embedded broker), the registry, the endpoint and
        what pairing tells devices; ServeError (everything closed again) when one fails."""
        from sdk_device.protocol.topics import FleetTopics
        from sdk_device.transport.blob_store import BlobStore
        from sdk_device.transport.endpoint import Endpoint
        from sdk_device.transport.mqtt_link import BrokerAddress

        from .broker.embedded import EmbeddedBroker
        from .broker.mosquitto_auth import SecurityDirError
        from .broker.secured import server_connection
        from .fleet.fleet_store import fleet_file
        from .fleet.pair_codes import LockoutPolicy
        from .fleet.pairing_setup import describe_fleet, device_url_for
        from .fleet.registry import FleetRegistry

        c = self.config
        try:
            if c.security_dir:
                self.address, c.ca_file, self.security = server_connection(c.security_dir, c.broker_url,
                                                                           c.ca_file)
                if self.security.fleet != c.fleet:
                    raise ValueError(f"{c.security_dir} holds the accounts of fleet {self.security.fleet!r}, "
                                     f"not {c.fleet!r}")
                self.username, self.password = self.security.server_credentials()
                c.security_dir = c.security_dir.resolve()  # fleet.json: pair-code may run from elsewhere
            elif c.broker_url:
                self.address = BrokerAddress.parse(c.broker_url)
            else:
                self.broker = EmbeddedBroker(c.host, c.port, allow_remote=c.insecure_embedded_broker).start()
                self.address = self.broker.address
            self.registry = FleetRegistry(c.run_dir / "registry.sqlite",
                                          fleet_file(c.run_dir, c.security_dir))
            self.endpoint = Endpoint(
                self.address, FleetTopics(c.fleet), BlobStore(c.run_dir / "blobs"),
                is_known_peer=self.registry.is_known, username=self.username, password=self.password,
                ca_file=c.ca_file, insecure=c.insecure or c.insecure_embedded_broker,  # that flag: plain TCP
            )
            self.fleet_info = describe_fleet(
                self.setup.method, c.fleet, device_url_for(self.address, c.ca_file, c.device_url),
                c.tiers or [], c.round_timeout_s, method_name=c.method, model=c.model, ca_file=c.ca_file,
                security_dir=str(c.security_dir) if c.security_dir else None, insecure=c.insecure,
                lockout=LockoutPolicy(c.pair_max_failures, c.pair_lockout, c.pair_lockout))
        except (ValueError, SecurityDirError, FileNotFoundError) as exc:
            if self.broker:
                self.broker.stop()
            if self.registry:
                self.registry.close()
            raise ServeError(str(exc)) from None

    def prepare(self, observers, on_round: Callable[[dict], None]) -> None:
        """The run's report (``resume``: the rounds so far), grid and loop; ``config.json``
        written; ``observers`` told the configuration and shown the registry."""
        from .report.run_report import RunReport
        from .rounds.modes import make_loop

        c, method = self.config, self.setup.method
        resumed = c.resume and (c.run_dir / "metrics.jsonl").exists()
        report = self.report = RunReport.load(c.run_dir) if resumed else RunReport(c.run_dir)
        settings = c.async_settings()
        self.grid = c.mqtt_grid(self.endpoint, self.registry, method, settings)
        summary = c.summary()
        (c.run_dir / "config.json").write_text(json.dumps(summary, indent=2) + "\n")
        observers.begin(summary, report.rows)
        observers.watch_registry(self.registry, c.run_dir / "registry.sqlite", self.grid,
                                 fleet_path=self.registry.fleet_path)

        def each_round(row: dict) -> None:
            report.add_round(row)
            observers.add_round(row)
            on_round(row)

        self.loop = make_loop(method, self.grid, c.loop_config(self.setup.tier_map), settings,
                              aggregator=c.aggregation(method, settings), run_dir=c.run_dir,
                              test_data=(self.setup.data.x_test, self.setup.data.y_test), on_round=each_round)

    @property
    def stopped(self) -> bool:
        """Whether the run ended before its last round (Ctrl-C, a failure)."""
        return self.loop is None or self.loop.completed_round < self.config.rounds

    def serve(self, note: Callable[[str], None]) -> None:
        """Open pairing, wait for ``min_devices`` (``note`` says how many are online), run the
        rounds; then close everything and write the plot and the summary (also when stopped or
        failed). ServeError when the fleet was lost or no round accepted an update."""
        from .fleet.fleet_store import fleet_dir
        from .fleet.pairing_setup import start_pairing
        from .privacy.round_privacy import privacy_summary
        from .rounds.loop import FleetLost, NoUpdates
        from .rounds.quality_guard import guard_summary

        c, pairing = self.config, None
        try:
            self.endpoint.start()
            self.loop.start(resume=c.resume)
            pairing = start_pairing(c.run_dir, self.fleet_info, self.address, self.setup.method,
                                    self.registry, self.grid.programs, username=self.username,
                                    password=self.password,
                                    ca_file=c.ca_file, insecure=c.insecure, security=self.security,
                                    fleet_home=fleet_dir(c.run_dir, c.security_dir))
            unsecured = "" if c.security_dir else " (no --security-dir: the broker enforces no accounts)"
            self.say(f"pairing open: make a code with `fedsdk-server pair-code --run-dir {c.run_dir}`"
                     + unsecured)
            known = sum(not state.revoked for state in self.registry.states().values())
            self.say(f"fleet {c.fleet}: {known} device(s) registered (in {self.registry.fleet_path})")
            self.say(f"serving fleet {c.fleet} on {self.address.url}; waiting for {c.min_devices} device(s)")
            while self.grid.wait_for_devices(c.min_devices, timeout_s=30) < c.min_devices:
                note(f"{len(self.grid.devices)}/{c.min_devices} devices online, still waiting")
            self.loop.run()
        except (FleetLost, NoUpdates) as exc:
            raise ServeError(str(exc)) from None
        finally:
            if pairing:
                pairing.close()
            self.grid.close()
            self.endpoint.close()
            self.registry.close()  # writes the devices' last hello/status bookkeeping
            if self.broker:
                self.broker.stop()
            if self.report.rows:  # also when stopped (Ctrl-C) or failed: the rounds that finished are kept
                self.report.write_plot()
            self.report.write_summary({"method": c.method, "dataset": c.dataset, "fleet": c.fleet,
                                       **privacy_summary(self.loop), **guard_summary(self.loop)})
