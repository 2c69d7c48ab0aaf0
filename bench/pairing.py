"""Pairing: what a code check costs, how long pairing takes, how good the tier time estimate is.

* **code check** - ``PairCodes.claim`` wall time (a wrong code: the worst case, it compares
  with every stored code and records the failure) with 10 and with ``--codes`` codes issued
  in the last 7 days, on a real SQLite registry. Median ms; ratio large / small.
* **pairing exchange** - ``PairClient.pair`` end to end against a secured mosquitto started
  here (accounts + ACL; ``plain`` loopback and ``tls`` with a pinned CA fingerprint), the
  pairing service as ``fedsdk-server run`` runs it: total wall time and the part spent in the
  device's step-time benchmark (torch, 5 steps of each tier's sub-model of small_cnn, two
  tiers, blob pulls included). Median of ``--pairings``.
* **tier step estimate** - what scaling the full model's measured step by FLOPs (tier FLOPs /
  full FLOPs) would predict for each tier of heterofl/small_cnn and depthfl/vgg_multi_exit
  (digits shapes), / the step time measured on the tier's own sub-model (torch, 1 thread).
  This is why pairing times every tier instead: far from 1, the scaling misjudges tiers.

Run from the repository root::

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/pairing.py [--codes 1000] [--pairings 5]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedcore import modelspec  # noqa: E402
from fedcore.recipe import Recipe  # noqa: E402
from sdk_device.benchmark import bench_programs, initial_weights  # noqa: E402
from sdk_device.pair_cli import _benchmark  # noqa: E402
from sdk_device.pairing import PairClient, PairingError  # noqa: E402
from sdk_device.protocol.errors import ProtocolError  # noqa: E402
from sdk_device.transport.tls import certificate_fingerprint  # noqa: E402
from server_toolkit.broker.secured import make_secured_broker  # noqa: E402
from server_toolkit.fleet.pair_codes import LockoutPolicy, PairCodes  # noqa: E402
from server_toolkit.fleet.pairing_setup import start_pairing_on  # noqa: E402
from server_toolkit.fleet.registry import FleetRegistry  # noqa: E402
from server_toolkit.fleet.tiers import spec_cost  # noqa: E402
from server_toolkit.methods.exit.depthfl import DepthFL  # noqa: E402
from server_toolkit.methods.width.heterofl import HeteroFL  # noqa: E402
from server_toolkit.models.zoo import model_spec  # noqa: E402

PROFILE = {"arch": "x86_64", "memory_mb": 4096.0, "memory_available_mb": 2048.0, "num_samples": 200}


def code_check_ms(root: Path, stored: int, samples: int) -> float:
    registry = FleetRegistry(root / f"codes-{stored}.sqlite")
    codes = PairCodes(registry, root, LockoutPolicy(max_failures=10**9))
    for _ in range(stored):
        codes.issue(3600)
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        try:
            codes.claim("ZZZZ-ZZZZ", "bench")
        except ProtocolError:
            pass
        times.append((time.perf_counter() - started) * 1000)
    registry.close()
    return statistics.median(times)


def pairing_times(root: Path, tls: bool, count: int) -> tuple[float, float]:
    """Median (total s, benchmark s) of ``count`` pairings."""
    secured = make_secured_broker(root / ("tls" if tls else "plain"), "bench", tls=tls)
    run_dir = root / f"run-{tls}"
    method = HeteroFL(model_spec("small_cnn", (1, 8, 8), 10), Recipe(epochs=1, batch_size=16))
    service, registry = start_pairing_on(secured, run_dir, method, ["1.0", "0.5"], method_name="heterofl",
                                         model="small_cnn", lockout=LockoutPolicy())
    codes = PairCodes(registry, secured.security.directory)  # the fleet's pairing key
    pin = certificate_fingerprint(Path(secured.ca_file).read_text()) if tls else None
    totals, benches = [], []
    try:
        for i in range(count + 1):  # the first one warms imports up and is not counted
            spent = {}

            def benchmark(offer, models, fetch, spent=spent):
                started = time.perf_counter()
                out = _benchmark(offer, models, fetch, None, None, None)
                spent["s"] = time.perf_counter() - started
                return out

            code, _ = codes.issue(600)
            started = time.perf_counter()
            with PairClient(secured.url, ca_fingerprint=pin, timeout_s=60) as client:
                client.pair(code, f"dev{i}", PROFILE, benchmark)
            if i:
                totals.append(time.perf_counter() - started)
                benches.append(spent["s"])
    except PairingError as exc:
        raise SystemExit(f"pairing failed: {exc}") from None
    finally:
        service.close()
        secured.stop()
    return statistics.median(totals), statistics.median(benches)


def step_ms(spec: dict, recipe: Recipe) -> float:
    programs = {"torchspec/1": modelspec.dumps(spec)}
    bench = bench_programs(programs, initial_weights(spec), recipe, steps=10)
    return bench["runtimes"][0]["ms_per_step"]


def tier_estimates() -> list[tuple[str, str, float, float]]:
    """(method/model, tier, estimated ms, measured ms) for every tier."""
    rows = []
    for label, method, tiers in [
        (
            "heterofl/small_cnn",
            HeteroFL(model_spec("small_cnn", (1, 8, 8), 10), Recipe(batch_size=16)),
            ["1.0", "0.5", "0.25"],
        ),
        (
            "depthfl/vgg_multi_exit",
            DepthFL(model_spec("vgg_multi_exit", (1, 8, 8), 10), Recipe()),
            ["3", "2", "1"],
        ),
    ]:
        full_spec, recipe = method.tier_plan(None)
        full_ms, full_flops = step_ms(full_spec, recipe), spec_cost(full_spec).flops
        for tier in tiers:
            spec, _ = method.tier_plan(tier)
            estimate = full_ms * spec_cost(spec).flops / full_flops
            rows.append((label, tier, estimate, step_ms(spec, recipe)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codes", type=int, default=1000)
    parser.add_argument("--pairings", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fedsdk-bench-pairing-") as tmp:
        root = Path(tmp)
        small, large = code_check_ms(root, 10, 50), code_check_ms(root, args.codes, 50)
        print(
            f"code check (wrong code): {small:.2f} ms with 10 codes, {large:.2f} ms with {args.codes} "
            f"codes; ratio {large / small:.1f}"
        )
        for tls in (False, True):
            total, bench = pairing_times(root, tls, args.pairings)
            print(
                f"pairing exchange ({'tls, pinned CA' if tls else 'plain, loopback'}): {total:.2f} s total, "
                f"{bench:.2f} s of it the step-time benchmark, {total - bench:.2f} s the rest "
                f"(median of {args.pairings})"
            )
    print("tier step estimate (full-model step x FLOPs ratio) / measured step, torch, 1 thread:")
    for label, tier, estimate, measured in tier_estimates():
        print(
            f"  {label:<24} tier {tier:<5} estimate {estimate:7.2f} ms  measured {measured:7.2f} ms  "
            f"ratio {estimate / measured:.2f}"
        )


if __name__ == "__main__":
    main()
