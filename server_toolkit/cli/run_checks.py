"""The checks ``simulate`` and ``run`` make of their options before anything starts (see
``validate.py`` for the hook). Each check reads ``params`` with ``.get``: an option a
command lacks is skipped. Decisions: ``--tiers`` with a method that ignores tiers (fedavg,
fedavgm, fedprox) is a warning, not an error (with ``--edges`` tiers still group devices);
a tier a method cannot read is an error."""

from __future__ import annotations

from pathlib import Path

import click

from .method_choice import did_you_mean, unknown_choice
from .oneline import one_line
from .tier_checks import check_tiers, model_outputs
from .warning import warn

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
    from ..data.catalogue import CATALOGUE, known_dataset
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
        raise click.UsageError(unknown_choice("--dataset", name, CATALOGUE, more=", npz:<path> or a "
                                              "loader (module:function)")) from None
    if not dataset.bundled and find_dataset(dataset, params.get("data_dir")) is None:
        raise click.UsageError(one_line(not_found_message(dataset, params.get("data_dir"))))


def validate_method(params: dict) -> None:
    """``--method`` is known, its ``--method-option``s typed right, ``--model`` in the zoo, the
    tiers of ``--tiers`` and ``tier_map`` readable by the method (``tier_checks.py``). Imports
    the method registry (torch): the last check."""
    from ..assembly import split_tier_map
    from ..methods import canonical_name, method_class, methods
    from ..methods.options import OptionError
    from .options import parse_options

    if params.get("resume_dir"):
        return
    name = params.get("method")
    if canonical_name(name) not in methods():
        raise click.UsageError(unknown_choice("--method", name, sorted(methods()),
                                              more=" (`fedsdk-server methods list`)"))
    try:
        cls = method_class(name)
        options, tier_map = split_tier_map(parse_options(params.get("method_options") or ()))
        parsed = cls.Options.parse(cls.name, options)
    except (OptionError, ValueError) as exc:
        raise click.UsageError(one_line(exc)) from None
    check_model(params.get("model"), params)
    formats = [f.strip() for f in (params.get("program_formats") or "torchspec/1").split(",")]
    if cls.family == "conv" and params.get("edges") and params["_command"] == "simulate" and (
            "torchspec/1" not in formats or params.get("device_runtime") not in (None, "auto", "torch")):
        raise click.UsageError("--edges with FedConv: its clustering edges forward the server's programs and "
                               "read the model from its torchspec/1 one, built for torch devices only: drop "
                               "--programs / --device-runtime (generic edges of other methods export them)")
    outputs = model_outputs(params.get("model"), params.get("dataset")) if cls.family == "exit" else None
    check_tiers(cls, parsed, split_tiers(params.get("tiers")), bool(params.get("edges")), outputs, tier_map)


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
    base = (name or "").partition("@")[0]
    if name and base not in model_names():
        raise click.UsageError(f"unknown --model {name!r}{did_you_mean(base, model_names())}; the zoo has "
                               f"{', '.join(model_names())} (`fedsdk-server methods list` shows what each "
                               "method expects)")
