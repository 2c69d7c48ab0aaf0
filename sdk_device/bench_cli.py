"""``fedsdk bench``: this device's profile and training step times, printed (nothing is sent).

With the last task's programs cached in the work dir, it runs the parity and speed self-test
(``runtimes/selftest.py``) on them, as the agent does before choosing a runtime; otherwise it
times the reference CNN of ``benchmark.py`` on the runtimes that can run it here.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .device_config import DeviceConfig
from .profile import device_profile
from .runtimes.registry import available_runtimes

console = Console(highlight=False, soft_wrap=True)


def _defaults(work_dir: Path | None, data_path: Path | None) -> tuple[Path, Path | None]:
    try:
        stored = DeviceConfig.load()
    except ValueError:
        stored = None
    if work_dir is None:
        work_dir = Path(stored.work_dir) if stored and stored.work_dir else Path(".fedsdk")
    if data_path is None and stored and stored.data_path:
        data_path = Path(stored.data_path)
    return work_dir, data_path


def load_data_option(data_path: Path | None):
    """``(x, y)`` of a ``--data`` file, ``(None, None)`` without one; a ClickException says
    what is wrong with a bad file."""
    from .data.npz import DataError, load_npz

    if data_path is None:
        return None, None
    try:
        return load_npz(data_path)
    except DataError as exc:
        raise click.ClickException(str(exc)) from None


def _cached_task(work_dir: Path):
    """(task, recipe, programs by format, weights, formats not cached) of the model the last
    task trained last, when the blobs it needs are cached; else None."""
    from .outputs import OUTPUTS
    from .protocol import messages as msgs
    from .protocol.blobs import decode_tensors
    from .protocol.errors import ProtocolError
    from .protocol.task_plan import parse_plan
    from .transport.blob_store import BlobStore

    last = work_dir / "last_task.json"
    if not last.is_file():
        return None
    try:
        task = msgs.decode(last.read_bytes())
        step = parse_plan(task.config, set(task.programs), set(OUTPUTS)).steps[-1]
    except ProtocolError:  # a task of an older protocol: nothing to test
        return None
    store = BlobStore(work_dir / "blobs")
    refs, weights = task.programs[step.model], task.arrays[step.model]
    programs = {p.format: store.get(p.id) for p in refs if store.has(p.id)}
    if "torchspec/1" not in programs or not store.has(weights.id):
        return None
    missing = [p.format for p in refs if p.format not in programs]
    return task, step.recipe, programs, decode_tensors(store.get(weights.id)), missing


def run_bench(work_dir: Path | None, data_path: Path | None, steps: int, as_json: bool) -> None:
    from fedcore import modelspec
    from fedcore.recipe import Recipe

    from .benchmark import REFERENCE_SPEC, bench_inputs, bench_programs, initial_weights

    work_dir, data_path = _defaults(work_dir, data_path)
    profile = device_profile(available_runtimes())
    x, y = load_data_option(data_path)
    cached = _cached_task(work_dir)
    if not as_json:
        _print_profile(profile)
    if cached is not None:
        from .runtimes.selftest import fastest_passing, format_table, run_selftest

        task, recipe, programs, weights, missing = cached
        spec = modelspec.loads(programs["torchspec/1"])
        xs, ys = bench_inputs(spec, max(recipe.batch_size * steps, 64), x, y, recipe.seed)
        rows = run_selftest(programs, weights, xs, ys, recipe, steps=steps)
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "profile": profile,
                        "model": "fleet (last task)",
                        "round": task.round,
                        "selftest": [r.to_dict() for r in rows],
                    },
                    indent=2,
                )
            )
            return
        console.print(
            f"\nthe fleet's model (last task, round {task.round}), batch {recipe.batch_size}, "
            f"{recipe.optimizer}: parity against torch autograd and speed"
        )
        click.echo(format_table(rows))
        if missing:
            click.echo(f"(programs not cached here, not tested: {', '.join(missing)})")
        click.echo(f"fastest runtime that passed parity: {fastest_passing(rows) or 'none'}")
        return
    if "torch" not in available_runtimes():
        raise click.ClickException(
            "no task of a fleet is cached here and torch (which builds the reference "
            "model) is not installed: pair and run once, then bench again"
        )
    recipe = Recipe(epochs=1, batch_size=32, optimizer="sgd")
    programs = {"torchspec/1": modelspec.dumps(REFERENCE_SPEC)}
    bench = bench_programs(programs, initial_weights(REFERENCE_SPEC), recipe, x, y, steps=steps)
    if as_json:
        click.echo(json.dumps({"profile": profile, "model": "reference", "bench": bench}, indent=2))
        return
    console.print(
        f"\nreference CNN (1x28x28 -> 10 classes), batch {recipe.batch_size}, sgd "
        "(no fleet task cached here yet):"
    )
    table = Table("runtime", "format", "ms per step", "note")
    for row in bench["runtimes"]:
        ms = f"{row['ms_per_step']:.1f}" if row["ms_per_step"] is not None else "-"
        table.add_row(row["runtime"], row["format"], ms, row["error"])
    console.print(table)
    console.print(
        f"memory: {bench['base_rss_mb']:.0f} MB with the runtime loaded, peak {bench['peak_rss_mb']:.0f} MB"
    )


def _print_profile(profile: dict) -> None:
    table = Table("", "", show_header=False, box=None)

    def mb(v):
        return f"{v:.0f} MB" if v else "?"

    for label, value in [
        ("board", profile.get("board") or "-"),
        ("cpu", profile.get("cpu_model") or "?"),
        ("arch", profile["arch"]),
        ("cores", str(profile["cpu_count"])),
        ("memory", f"{mb(profile['memory_mb'])} ({mb(profile['memory_available_mb'])} available)"),
        ("os", profile["os"]),
        ("python", profile["python"]),
        ("runtimes", ", ".join(profile["runtimes"]) or "none"),
    ]:
        table.add_row(f"[bold]{label}[/]", value)
    console.print(table)
