"""Training-step speed of each on-device runtime relative to torch eager, per model.

For each model (the small CNN, HypeMeFed's multi-exit VGG, a ResNet-18-style tier model;
3x32x32 inputs, 10 classes) and each runtime: milliseconds per training step through the
runtime's own ``train`` (forward, backward, optimizer update, batching), the ratio to
torch eager with the same threads, batch and model, the program size and export time,
and gradient parity on one batch (|loss error|, max relative gradient error).

The ``executorch`` rows use the default export: the lowering of ``export.decompositions``
(im2col + ``bmm``, mask-based ReLU and pooling) delegated to XNNPACK where it can run it.
``--variants`` adds rows on the small CNN that show where the speed comes from: the same
lowering on portable kernels only, the portable ``aten.convolution`` kernel instead of
im2col (timing only: its program uses the buggy max-pool backward), two threads, and
XNNPACK's own inference path (conv/linear delegated with baked-in weights: eval only),
timed as an eval forward pass against torch eval.

Usage:
    .venv/bin/python bench/runtimes.py [--batch 32] [--threads 1] [--steps 8] [--repeats 3]
                                       [--models small_cnn,vgg_multi_exit,resnet18_tier] [--variants]
                                       [--fused] [--only-fused] [--stock] [--stock-steps 2]

``--fused`` adds the row ``executorch-native, fused``: the program exported with
``kernels="fused"`` (groups == 1 convolutions, train-mode BatchNorm, ReLU and max-pool as
``fedsdk::`` ops, run by libfedsdk_kernels) on the torch-free runtime, timed in the same alternation;
``--only-fused`` times torch and that program alone (no default export: minutes saved on the
VGG and the ResNet tier). With ``--threads 2`` the fused kernels' convolutions run on two threads
of ExecuTorch's pool, torch on two threads. ``--stock`` adds ``executorch-native, stock``: the
stock ExecuTorch training export (``bench/stock_export.py``: ATen layer ops, ``to_edge`` with no
partitioner, portable kernels), timed over ``--stock-steps`` steps per repeat (its steps take
seconds) in the same alternation.

Gradient parity runs on the first of the bench's batches whose float64 forward pass stays at
least ``PARITY_MARGIN`` (1e-6) from the loss's kinks (``export.parity.kink_margin``: ReLU inputs near 0,
max-pool windows with two near-equal maxima): closer, float32 rounding may put an input on either
side and the gradient is not defined to 1e-5. The samples and their margin are printed.

The ``executorch-native`` row is the torch-free runtime (the same program through the native
shim, ``sdk_device.runtimes.native_program``), timed in turn with torch and ``executorch``.

Timing: each row's median over ``repeats`` runs of ``steps`` steps, after a warm-up
step; torch and the other runtimes are measured in alternation so load changes on a
shared machine hit both (the note of the executorch rows: the ratio of the fastest repeats,
less sensitive to load). The machine's load average is printed with the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.stock_export import export_stock  # noqa: E402
from export.executorch import export_with_stats  # noqa: E402
from export.parity import gradient_parity, kink_margin  # noqa: E402
from fedcore import modelspec  # noqa: E402
from fedcore.recipe import Recipe  # noqa: E402
from fedcore.torch_model import build_model, state_numpy  # noqa: E402
from sdk_device.runtimes.executorch_native_runtime import NativeExecutorchRuntime  # noqa: E402
from sdk_device.runtimes.executorch_runtime import ExecutorchRuntime  # noqa: E402
from sdk_device.runtimes.torch_runtime import TorchRuntime  # noqa: E402
from server_toolkit.models.zoo import model_spec  # noqa: E402

INPUT = (3, 32, 32)
PARITY_MARGIN = 1e-6
MODELS: dict[str, Callable[[], dict]] = {
    "small_cnn": lambda: model_spec("small_cnn", INPUT, 10),
    "vgg_multi_exit": lambda: model_spec("vgg_multi_exit", INPUT, 10),
    # ResNet-18's layout (4 stages x 2 basic blocks) at a quarter of its width: a tier model
    "resnet18_tier": lambda: model_spec("resnet_small", INPUT, 10, widths=(16, 32, 64, 128),
                                        blocks_per_stage=2),
}


@dataclass
class Row:
    model: str
    runtime: str
    ms_per_step: float
    ratio: float | None = None
    program_kb: float | None = None
    export_s: float | None = None
    loss_error: float | None = None
    grad_error: float | None = None
    note: str = ""


@dataclass
class Setup:
    name: str
    spec: dict
    weights: dict[str, np.ndarray]
    x: np.ndarray
    y: np.ndarray
    recipe: Recipe
    args: argparse.Namespace


def _data(spec: dict, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, *spec["input_shape"])).astype(np.float32),
            rng.integers(0, spec["num_classes"], n))


def time_train(runtime, setup: Setup) -> Callable[[], float]:
    """A function that trains ``steps`` steps from the same weights and returns ms/step."""
    recipe = setup.recipe

    def run() -> float:
        runtime.set_weights(setup.weights)
        started = time.perf_counter()
        runtime.train(setup.x, setup.y, recipe)
        return (time.perf_counter() - started) * 1000.0 / setup.args.steps

    runtime.set_weights(setup.weights)
    runtime.train(setup.x[:recipe.batch_size], setup.y[:recipe.batch_size], recipe)  # warm-up
    return run


def measure_pair(reference: Callable[[], float], candidate: Callable[[], float], repeats: int
                 ) -> tuple[float, float]:
    """Median ms/step of both, measured in alternation."""
    ref, cand = [], []
    for _ in range(repeats):
        ref.append(reference())
        cand.append(candidate())
    return statistics.median(ref), statistics.median(cand)


# -- runtime rows: each returns (label, timer, extra row fields) for one model ---------------------
def torch_timer(setup: Setup) -> Callable[[], float]:
    runtime = TorchRuntime(threads=setup.args.threads)
    runtime.load_program(modelspec.dumps(setup.spec), modelspec.FORMAT)
    return time_train(runtime, setup)


def parity_batch(setup: Setup) -> tuple[slice, float]:
    """(samples, kink margin) of the first of the bench's batches whose first n samples stay
    PARITY_MARGIN from the kinks, n = the batch, then halved down to 2 (a big model's full
    batch has millions of ReLU inputs, some always within 1e-6 of 0); else the largest margin
    seen. The program pads and masks a short batch."""
    b = setup.recipe.batch_size
    seen = []
    n = b
    while n >= 2:
        for start in range(0, len(setup.y) - b + 1, b):
            samples = slice(start, start + n)
            seen.append((kink_margin(setup.spec, setup.weights, setup.x[samples]), samples))
            if seen[-1][0] >= PARITY_MARGIN:
                return samples, seen[-1][0]
        n //= 2
    margin, samples = max(seen, key=lambda pair: pair[0])
    return samples, margin


def executorch_rows(setup: Setup, reference: Callable[[], float]) -> list[Row]:
    """torch, the Python-bindings ``executorch`` runtime and the torch-free ``executorch-native``
    runtime on the same program, timed in alternation (one of each per repeat)."""
    b = setup.recipe.batch_size
    samples, margin = parity_batch(setup)
    px, py = setup.x[samples], setup.y[samples]
    print(f"{setup.name}: gradient parity on samples {samples.start}..{samples.stop - 1} "
          f"(kink margin {margin:.1e})", flush=True)
    arms = []
    if not setup.args.only_fused:
        program, stats = export_with_stats(setup.spec, {"kind": "ce"}, b)
        arms += [(ExecutorchRuntime, program, stats, ""), (NativeExecutorchRuntime, program, stats, "")]
    if setup.args.fused or setup.args.only_fused:
        fused, fused_stats = export_with_stats(setup.spec, {"kind": "ce"}, b, kernels="fused")
        arms.append((NativeExecutorchRuntime, fused, fused_stats, ", fused"))
    if setup.args.stock:
        stock, stock_stats = export_stock(setup.spec, b)
        arms.append((NativeExecutorchRuntime, stock, stock_stats, ", stock"))
    rows = [Row(setup.name, "torch", 0.0, 1.0)]
    timers = [reference]
    for runtime_class, arm_program, arm_stats, suffix in arms:
        runtime = runtime_class(threads=setup.args.threads)
        runtime.load_program(arm_program, "pte/1")
        parity = gradient_parity(arm_program, setup.spec, setup.weights, px, py, {"kind": "ce"},
                                 runtime_class=runtime_class)
        timers.append(time_train(runtime, stock_setup(setup) if suffix == ", stock" else setup))
        rows.append(Row(setup.name, runtime.name + suffix, 0.0, None, len(arm_program) / 1024,
                        arm_stats["export_s"], parity.loss_error, parity.grad_error))
    samples = measure_alternating(timers, setup.args.repeats)
    for row, times in zip(rows, samples, strict=True):
        row.ms_per_step = statistics.median(times)
        row.ratio = row.ms_per_step / statistics.median(samples[0])
        best = min(times) / min(samples[0])
        row.note = f"fastest repeat {best:.2f}x torch's fastest" if row.runtime != "torch" else ""
        if row.runtime.endswith(", stock"):
            row.note += f"; {setup.args.stock_steps} steps per repeat"
    return rows


def stock_setup(setup: Setup) -> Setup:
    """``setup`` with only ``--stock-steps`` batches (a stock step takes seconds)."""
    n = setup.recipe.batch_size * setup.args.stock_steps
    args = argparse.Namespace(**{**vars(setup.args), "steps": setup.args.stock_steps})
    return dataclasses.replace(setup, x=setup.x[:n], y=setup.y[:n], args=args)


def measure_alternating(timers: list[Callable[[], float]], repeats: int) -> list[list[float]]:
    """ms/step of each timer, ``repeats`` times, one of each in turn."""
    samples: list[list[float]] = [[] for _ in timers]
    for _ in range(repeats):
        for timer, times in zip(timers, samples, strict=True):
            times.append(timer())
    return samples


# PART B adds its runtimes here: a function (setup, torch timer) -> rows, like executorch_rows.
RUNTIME_ROWS: list[Callable[[Setup, Callable[[], float]], list[Row]]] = [executorch_rows]


# -- ExecuTorch speed variants (small CNN) ---------------------------------------------------------
def _set_threads(threads: int) -> None:
    """Thread count of torch and of ExecuTorch's (process-wide) threadpool."""
    from executorch.extension.pybindings import portable_lib

    torch.set_num_threads(threads)
    portable_lib._unsafe_reset_threadpool(threads)


