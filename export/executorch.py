"""Export a spec + loss to an ExecuTorch training program (``pte/1``).

One ``.pte`` holds three methods:

``train``        (x (B, H, W, C), y, sample_mask, *teacher tensors, *dropout masks,
                 *running stats) ->
                 (loss, predictions (B,) int64, *updated running stats, *gradients,
                 *parameters). The joint forward+backward graph of ``torch.export``; the
                 parameters live in the program, the gradients and the parameter tensors
                 themselves are outputs (ExecuTorch's training layout), so a runtime can
                 write new weights into the returned parameter tensors in place.
``eval``         (x, sample_mask, *parameters, *running stats) -> (*logits, features).
                 Forward only; parameters are inputs because a second method does not
                 share the training method's parameter memory.
``fedsdk_meta``  a JSON string: names, shapes and order of every input and output (see
                 ``program_metadata``), so a device needs nothing but the ``.pte``.

Decisions:

* The batch is fixed at ``max_batch`` (a static memory plan, no dynamic-shape kernels); a
  short last batch is padded and masked (``sample_mask``), which is exact: padding is
  excluded from the loss and from BatchNorm statistics.
* Layers are lowered by ``export.program_model`` / ``export.decompositions`` before
  export (not patched in the joint graph afterwards): the joint graph then contains no
  op whose ExecuTorch 1.5.1 kernel is missing or wrong, and convolutions are im2col +
  matrix multiply.
* XNNPACK: its convolution/linear delegates take the weights as constants (baked in, so
  they cannot train), but after the lowering every weight reaches the matrix products as
  a run-time tensor (permuted/reshaped into an im2col matrix, ``bmm`` operands), which
  XNNPACK's ``bmm``, element-wise, copy and transpose delegates accept. So the default
  backend delegates the joint graph to XNNPACK (training parity is the same as on the
  portable kernels: the parity tests pass 5 optimizer steps through it) and runs the rest
  on the portable/optimized kernels; ``backend="portable"`` skips XNNPACK.
* Gradient outputs and parameter outputs come in different orders in ExecuTorch's
  layout (gradients in signature order, parameters in graph-input order; the stock
  ``TrainingModule`` pairs them up wrongly when BatchNorm is present), so the metadata
  lists both orders explicitly.
"""

from __future__ import annotations

import json
import time
import warnings

import torch
from torch import nn

from fedcore import modelspec
from fedcore.losses import Loss
from fedcore.torch_model import build_model
from sdk_device.runtimes.pte_contract import FORMAT, KERNEL_SETS, META_METHOD, SCHEMA

from .program_model import ProgramModel


class TrainStep(nn.Module):
    """The training method: the model's loss, predictions and updated running stats."""

    def __init__(self, model: ProgramModel, loss: Loss, extra_names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.loss = loss
        self.extra_names = extra_names
        self.num_dropout = len(model.dropout_shapes)

    def forward(self, x, y, sample_mask, *rest):
        extras = dict(zip(self.extra_names, rest[:len(self.extra_names)], strict=True))
        rest = rest[len(self.extra_names):]
        dropout_masks, running = list(rest[:self.num_dropout]), list(rest[self.num_dropout:])
        outputs, features, new_running = self.model(x, sample_mask, dropout_masks, running)
        loss = self.loss(outputs, features, y, sample_mask, extras)
        predictions = outputs[-1].detach().argmax(dim=1)
        return (loss, predictions, *new_running)


class EvalStep(nn.Module):
    """The eval method: the model with parameters and running stats given as inputs."""

    def __init__(self, model: ProgramModel) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)  # not a submodule: its weights are inputs here
        self.param_names = [name for name, _ in model.named_parameters()]

    def forward(self, x, sample_mask, *rest):
        params = dict(zip(self.param_names, rest[:len(self.param_names)], strict=True))
        running = list(rest[len(self.param_names):])
        outputs, features, _ = torch.func.functional_call(self._model, params, (x, sample_mask, [], running))
        return (*outputs, features)


