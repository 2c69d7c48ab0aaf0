"""An arm64 device without torch trains a FedAvg round against this (x86) server.

The device is the root ``scripts/build-arm64-root.sh`` built (``make arm64-root``, part of
``make test``): Debian bookworm arm64 with fedsdk installed by ``install-device.sh`` (the
executorch wheel without dependencies, numpy, paho-mqtt, the native ExecuTorch shim
cross-compiled for aarch64). Here it runs under qemu-user (through proot, no binfmt_misc)
with ``--runtime executorch-native``, over a real mosquitto on loopback; the server offers
``pte/1`` programs only. The returned weights must match the torch runtime training the same
task on this machine (gradient parity across architectures), and the root holds no torch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from export import decompositions
from export.programs import ProgramCache
from fedcore.recipe import Recipe
from sdk_device.data.npz import save_npz
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds

from ..unit.pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture
from .harness import Fleet

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PREFIX = "/opt/fedsdk"  # where build-arm64-root.sh installed the device in the root
RECIPE = Recipe(epochs=2, batch_size=32, optimizer="sgd", lr=0.05, momentum=0.9)
SAMPLES = 400


def arm64_root() -> Path:
    """The installed arm64 root for this checkout (fails with the command that builds it)."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-arm64-root.sh"), "--print-root"],
                         capture_output=True, text=True)
    root = Path(out.stdout.strip())
    if out.returncode != 0:
        pytest.fail(f"the arm64 device root for this checkout is not built ({root}): run "
                    "`make arm64-root` (scripts/build-arm64-root.sh; make test does this)")
    return root


@pytest.fixture(scope="module", name="installed")
def installed_root() -> Path:
    """The arm64 root, looked up once for the module's tests."""
    return arm64_root()


def emulated(installed: Path, data_dir: Path, *command: str) -> list[str]:
    """``command`` run in the arm64 root under qemu-user. ``data_dir`` is bound at its host path:
    Debian's proot 5.1 does not translate the paths of newer system calls (faccessat2, statx)."""
    return ["proot", "-q", "qemu-aarch64-static", "-r", str(installed / "root"), "-b", "/proc", "-b", "/dev",
            "-b", "/sys", "-b", str(data_dir), "-w", str(data_dir),
            "/usr/bin/env", "-i", "PATH=/usr/bin:/bin", f"HOME={data_dir}", "PYTHONUNBUFFERED=1",
            f"FEDSDK_NATIVE_LIB={PREFIX}/native/libfedsdk_executorch.so",
            f"FEDSDK_KERNELS_LIB={PREFIX}/native/libfedsdk_kernels.so", *command]