def _native_conv2d(x, weight, bias, stride, pad, groups):
    """The portable aten.convolution kernel on a channels-first view (timing only)."""
    out = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), weight, bias, stride, pad, groups=groups)
    return out.permute(0, 2, 3, 1)


def variant_rows(setup: Setup, reference: Callable[[], float]) -> list[Row]:
    import export.decompositions as ops

    rows = []
    b = setup.recipe.batch_size
    for label, backend, conv, note in [
            ("executorch: portable only", "portable", None, "same lowering, no XNNPACK delegate"),
            ("executorch: aten conv", "portable", _native_conv2d,
             "portable aten.convolution instead of im2col (timing only)")]:
        im2col = ops.conv2d
        ops.conv2d = conv or im2col
        try:
            program, stats = export_with_stats(setup.spec, {"kind": "ce"}, b, backend=backend)
        finally:
            ops.conv2d = im2col
        runtime = ExecutorchRuntime(threads=setup.args.threads)
        runtime.load_program(program, "pte/1")
        torch_ms, ms = measure_pair(reference, time_train(runtime, setup), setup.args.repeats)
        rows.append(Row(setup.name, label, ms, ms / torch_ms, len(program) / 1024, stats["export_s"],
                        note=note))

    threads = 2
    program = export_with_stats(setup.spec, {"kind": "ce"}, b)[0]
    torch_rt = TorchRuntime(threads=threads)
    torch_rt.load_program(modelspec.dumps(setup.spec), modelspec.FORMAT)
    et_rt = ExecutorchRuntime(threads=threads)
    et_rt.load_program(program, "pte/1")
    torch_ms2, ms2 = measure_pair(time_train(torch_rt, setup), time_train(et_rt, setup), setup.args.repeats)
    rows.append(Row(setup.name, f"torch, {threads} threads", torch_ms2, 1.0))
    rows.append(Row(setup.name, f"executorch, {threads} threads", ms2, ms2 / torch_ms2,
                    note="ratio to torch with the same threads"))
    _set_threads(setup.args.threads)
    rows += xnnpack_eval_rows(setup)
    return rows