def example_inputs(meta: dict, method: str) -> tuple[torch.Tensor, ...]:
    """Tensors with the shapes and dtypes of ``meta[method + "_inputs"]`` (for tracing)."""
    tensors = []
    for _, shape, dtype in meta[f"{method}_inputs"]:
        if dtype == "int64":
            tensors.append(torch.zeros(shape, dtype=torch.int64))
        else:
            tensors.append(torch.rand(shape) + 0.5)  # positive: valid masks and variances
    return tuple(tensors)


def program_metadata(spec: dict, loss: Loss, max_batch: int, model: ProgramModel) -> dict:
    """Every input and output of the program, in order, as [name, shape, dtype] lists.

    Shapes include the batch dimension ``max_batch``. Gradient/parameter output orders are
    added by ``export_training_program`` once the program exists.
    """
    b = max_batch
    params = [[name, list(p.shape)] for name, p in model.named_parameters()]
    running = [[name, list(shape)] for name, shape in zip(model.running_names, model.running_shapes,
                                                         strict=True)]
    extras = loss.extra_inputs(spec["num_classes"], model.feature_size)
    dropout = [[f"dropout:{name}", p, list(shape)] for name, p, shape in model.dropout_shapes]
    c, h, w = spec["input_shape"]
    train_inputs = ([["x", [b, h, w, c], "float32"], ["y", [b], "int64"],
                     ["sample_mask", [b], "float32"]]
                    + [[name, [b, *shape], "float32"] for name, shape in extras]
                    + [[name, [b, *shape], "float32"] for name, _, shape in dropout]
                    + [[name, shape, "float32"] for name, shape in running])
    eval_inputs = ([["x", [b, h, w, c], "float32"], ["sample_mask", [b], "float32"]]
                   + [[name, shape, "float32"] for name, shape in params]
                   + [[name, shape, "float32"] for name, shape in running])
    n_out = modelspec.num_outputs(spec)
    return {
        "format": FORMAT,
        "schema": SCHEMA,
        "max_batch": b,
        "input_shape": list(spec["input_shape"]),
        "input_layout": "NHWC",  # x is fed channels-last: (B, H, W, C)
        "num_classes": spec["num_classes"],
        "num_outputs": n_out,
        "feature_size": model.feature_size,
        "loss": loss.to_dict(),
        "params": params,
        "running": running,
        "extras": [[name, list(shape)] for name, shape in extras],
        "dropout": dropout,
        "train_inputs": train_inputs,
        "train_outputs": ["loss", "predictions", *[name for name, _ in running]],
        "eval_inputs": eval_inputs,
        "eval_outputs": [*[f"logits:{i}" for i in range(n_out)], "features"],
    }


def _strip(name: str) -> str:
    return name.removeprefix("model.")


def _training_orders(train_ep) -> tuple[list[str], list[str]]:
    """(gradient output order, parameter output order) of the joint ``train`` graph:
    gradients follow the output signature, ExecuTorch appends the parameters in the order
    of the graph's parameter inputs."""
    from torch.export.graph_signature import InputKind, OutputKind

    signature = train_ep.graph_signature
    grads = [s.target for s in signature.output_specs if s.kind == OutputKind.GRADIENT_TO_PARAMETER]
    params = [s.target for s in signature.input_specs if s.kind == InputKind.PARAMETER and s.target in grads]
    return [_strip(n) for n in grads], [_strip(n) for n in params]


def fold_permute_pairs(program) -> int:
    """Rewrite every ``permute(permute(x))`` of the joint graph as one permute of ``x``
    (an ``alias`` when the two cancel), in place; returns how many were rewritten.

    Autograd's ``mm`` backward transposes twice to return a gradient in the layout of a
    transposed weight; ExecuTorch copies on every permute, and its portable permute is slow.
    Nodes are rewritten rather than replaced so output names (the graph signature) stay.
    """
    aten = torch.ops.aten
    graph = program.graph_module.graph
    folded = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target != aten.permute.default:
            continue
        inner = node.args[0]
        if getattr(inner, "target", None) != aten.permute.default:
            continue
        outer_dims, inner_dims = node.args[1], inner.args[1]
        dims = [inner_dims[d] for d in outer_dims]
        if dims == list(range(len(dims))):
            node.target, node.args = aten.alias.default, (inner.args[0],)
        else:
            node.args = (inner.args[0], dims)
        folded += 1
    graph.eliminate_dead_code()
    program.graph_module.recompile()
    return folded