def test_the_arm64_root_holds_no_torch_and_the_device_fits_in_200_mb(installed):
    site = installed / "root" / PREFIX.lstrip("/") / "venv/lib/python3.11/site-packages"
    assert (site / "executorch" / "lib" / "libexecutorch.so").is_file()
    assert not list((installed / "root").glob("usr/lib/python3*/**/torch/__init__.py"))
    assert not list(site.glob("torch*")) and not list(site.glob("nvidia*")) and not list(site.glob("triton*"))
    sizes = json.loads((installed / "install.json").read_text())
    device_mb = sizes["executorch_mb"] + sizes["numpy_mb"] + sizes["fedsdk_mb"] + sizes["paho_mb"]
    assert device_mb <= 200, sizes
    probe = subprocess.run(emulated(installed, Path("/tmp"), f"{PREFIX}/venv/bin/python", "-c",
                                    "import importlib.util, platform; "
                                    "print(platform.machine(), importlib.util.find_spec('torch'))"),
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == ["aarch64", "None"], probe.stdout + probe.stderr


def test_an_emulated_arm64_device_trains_a_fused_program_round_with_the_native_executorch_runtime(
        installed, mosquitto, tmp_path, program_for):
    fleet = Fleet(mosquitto.address, tmp_path)
    x, y = fleet.data.x_train[:SAMPLES], fleet.data.y_train[:SAMPLES]
    data_dir = tmp_path / "arm64"
    save_npz(data_dir / "data.npz", x, y)
    fleet.registry.add_device("pi")
    log_path = tmp_path / "arm64.log"
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    with open(log_path, "wb") as log:
        fleet.procs.append(subprocess.Popen(
            emulated(installed, data_dir, f"{PREFIX}/venv/bin/fedsdk", "-v", "run", "--broker",
                     mosquitto.address.url, "--fleet", fleet.fleet, "--device-id", "pi", "--data",
                     str(data_dir / "data.npz"), "--work-dir", str(data_dir / "work"),
                     "--runtime", "executorch-native", "--max-tasks", "1"),
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ}))
    try:
        loop = fleet.server(rounds=1, method=FedAvg(spec, RECIPE), program_formats=["pte/1"],
                            round_timeout_s=300)
        loop.grid.programs = ProgramCache(["pte/1"], kernels="fused")  # exported once (program store)
        loop.grid.programs.put(spec, RECIPE, "pte/1", program_for(spec, RECIPE.loss_dict(), RECIPE.batch_size,
                                                                  kernels="fused"), kernels="fused")
        loop.start()
        online = loop.grid.wait_for_devices(1, timeout_s=180)
        assert online == 1, log_path.read_text()[-3000:]
        started = time.monotonic()
        rows = loop.run()
        round_s = time.monotonic() - started
    finally:
        fleet.close()
    log_text = log_path.read_text()
    assert rows[0]["accepted"] == 1 and rows[0]["rejected"] == 0, (rows, log_text[-3000:])
    assert fleet.registry.rejections() == [], log_text[-3000:]  # the fused program ran: no kernel fallback
    profile = fleet.registry.device("pi")["profile"]
    assert profile["arch"] == "aarch64" and "torch" not in profile["runtimes"], profile
    update = fleet.registry.updates(1)[0]
    assert update["metrics"]["runtime"] == "executorch-native" and update["metrics"]["samples"] == SAMPLES
    print(f"emulated arm64 round: {round_s:.1f} s (device train {update['metrics']['wall_time_s']:.1f} s)")

    # The same task trained here by the torch runtime: the arm64 device's weights match.
    reference = run_rounds(FedAvg(spec, RECIPE), [LocalDevice(DeviceInfo("pi", SAMPLES), x, y)], 1,
                           (fleet.data.x_test, fleet.data.y_test), seed=0)
    for name, want in reference.weights.items():
        np.testing.assert_allclose(loop.global_weights[name], want, rtol=1e-3, atol=1e-4, err_msg=name)
    initial = FedAvg(spec, RECIPE).initial_weights(0)
    assert max(float(np.abs(loop.global_weights[n] - initial[n]).max()) for n in initial) > 1e-3  # it trained
    assert np.isfinite(update["metrics"]["loss"])
    assert abs(rows[0]["accuracy"] - reference.rows[0]["accuracy"]) <= 0.01, (rows, reference.rows)