def xnnpack_eval_rows(setup: Setup) -> list[Row]:
    """Eval forward of a batch: torch eval vs XNNPACK-delegated ExecuTorch (inference only)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    b = setup.recipe.batch_size
    model = build_model(setup.spec, seed=0).eval()
    x = torch.from_numpy(setup.x[:b])

    class FinalLogits(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, inputs):
            return self.net(inputs)[-1]

    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(FinalLogits(model), (x,), strict=False)
        program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    export_s = time.perf_counter() - started
    module = _load_for_executorch_from_buffer(program)
    with torch.no_grad():
        expected = model(x)[-1]
    error = float((module.run_method("forward", (x,))[0] - expected).abs().max())

    def torch_eval() -> float:
        started = time.perf_counter()
        with torch.no_grad():
            for _ in range(setup.args.steps):
                model(x)
        return (time.perf_counter() - started) * 1000.0 / setup.args.steps

    def xnnpack_eval() -> float:
        started = time.perf_counter()
        for _ in range(setup.args.steps):
            module.run_method("forward", (x,))
        return (time.perf_counter() - started) * 1000.0 / setup.args.steps

    torch_ms, ms = measure_pair(torch_eval, xnnpack_eval, setup.args.repeats)
    return [Row(setup.name, "torch eval (forward)", torch_ms, 1.0),
            Row(setup.name, "executorch+xnnpack eval", ms, ms / torch_ms, len(program) / 1024, export_s,
                note=f"inference only; max |logit error| {error:.1e}")]


def format_table(rows: list[Row]) -> str:
    header = (f"{'model':<15} {'runtime':<27} {'ms/step':>9} {'x torch':>8} {'.pte KB':>9} {'export s':>9} "
              f"{'loss err':>9} {'grad err':>9}  note")
    lines = [header, "-" * len(header)]
    for r in rows:
        def fmt(value, spec):
            return "-" if value is None else format(value, spec)

        lines.append(f"{r.model:<15} {r.runtime:<27} {r.ms_per_step:>9.1f} {fmt(r.ratio, '.2f'):>8} "
                     f"{fmt(r.program_kb, '.0f'):>9} {fmt(r.export_s, '.1f'):>9} "
                     f"{fmt(r.loss_error, '.1e'):>9} {fmt(r.grad_error, '.1e'):>9}  {r.note}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", action="store_true", help="ExecuTorch speed variants on the small CNN")
    parser.add_argument("--fused", action="store_true",
                        help="add an executorch-native row for the program exported with kernels='fused'")
    parser.add_argument("--only-fused", action="store_true",
                        help="time torch and the fused program only (skips the default export, which takes "
                             "minutes for the VGG and the ResNet tier)")
    parser.add_argument("--stock", action="store_true",
                        help="add the stock ExecuTorch training export (ATen layer ops, to_edge, no "
                             "partitioner, portable kernels) on the torch-free runtime")
    parser.add_argument("--stock-steps", type=int, default=2,
                        help="stock program training steps per repeat (default 2: a step takes seconds)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    rows: list[Row] = []
    for name in args.models.split(","):
        spec = MODELS[name]()
        x, y = _data(spec, args.batch * args.steps)
        recipe = Recipe(epochs=1, batch_size=args.batch, optimizer="sgd", lr=0.01, momentum=0.9)
        setup = Setup(name, spec, state_numpy(build_model(spec, seed=0)), x, y, recipe, args)
        reference = torch_timer(setup)
        for make_rows in RUNTIME_ROWS:
            for row in make_rows(setup, reference):
                torch_done = any(q.model == name and q.runtime == "torch" for q in rows)
                if not (row.runtime == "torch" and torch_done):  # one torch row per model
                    rows.append(row)
        if args.variants and name == "small_cnn":
            rows += variant_rows(setup, reference)
        print(format_table([r for r in rows if r.model == name]), flush=True)
        print(flush=True)
    load = os.getloadavg()
    print(f"batch {args.batch}, {args.threads} thread(s), {args.steps} steps x {args.repeats} repeats, "
          f"SGD momentum; load average {load[0]:.1f} on {os.cpu_count()} cores")
    print(format_table(rows))


if __name__ == "__main__":
    main()
