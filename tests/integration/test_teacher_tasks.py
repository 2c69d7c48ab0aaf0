"""Tasks with a teacher model and device-local tensors, over a real mosquitto with real
device processes: the teacher travels as the task's model ``teacher`` (its own program and
weights), a trained teacher comes back as the array record ``teacher``, BatchNorm
statistics the server leaves out stay on the device."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedcore import modelspec
from server_toolkit.methods.base import Method, TrainInstruction
from server_toolkit.methods.records import with_teacher
from server_toolkit.models.zoo import model_spec
from server_toolkit.reconstruct.average import weighted_average

from .harness import RECIPE, Fleet

pytestmark = pytest.mark.integration


def _student_spec(shape, classes) -> dict:
    return modelspec.make(shape, classes, [
        {"op": "conv2d", "in": shape[0], "out": 8, "k": 3, "pad": 1}, {"op": "batchnorm2d", "c": 8},
        {"op": "relu"}, {"op": "maxpool2d", "k": 2}, {"op": "flatten"},
        {"op": "linear", "in": 8 * (shape[1] // 2) * (shape[2] // 2), "out": 64}, {"op": "relu"},
        {"op": "linear", "in": 64, "out": classes}])


class TeacherProbe(Method):
    """dev0 trains a teacher (small_cnn) then distils into the student (RecipFL-style KT);
    dev1 distils from a frozen teacher (KD). Running statistics are never sent."""

    name = ""  # a test method: not registered

    def __init__(self, spec: dict, teacher_spec: dict, recipe) -> None:
        super().__init__(spec, recipe)
        self.teacher_spec = teacher_spec
        self.teacher_weights: dict = {}

    def initial_weights(self, seed: int):
        from fedcore.torch_model import build_model, state_numpy

        self.teacher_weights = state_numpy(build_model(self.teacher_spec, seed=seed + 1))
        return super().initial_weights(seed)

    def configure_train(self, round_number, global_weights, devices):
        sent = {k: v for k, v in global_weights.items() if "running" not in k}
        out = []
        for d in devices:
            strong = d.device_id == "dev0"
            recipe = (replace(RECIPE, loss="recipfl_kt", teacher_features=64) if strong
                      else replace(RECIPE, loss="kd", alpha=0.5, temperature=2.0))
            student = TrainInstruction(d.device_id, self.global_spec, sent, recipe)
            first = replace(RECIPE, loss="ce") if strong else None  # dev0 trains its teacher first
            out.append(with_teacher(student, self.teacher_spec, self.teacher_weights, train_first=first,
                                    returned=strong))
        return out

    def aggregate_train(self, round_number, global_weights, updates):
        self.updates = updates
        students = [(u.weights, u.num_samples) for u in updates]
        return {**global_weights, **weighted_average(students)}


def test_teacher_travels_and_local_statistics_stay_on_the_device(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    shape, classes = fleet.data.input_shape, fleet.data.num_classes
    method = TeacherProbe(_student_spec(shape, classes), model_spec("small_cnn", shape, classes), RECIPE)
    try:
        for dev, path in fleet.write_data(["dev0", "dev1"], "iid").items():
            fleet.start_process(dev, path)
        rows = fleet.run_method(method, rounds=2, devices=2, round_timeout_s=180)
    finally:
        fleet.close()
    assert all(r["accepted"] == 2 and r["rejected"] == 0 for r in rows), rows
    by_device = {u.device_id: u for u in method.updates}
    strong_student, strong_teacher = by_device["dev0"].weights, by_device["dev0"].others.get("teacher", {})
    weak_student, weak_teacher = by_device["dev1"].weights, by_device["dev1"].others.get("teacher", {})
    assert set(strong_teacher) == set(method.teacher_weights) and not weak_teacher
    assert not any("running" in k for k in strong_student) and not any("running" in k for k in weak_student)
    changed = [k for k in strong_teacher if not np.array_equal(strong_teacher[k], method.teacher_weights[k])]
    assert changed  # the strong device trained its teacher
    assert by_device["dev0"].metrics["teacher_accuracy"] > 0.5
    assert rows[-1]["accuracy"] > 0.6, rows
    # each device kept its own BatchNorm statistics between rounds
    kept = list((tmp_path / "dev1" / "work" / "local_state").glob("*.safetensors"))
    assert kept, "the device did not keep its running statistics"
