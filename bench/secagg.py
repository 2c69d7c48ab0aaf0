"""Secure aggregation vs plain aggregation: bytes per device, server seconds, device seconds.

For each fleet size and method, one round's aggregation of the same updates, twice:

* **plain** - each device encodes its update (safetensors, what it uploads), the server
  decodes every update and runs the method's ``aggregate_train``;
* **secagg** - the real device client (``sdk_device/secagg_client.py``) and the real server
  state machine (``server_toolkit/secagg/protocol.py``) run every stage in this process
  (``server_toolkit/secagg/inprocess.py``: the JSON messages and masked vectors the MQTT grid
  moves, without a broker), then the server's ``next_weights``.

The model is ``simulate``'s default, small_cnn on digits (8x8 inputs; 13,706 elements).
Updates are the global model plus noise (training is left out on both sides: it is the same
with or without secure aggregation). Bytes: what a device sends and receives for the
aggregation (plain: its upload; secagg: its stage messages and masked vector). Seconds: CPU
time of the code paths, one device after the other; "device s" is the mean per device.
Also printed: the largest difference between the two aggregates (the fixed-point error).

    nice -n 10 .venv/bin/python bench/secagg.py [--devices 10,100,1000] [--methods fedavg,heterofl]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedcore.recipe import Recipe  # noqa: E402
from sdk_device.protocol.blobs import decode_tensors, encode_tensors  # noqa: E402
from server_toolkit.methods import method_class  # noqa: E402
from server_toolkit.methods.base import ClientUpdate, DeviceInfo  # noqa: E402
from server_toolkit.models.zoo import model_spec  # noqa: E402
from server_toolkit.secagg.aggregate import layout_for, next_weights  # noqa: E402
from server_toolkit.secagg.inprocess import run_secure_round  # noqa: E402

TIERS = {"fedavg": [None], "heterofl": ["1.0", "0.5", "0.25"], "depthfl": ["1", "2", "3"]}
MODELS = {"fedavg": "small_cnn", "heterofl": "small_cnn", "depthfl": "vgg_multi_exit"}


class Updates:
    """Each device's trained update, made on demand (global + seeded noise; float32)."""

    def __init__(self, instructions) -> None:
        self.by_device = {i.device_id: i for i in instructions}

    def __getitem__(self, dev: str):
        rng = np.random.default_rng(int(dev[3:]))
        weights = {k: (v + rng.normal(0, 0.01, v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
                   for k, v in self.by_device[dev].weights.items()}
        samples = 50 + int(dev[3:]) % 100
        return weights, samples, np.bincount(rng.integers(0, 10, samples), minlength=10)


def measure(method_name: str, devices: int, seed: int = 0) -> dict:
    spec = model_spec(MODELS[method_name], (1, 8, 8), 10)  # digits: simulate's default
    options = {"tier_ratios": {t: float(t) for t in TIERS[method_name]}} if method_name == "heterofl" else {}
    method = method_class(method_name)(spec, Recipe(), **options)
    before = method.initial_weights(seed)
    tiers = TIERS[method_name]
    infos = [DeviceInfo(f"dev{i:05d}", 50 + i % 100, tier=tiers[i % len(tiers)]) for i in range(devices)]
    instructions = method.configure_train(1, before, infos)
    updates = Updates(instructions)

    # plain: encode on each device, decode + aggregate on the server
    device_s, sizes, blobs = 0.0, [], []
    for i in instructions:
        weights, samples, counts = updates[i.device_id]
        clock = time.process_time()
        blob = encode_tensors(weights)
        device_s += time.process_time() - clock
        sizes.append(len(blob))
        blobs.append((i, blob, samples, counts))
    clock = time.process_time()
    plain_updates = [ClientUpdate(i.device_id, n, decode_tensors(blob), {"label_counts": c.tolist()}, i)
                     for i, blob, n, c in blobs]
    plain = method.aggregate_train(1, before, plain_updates)
    plain_server_s = time.process_time() - clock
    del blobs, plain_updates

    # secure: layouts (server), every stage (both sides), next weights (server)
    clock = time.process_time()
    layouts = {i.device_id: layout_for(method, before, i) for i in instructions}
    layout_s = time.process_time() - clock
    stats = run_secure_round(1, layouts, updates, seed=seed)
    clock = time.process_time()
    first = instructions[0]
    secure = next_weights(method, 1, before, stats.total, layouts[first.device_id], first)
    finish_s = time.process_time() - clock
    error = max(float(np.abs(secure[n].astype(np.float64) - plain[n].astype(np.float64)).max())
                for n in plain)
    return {
        "method": method_name, "devices": devices, "model": MODELS[method_name],
        "global_elements": layouts[first.device_id].size,
        "vector_elements": layouts[first.device_id].vector_length,
        "plain_bytes_per_device": float(np.mean(sizes)),
        "secagg_bytes_per_device": float(np.mean(list(stats.bytes_per_device.values()))),
        "plain_server_s": plain_server_s,
        "secagg_server_s": stats.server_seconds + layout_s + finish_s,
        "plain_device_s": device_s / devices,
        "secagg_device_s": float(np.mean(list(stats.device_seconds.values()))),
        "max_abs_difference": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="10,100,1000", help="Fleet sizes, comma-separated.")
    parser.add_argument("--methods", default="fedavg,heterofl", help="Methods (fedavg, heterofl, depthfl).")
    parser.add_argument("--out", type=Path, default=None, help="Also write the rows as JSON here.")
    args = parser.parse_args()
    started = time.monotonic()
    rows = []
    print("| method | devices | bytes/device plain | bytes/device secagg | server s plain | server s secagg "
          "| device s plain | device s secagg | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for method_name in args.methods.split(","):
        for devices in (int(d) for d in args.devices.split(",")):
            r = measure(method_name, devices)
            rows.append(r)
            print(f"| {method_name} | {devices:,} | {r['plain_bytes_per_device'] / 1e3:,.0f} kB "
                  f"| {r['secagg_bytes_per_device'] / 1e3:,.0f} kB | {r['plain_server_s']:.2f} "
                  f"| {r['secagg_server_s']:.2f} | {r['plain_device_s'] * 1e3:.2f} ms "
                  f"| {r['secagg_device_s'] * 1e3:.0f} ms | {r['max_abs_difference']:.1e} |", flush=True)
    print(f"wall time {time.monotonic() - started:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