BACKENDS = ("xnnpack", "portable")


def export_training_program(spec: dict, loss: dict, max_batch: int, seed: int = 0,
                            backend: str = "xnnpack", kernels: str = "portable") -> bytes:
    """The ``.pte`` bytes of (spec, loss) with a fixed batch of ``max_batch`` samples.

    ``loss`` is a loss dict (see ``fedcore.losses``); ``seed`` sets the initial weights
    stored in the program (a runtime overwrites them with each task's weights).
    ``backend``: "xnnpack" delegates what XNNPACK supports (the matrix products, element-
    wise ops, copies) to it; "portable" runs every op on ExecuTorch's CPU kernels.
    ``kernels``: "portable" writes every layer in ATen ops (runs on any ExecuTorch runtime);
    "fused" uses the ``fedsdk::`` training ops of ``export.fused_ops`` / ``fused_batch_norm``
    where they apply (groups == 1 convolutions, batch-statistics BatchNorm, ReLU, max-pool),
    which only a runtime with ``libfedsdk_kernels``
    can run; the metadata's "kernels" field says which set the program needs.
    """
    return export_with_stats(spec, loss, max_batch, seed, backend, kernels)[0]


def export_with_stats(spec: dict, loss: dict, max_batch: int, seed: int = 0,
                      backend: str = "xnnpack", kernels: str = "portable") -> tuple[bytes, dict]:
    """``export_training_program`` plus {"export_s": seconds, "size_bytes": ...}."""
    from executorch.exir import EdgeCompileConfig, to_edge, to_edge_transform_and_lower
    from torch.export import export
    from torch.export.experimental import _export_forward_backward

    started = time.perf_counter()
    modelspec.validate(spec)
    if not (isinstance(max_batch, int) and max_batch > 0):
        raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    if kernels not in KERNEL_SETS:
        raise ValueError(f"kernels {kernels!r} is not one of {KERNEL_SETS}")
    loss_recipe = Loss.from_dict(loss)
    reference = build_model(spec, seed=seed)
    train_model = ProgramModel(spec, training=True, kernels=kernels)
    eval_model = ProgramModel(spec, training=False, kernels=kernels)
    initial = {name: p.detach().clone() for name, p in reference.named_parameters()}
    train_model.load_state_dict(initial)
    eval_model.load_state_dict(initial)
    meta = program_metadata(spec, loss_recipe, max_batch, train_model)
    meta["backend"] = backend
    if kernels != "portable":
        meta["kernels"] = kernels  # absent = portable: programs of older exports stay byte-identical

    extra_names = [name for name, _ in meta["extras"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_ep = export(TrainStep(train_model, loss_recipe, extra_names), example_inputs(meta, "train"),
                          strict=False)
        train_ep = _export_forward_backward(train_ep)
        fold_permute_pairs(train_ep)
        eval_ep = export(EvalStep(eval_model), example_inputs(meta, "eval"), strict=False)
        meta["gradient_order"], meta["parameter_output_order"] = _training_orders(train_ep)
        methods = {"train": train_ep, "eval": eval_ep}
        constants = {META_METHOD: json.dumps(meta, sort_keys=True)}
        config = EdgeCompileConfig(_check_ir_validity=False)
        if backend == "xnnpack":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            edge = to_edge_transform_and_lower(methods, partitioner=[XnnpackPartitioner()],
                                               constant_methods=constants, compile_config=config)
        else:
            edge = to_edge(methods, constant_methods=constants, compile_config=config)
        program = edge.to_executorch()
    data = program.buffer
    return data, {"export_s": time.perf_counter() - started, "size_bytes": len(data)}
