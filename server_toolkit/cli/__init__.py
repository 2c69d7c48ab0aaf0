"""``fedsdk-server``: the server-side command line, one module per command group.

==============  ===============================================================
module          commands
==============  ===============================================================
``simulate``    simulate (a whole federation on this machine)
``run``         run (serve a real fleet; pairing is live meanwhile)
``edge``        edge (an edge aggregator)
``devices``     devices add | list | show | revoke | retier
``pairing``     pair-code (and the devices show/revoke/retier commands)
``broker``      broker
``security``    certs init, security init | grant | revoke | …
``datasets``    datasets list | verify | fetch
``methods``     methods list | show
``report``      report (an HTML page comparing runs)
``runs``        runs list | show (run directories and how they ended)
``hn``          hn adapt (a new device into a hypernetwork run)
``swarm``       swarm (thousands of simulated devices for load tests)
``new``         new (a small project: model.py, data.py, fedsdk.toml)
``conformance`` conformance (drive one device client through every protocol path)
``bridge``      bridge-config (a site broker's mosquitto bridge to the central one)
==============  ===============================================================
"""

from __future__ import annotations

import click

from .bridge import bridge_config
from .broker import broker
from .conformance import conformance
from .datasets import datasets
from .devices import devices
from .edge import edge
from .hn import hn
from .methods import methods
from .new import new
from .oneline import OneLineGroup
from .pairing import pair_code
from .report import report
from .run import run
from .runs import runs
from .security import certs, security
from .simulate import simulate
from .swarm import swarm
from .talk import set_up


@click.group(cls=OneLineGroup)
@click.version_option(package_name="fedsdk", prog_name="fedsdk-server")
@click.option("-v", "--verbose", count=True,
              help="More logging, one level per -v: `run -v` adds debug lines; other commands "
                   "(warnings by default) show info with -v, debug with -vv.")
@click.option("-q", "--quiet", is_flag=True,
              help="Warnings and errors only (run and edge print a line per event by default).")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """fedsdk server: cut models for a fleet of unlike devices and run federated rounds."""
    set_up(ctx.invoked_subcommand, verbose, quiet)


for command in (simulate, run, edge, devices, pair_code, broker, certs, security, datasets, methods, report,
                runs, hn, swarm, bridge_config, new, conformance):
    main.add_command(command)
