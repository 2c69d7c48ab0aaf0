"""The checks ``simulate`` and ``run`` make of their options before anything starts (see
``validate.py`` for the hook). Each check reads ``params`` with ``.get``: an option a
command lacks is skipped. Decisions: ``--tiers`` with a method that ignores tiers (fedavg,
fedavgm, fedprox) is a warning, not an error (with ``--edges`` tiers still group devices);
a tier a method cannot read is an error."""

from __future__ import annotations

from pathlib import Path

import click

from .oneline import one_line
from .validate import warn

# option -> (smallest value allowed, whether that bound is open), by Python name
LOWER_BOUNDS: dict[str, tuple[float, bool]] = {
    "rounds": (1, False), "devices": (1, False), "edges": (0, False), "clients_per_round": (1, False),
    "over_select": (0, False), "alpha": (0, True), "classes_per_client": (1, False),
    "num_strong": (0, False), "local_epochs": (1, False), "batch_size": (1, False), "lr": (0, True),
    "max_steps": (0, False),
    "round_timeout": (0, True), "fleet_timeout": (0, True), "min_devices": (1, False),
    "norm_bound": (0, False), "train_samples": (1, False), "test_samples": (1, False),
    "port": (1, False), "pair_max_failures": (1, False),
}


def flag(name: str) -> str:
    """``clients_per_round`` -> ``--clients-per-round``."""
    return "--" + name.replace("_", "-")


def split_tiers(text: str | None) -> list[str]:
    """``"1.0, 0.5"`` -> ``["1.0", "0.5"]``; UsageError on an empty name (``1.0,,0.5``)."""
    if text is None:
        return []
    tiers = [t.strip() for t in text.split(",")]
    if not all(tiers):
        raise click.UsageError(f"--tiers {text!r} has an empty tier name; give names separated by commas")
    return tiers


def validate_values(params: dict) -> None:
    """Numbers in range, options that exclude each other, the run directory usable."""
    for name, (low, open_) in LOWER_BOUNDS.items():
        value = params.get(name)
        if value is not None and (value < low or (open_ and value == low)):
            bound = f"> {low}" if open_ else f">= {low}"
            raise click.UsageError(f"{flag(name)} must be {bound}, got {value}")
    fraction, port = params.get("fraction"), params.get("port")
    if fraction is not None and not 0 < fraction <= 1:
        raise click.UsageError(f"--fraction must be in (0, 1], got {fraction}")
    if port is not None and port > 65535:
        raise click.UsageError(f"--port must be 1..65535, got {port}")
    if params.get("strong_share") is not None and not 0 < params["strong_share"] < 1:
        raise click.UsageError(f"--strong-share must be in (0, 1), got {params['strong_share']}")
    if params.get("edges") and params.get("grid") == "inprocess":
        raise click.UsageError("--edges runs edge aggregator processes on a broker: use --grid mqtt")
    if params.get("devices") is not None and params.get("grid") == "mqtt" and params["devices"] > 64:
        warn(f"--devices {params['devices']} starts that many processes on this machine")
    split_tiers(params.get("tiers"))
    from .options import parse_options

    parse_options(params.get("method_options") or ())
    run_dir = params.get("run_dir_option") if params["_command"] == "simulate" else None
    if run_dir is not None and params.get("resume_dir"):
        raise click.UsageError("give --run-dir for a new run or --resume DIR to continue one, not both")
    if run_dir is not None and run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise click.UsageError(f"--run-dir {run_dir} is not empty (use --resume {run_dir} to continue it)")


def validate_broker(params: dict) -> None:
    """``--broker`` answers as an MQTT broker; the embedded broker's port (``run``) is free."""
    from sdk_device.transport.mqtt_link import BrokerAddress
    from sdk_device.transport.tls import InsecureTransportError, check_plain_tcp

    from ..broker.ports import broker_problem, port_in_use

    url = params.get("broker_url")
    if url:
        try:
            address = BrokerAddress.parse(url)
        except ValueError as exc:
            raise click.UsageError(f"--broker: {exc}") from None
        try:  # run's policy first: no plain TCP off this machine unless --insecure
            if params["_command"] == "run":
                check_plain_tcp(address.host, address.tls, bool(params.get("insecure")))
        except InsecureTransportError as exc:
            raise click.UsageError(str(exc)) from None
        problem = broker_problem(address.host, address.port, tls=address.tls)
        if problem:
            raise click.ClickException(f"--broker {url}: {problem}; start one (`fedsdk-server broker`) "
                                       "or leave --broker out to use the embedded one")
    elif params.get("security_dir"):  # run's broker is the one of the security directory
        from ..broker.secured import local_address

        try:
            address, _ = local_address(params["security_dir"])
        except (OSError, ValueError, KeyError) as exc:
            raise click.UsageError(f"--security-dir {params['security_dir']}: not a broker security "
                                   f"directory ({exc}); see `fedsdk-server security init`") from None
        problem = broker_problem(address.host, address.port, tls=address.tls)
        if problem:
            raise click.ClickException(
                f"the broker of {params['security_dir']} is down: {problem}; start it with "
                f"`fedsdk-server broker --mosquitto --security-dir {params['security_dir']}`")
    elif params["_command"] == "run":
        host, port = params.get("host") or "127.0.0.1", params.get("port") or 1883
        if port_in_use(host, port):
            raise click.ClickException(
                f"port {port} on {host} is in use (a broker already?): choose another --port, or use "
                f"that broker with --broker mqtt://{host}:{port}")


