"""A task's plan run on a device (``sdk_device.task_runner``): steps, teachers, returned
models, reported outputs, device-local tensors; the task plan's config record; the
hypernetwork VJP step (synthetic data: unit tests of maths)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore import modelspec
from fedcore.losses import Loss
from fedcore.recipe import Recipe
from sdk_device.local_tensors import LocalTensors
from sdk_device.outputs import OUTPUTS
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.task_plan import TaskPlan, TrainStep, parse_plan, plan_config
from sdk_device.runtimes.torch_runtime import TorchRuntime
from sdk_device.task_runner import LoadedModel, run_task
from server_toolkit.reconstruct.hypernet_step import hypernet_step

SHAPE = (1, 4, 4)


def _data(n: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (y[:, None, None, None] - 1.0) + 0.7 * rng.standard_normal((n, *SHAPE))
    return x.astype(np.float32), y.astype(np.int64)


def _bn_spec(hidden: int = 8) -> dict:
    return modelspec.make(SHAPE, 3, [
        {"op": "conv2d", "in": 1, "out": 4, "k": 3, "pad": 1}, {"op": "batchnorm2d", "c": 4}, {"op": "relu"},
        {"op": "flatten"}, {"op": "linear", "in": 64, "out": hidden}, {"op": "relu"},
        {"op": "linear", "in": hidden, "out": 3}])


def _runtime(spec: dict, seed: int = 0) -> TorchRuntime:
    torch.manual_seed(seed)
    rt = TorchRuntime()
    rt.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    return rt


def _loaded(**runtimes: TorchRuntime) -> dict[str, LoadedModel]:
    return {name: LoadedModel(rt, name, rt.get_weights()) for name, rt in runtimes.items()}


def _teacher_plan(recipe: Recipe, train_teacher: Recipe | None = None, returned: bool = False) -> TaskPlan:
    before = (TrainStep("teacher", train_teacher),) if train_teacher else ()
    return TaskPlan((*before, TrainStep("model", recipe, "teacher")),
                    ("model", "teacher") if returned else ("model",))


def test_recipe_losses_validate_and_map_to_loss_dicts():
    kd = Recipe(loss="kd", temperature=15.0, alpha=0.01)
    assert kd.needs_teacher and kd.loss_dict() == {"kind": "kd", "temperature": 15.0, "alpha": 0.01}
    assert Loss.from_dict(kd.loss_dict()).temperature == 15.0
    assert Recipe(loss="recipfl_kt", teacher_features=8).loss_dict() == {"kind": "recipfl_kt", "features": 8}
    assert not Recipe().needs_teacher and Recipe().loss_dict() == {"kind": "ce"}
    assert Recipe.from_dict(kd.to_dict()) == kd
    for bad in ({"loss": "mse"}, {"alpha": 1.5}, {"temperature": 0.0}, {"teacher_features": -1},
                {"alpha": float("nan")}):
        with pytest.raises(ValueError):
            Recipe(**bad)


def test_predict_returns_logits_and_last_linear_inputs():
    spec = _bn_spec()
    rt = _runtime(spec)
    x, _ = _data(10)
    logits, features = rt.predict(x, batch_size=4)
    assert logits.shape == (10, 3) and features.shape == (10, 8)
    model = rt.model.eval()
    with torch.no_grad():
        last = model.layers[-1]
        np.testing.assert_allclose(last(torch.from_numpy(features)).numpy(), logits, atol=1e-5)
        np.testing.assert_allclose(model(torch.from_numpy(x))[-1].numpy(), logits, atol=1e-5)


def test_kd_with_alpha_one_pulls_the_student_to_the_teacher():
    x, y = _data()
    teacher = _runtime(_bn_spec(), seed=1)
    teacher.train(x, y, Recipe(epochs=5, batch_size=16, lr=0.05))
    target = teacher.predict(x)[0].argmax(1)
    student = _runtime(_bn_spec(4), seed=2)
    before = (student.predict(x)[0].argmax(1) == target).mean()
    recipe = Recipe(epochs=15, batch_size=16, lr=0.05, loss="kd", temperature=2.0, alpha=1.0)
    frozen = teacher.get_weights()
    out = run_task(_teacher_plan(recipe), _loaded(model=student, teacher=teacher), x, np.zeros_like(y),
                   LocalTensors())
    after = (student.predict(x)[0].argmax(1) == target).mean()
    assert set(out.arrays) == {"model"} and "teacher_loss" not in out.metrics  # a frozen teacher
    assert all(np.array_equal(frozen[k], v) for k, v in teacher.get_weights().items())
    assert after >= before + 0.3 and after > 0.75, (before, after)  # labels all 0: the teacher taught it


def test_distillation_without_teacher_outputs_is_refused():
    x, y = _data(20)
    with pytest.raises(ValueError, match="teacher"):
        _runtime(_bn_spec()).train(x, y, Recipe(loss="kd", alpha=0.5))
    with pytest.raises(ProtocolError, match="teacher"):  # a plan whose KD step names no teacher
        parse_plan({"steps": [{"train": "model", "recipe": {"loss": "kd", "alpha": 0.5}}]}, {"model"}, set())
    with pytest.raises(ValueError, match="one row per sample"):
        _runtime(_bn_spec()).train(x, y, Recipe(loss="kd", alpha=0.5),
                                   extras={"teacher_logits": np.zeros((5, 3), np.float32)})


def test_trained_teacher_comes_back_and_kt_uses_its_features():
    x, y = _data()
    teacher, student = _runtime(_bn_spec(8), seed=1), _runtime(_bn_spec(8), seed=2)
    start = teacher.get_weights()
    recipe = Recipe(epochs=2, batch_size=16, lr=0.05, loss="recipfl_kt", teacher_features=8)
    fractions = []
    plan = _teacher_plan(recipe, train_teacher=Recipe(epochs=2, batch_size=16, lr=0.05), returned=True)
    out = run_task(plan, _loaded(model=student, teacher=teacher), x, y, LocalTensors(),
                   progress=fractions.append)
    assert set(out.arrays) == {"model", "teacher"} and np.isfinite(out.metrics["teacher_loss"])
    assert any(not np.array_equal(start[k], out.arrays["teacher"][k]) for k in start)  # the teacher trained
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert out.metrics["samples"] == len(y) and np.isfinite(out.metrics["loss"])
    with pytest.raises(ValueError, match="features"):  # the recipe's feature size must be the teacher's
        run_task(_teacher_plan(Recipe(loss="recipfl_kt", teacher_features=5)),
                 _loaded(model=_runtime(_bn_spec(8)), teacher=teacher), x, y, LocalTensors())


def test_reports_give_label_counts_and_seeded_features_only_when_asked_and_shared():
    x, y = _data(40)
    plan = TaskPlan((TrainStep("model", Recipe(epochs=1, seed=3)),), ("model",),
                    {"label_counts": {}, "features": {"model": "model", "samples": 16}})
    out = run_task(plan, _loaded(model=_runtime(_bn_spec())), x, y, LocalTensors())
    assert out.metrics["label_counts"] == np.bincount(y).tolist()
    assert out.arrays["features"]["x"].shape == (16, 8) and out.arrays["features"]["y"].dtype == np.int64
    again = run_task(plan, _loaded(model=_runtime(_bn_spec())), x, y, LocalTensors())
    np.testing.assert_array_equal(again.arrays["features"]["y"], out.arrays["features"]["y"])  # same seed
    declined = run_task(plan, _loaded(model=_runtime(_bn_spec())), x, y, LocalTensors(), share_features=False)
    assert "features" not in declined.arrays and "label_counts" in declined.metrics
    plain = run_task(TaskPlan((TrainStep("model", Recipe()),)), _loaded(model=_runtime(_bn_spec())), x, y,
                     LocalTensors())
    assert "label_counts" not in plain.metrics and set(plain.arrays) == {"model"}


def test_a_task_config_round_trips_and_bad_configs_are_refused_with_a_code():
    plan = TaskPlan((TrainStep("teacher", Recipe(epochs=2)), TrainStep("model", Recipe(loss="kd", alpha=0.5),
                                                                        "teacher")),
                    ("model", "teacher"), {"label_counts": {}})
    assert parse_plan(plan_config(plan), {"model", "teacher"}, set(OUTPUTS)) == plan
    good = plan_config(plan)
    bad_configs = [
        ({**good, "steps": []}, "invalid_field"),
        ({**good, "steps": [{"train": "ghost", "recipe": {}}]}, "invalid_field"),
        ({**good, "steps": [{"train": "model", "recipe": {"lr": -1}}]}, "invalid_field"),
        ({**good, "return": ["ghost"]}, "invalid_field"),
        ({**good, "return": ["model", "model"]}, "invalid_field"),
        ({**good, "report": {"gradients": {}}}, "unsupported_task"),
        ({**good, "extra": 1}, "invalid_field"),
        ({**good, "steps": [{"train": "Model!", "recipe": {}}]}, "invalid_field"),
    ]
    for config, code in bad_configs:
        with pytest.raises(ProtocolError) as err:
            parse_plan(config, {"model", "teacher"}, set(OUTPUTS))
        assert err.value.code == code, config


def test_local_tensors_fill_gaps_and_persist(tmp_path):
    rt = _runtime(_bn_spec())
    full = rt.get_weights()
    sent = {k: v for k, v in full.items() if "running" not in k}
    local = LocalTensors(tmp_path)
    assert local.complete("p1", full, full) is full  # nothing missing: as sent
    first = local.complete("p1", sent, full)
    assert set(first) == set(full) and all(np.array_equal(first[k], full[k]) for k in full)
    trained = {k: v + 1 for k, v in first.items()}
    upload = local.remember("p1", sent, trained)
    assert set(upload) == set(sent)  # the device returns exactly what it received
    again = LocalTensors(tmp_path).complete("p1", sent, full)  # a restarted agent
    bn = next(k for k in full if k.endswith("running_mean"))
    np.testing.assert_array_equal(again[bn], full[bn] + 1)  # its own statistics, not the server's
    with pytest.raises(KeyError, match="unexpected"):
        local.complete("p1", {**sent, "nope": np.zeros(1)}, full)


def test_hypernet_step_moves_generated_weights_towards_trained():
    torch.manual_seed(0)
    hn = torch.nn.Linear(4, 6)
    z = torch.randn(4)
    target = [torch.randn(2, 3)]

    def distance() -> float:
        return float((hn(z).reshape(2, 3) - target[0]).norm().detach())

    before = distance()
    opt = torch.optim.SGD(hn.parameters(), lr=0.01)
    hypernet_step([hn(z).reshape(2, 3)], target, list(hn.parameters()), opt)
    assert distance() < before
    # the printed sign (trained - generated) pushes the other way
    middle = distance()
    hypernet_step([hn(z).reshape(2, 3)], target, list(hn.parameters()), opt, weight=-1.0)
    assert distance() > middle
    with pytest.raises(ValueError, match="shape"):
        hypernet_step([hn(z)], [torch.zeros(3)], list(hn.parameters()), opt)


def test_label_histograms_are_padded_and_checked():
    from server_toolkit.methods.base import label_histogram

    np.testing.assert_array_equal(label_histogram([3, 0, 2], 5), [3, 0, 2, 0, 0])
    for bad in (None, "x", [1, -1], [1, float("nan")], [[1, 2]], [1] * 6, ["a"]):
        assert label_histogram(bad, 5) is None, bad