def _kernel_cases() -> tuple[list[dict], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-op cases for arm64_kernels_driver.py: (cases, float32 inputs, float64 torch references
    computed here), NHWC. Odd sizes and channel counts off the kernels' vector blocks."""
    gen = torch.Generator().manual_seed(29)
    cases, inputs, want = [], {}, {}

    def add(op, name, dims, ins, outs):
        cases.append({"op": op, "name": name, "dims": list(dims)})
        inputs.update({f"{name}.{k}": np.ascontiguousarray(v.detach().float().numpy())
                       for k, v in ins.items()})
        want.update({f"{name}.{k}": v.detach().double().numpy() for k, v in outs.items()})

    for name, (b, h, w, c, o, k, stride, pad) in (("conv_a", (2, 9, 9, 17, 33, 5, 2, 2)),
                                                  ("conv_b", (3, 8, 8, 4, 16, 3, 1, 1))):
        x = torch.randn(b, h, w, c, dtype=torch.float64, generator=gen, requires_grad=True)
        weight = torch.randn(o, c, k, k, dtype=torch.float64, generator=gen, requires_grad=True)
        bias = torch.randn(o, dtype=torch.float64, generator=gen, requires_grad=True)
        y = F.conv2d(x.permute(0, 3, 1, 2), weight, bias, stride=stride, padding=pad).permute(0, 2, 3, 1)
        gy = torch.randn(y.shape, dtype=torch.float64, generator=gen)
        y.backward(gy)
        add("conv", name, (b, h, w, c, o, k, stride, pad), {"x": x, "weight": weight, "bias": bias, "gy": gy},
            {"y": y, "gx": x.grad, "gw": weight.grad, "gb": bias.grad})

    b, h, w, c = 4, 5, 3, 19  # the last sample is padding (masked out)
    x = (torch.randn(b, h, w, c, dtype=torch.float64, generator=gen) * 2 + 0.5).requires_grad_()
    weight = (torch.rand(c, dtype=torch.float64, generator=gen) + 0.5).requires_grad_()
    bias = torch.randn(c, dtype=torch.float64, generator=gen, requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    running = (torch.randn(c, dtype=torch.float64, generator=gen),
               torch.rand(c, dtype=torch.float64, generator=gen) + 0.5)
    y, (new_mean, new_var) = decompositions.batch_norm_train(x, weight, bias, mask, running)
    gy = torch.randn(y.shape, dtype=torch.float64, generator=gen) * mask.reshape(-1, 1, 1, 1)
    y.backward(gy)
    add("batch_norm", "bn", (b, h * w, c),
        {"x": x, "weight": weight, "bias": bias, "mask": mask, "running_mean": running[0],
         "running_var": running[1], "gy": gy,
         "momentum_eps": torch.tensor([decompositions.BN_MOMENTUM, decompositions.BN_EPS])},
        {"y": y, "new_mean": new_mean, "new_var": new_var, "gx": x.grad, "gw": weight.grad, "gb": bias.grad})

    x = torch.randn(999, generator=gen).round(decimals=1).requires_grad_()  # exact zeros: no gradient there
    g = torch.randn(999, generator=gen)
    y = torch.relu(x)
    y.backward(g)
    add("relu", "relu", (999,), {"x": x, "g": g}, {"y": y, "gx": x.grad})

    b, h, w, c, k = 2, 9, 9, 5, 3
    x = torch.randn(b, h, w, c, generator=gen).round(decimals=1)  # ties: torch's first maximum wins
    x[:, :, 1::k] = x[:, :, ::k][:, :, :x[:, :, 1::k].shape[2]]
    x.requires_grad_()
    y = F.max_pool2d(x.permute(0, 3, 1, 2), k, k).permute(0, 2, 3, 1)
    gy = torch.randn(y.shape, generator=gen)
    y.backward(gy)
    add("max_pool", "pool", (b, h, w, c, k), {"x": x, "gy": gy}, {"y": y, "gx": x.grad})
    return cases, inputs, want


def test_each_fused_kernel_under_qemu_matches_torch_forward_and_backward(installed, tmp_path):
    cases, inputs, want = _kernel_cases()
    shutil.copy(Path(__file__).with_name("arm64_kernels_driver.py"), tmp_path / "driver.py")
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    np.savez(tmp_path / "inputs.npz", **inputs)
    done = subprocess.run(emulated(installed, tmp_path, f"{PREFIX}/venv/bin/python",
                                   str(tmp_path / "driver.py"), f"{PREFIX}/native/libfedsdk_kernels.so",
                                   str(tmp_path)),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(tmp_path / "outputs.npz") as got:
        assert sorted(got.files) == sorted(want)
        for key, reference in want.items():
            scale = max(1.0, float(np.abs(reference).max()))
            error = float(np.abs(got[key] - reference).max()) / scale  # NaN (an unwritten element) fails
            assert error <= 1e-5, (key, error)