def validate_dataset(params: dict) -> None:
    """``--dataset`` names a known dataset found on disk, or ``npz:`` a readable npz file."""
    from ..byo.load import UserCodeError, is_user_ref, load_user_function
    from ..data.catalogue import known_dataset
    from ..data.datasets import KNOWN_DATASETS
    from ..data.errors import DatasetError
    from ..data.locate import find_dataset, not_found_message

    name = params.get("dataset")
    if not name or params.get("resume_dir"):
        return
    if is_user_ref(name):  # the loader runs now (and again at the start): its arrays are checked
        from ..data.datasets import load_dataset

        try:
            load_user_function(name, "load", "--dataset")
            load_dataset(name)
        except (UserCodeError, DatasetError) as exc:
            raise click.UsageError(str(exc)) from None
        return
    if name.startswith("npz:"):
        from ..data.npz import npz_shapes

        path = Path(name[len("npz:"):])
        try:
            shapes = npz_shapes(path) if path.is_file() else None
        except DatasetError as exc:
            raise click.UsageError(f"--dataset {name}: {exc}") from None
        if shapes is None:
            raise click.UsageError(f"--dataset {name}: no such file")
        missing = [k for k in ("x", "y") if k not in shapes]
        if missing:
            raise click.UsageError(f"--dataset {name}: {path} has no array(s) {', '.join(missing)} "
                                   f"(found {', '.join(shapes) or 'none'}); save it with "
                                   "numpy.savez(path, x=..., y=...)")
        return
    try:
        dataset = known_dataset(name)
    except DatasetError:
        raise click.UsageError(f"unknown --dataset {name!r}; known: {', '.join(KNOWN_DATASETS)} "
                               "or npz:<path>") from None
    if not dataset.bundled and find_dataset(dataset, params.get("data_dir")) is None:
        raise click.UsageError(one_line(not_found_message(dataset, params.get("data_dir"))))


def validate_method(params: dict) -> None:
    """``--method`` is known, its ``--method-option``s typed right, ``--tiers`` readable by it,
    ``--model`` in the zoo. Imports the method registry (torch): the last check."""
    from ..assembly import split_tier_map
    from ..methods import method_class
    from ..methods.options import OptionError
    from .options import parse_options

    if params.get("resume_dir"):
        return
    name = params.get("method")
    try:
        cls = method_class(name)
        options, _ = split_tier_map(parse_options(params.get("method_options") or ()))
        parsed = cls.Options.parse(cls.name, options)
    except (OptionError, ValueError) as exc:
        raise click.UsageError(one_line(exc)) from None
    check_tiers(cls, parsed, split_tiers(params.get("tiers")), bool(params.get("edges")))
    check_model(params.get("model"), params)


def check_tiers(cls: type, options: object, tiers: list[str], edges: bool) -> None:
    """Every tier readable by the method (a width ratio, an exit count, a named tier), or a
    warning that the method ignores tiers."""
    from ..methods.base import DeviceInfo
    from ..methods.tiers import tier_ratio

    if not tiers:
        return
    if getattr(cls, "ignores_tiers", False) and not edges:
        warn(f"--tiers ignored: {cls.name} trains one model on every device (a width method such as "
             "heterofl reads tiers)")
        return
    ratios = getattr(options, "tier_ratios", None)
    exits = getattr(options, "tier_exits", None)
    for tier in tiers:
        if ratios is not None:
            try:
                tier_ratio(DeviceInfo("tier", 0, tier), ratios)
            except ValueError:
                raise click.UsageError(f"--tiers: {cls.name} reads a tier as a width ratio in (0, 1] or a "
                                       f"name in tier_ratios {sorted(ratios)}; {tier!r} is neither") from None
        elif exits is not None and tier not in exits and not (tier.isdigit() and int(tier) >= 1):
            raise click.UsageError(f"--tiers: {cls.name} reads a tier as an exit count (1, 2, ...) or a name "
                                   f"in tier_exits {sorted(exits)}; {tier!r} is neither")


def check_model(name: str | None, params: dict) -> None:
    """``--model`` names a zoo model (``NAME@R`` a width cut of one), or a user's model that
    torchspec/1 can express."""
    from ..byo.load import UserCodeError, is_user_ref
    from ..models.zoo import model_names

    if is_user_ref(name):  # traced now; a builder of (input_shape, num_classes) on the dataset's
        import inspect  # shapes (the dataset is loaded once more for that)

        from ..byo.load import load_user_function
        from ..byo.model import UnsupportedModel, build_user_module, module_layers, user_model_spec
        from ..data.datasets import load_dataset
        from ..data.errors import DatasetError

        try:
            if len(inspect.signature(load_user_function(name, "build", "--model")).parameters) < 2:
                module_layers(build_user_module(name), name)  # fails fast on an unsupported layer
            data = load_dataset(params["dataset"], params.get("data_dir"), seed=params.get("seed") or 0)
            user_model_spec(name, data.input_shape, data.num_classes)
        except (UserCodeError, UnsupportedModel, DatasetError) as exc:
            raise click.UsageError(str(exc)) from None
        return
    if name and name.partition("@")[0] not in model_names():
        raise click.UsageError(f"unknown --model {name!r}; the zoo has {', '.join(model_names())} "
                               "(fedsdk-server methods list shows what each method expects)")
