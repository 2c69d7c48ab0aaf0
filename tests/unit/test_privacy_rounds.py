"""Privacy in the round loop with real torch training on the bundled digits: local DP noises
on the device (``sdk_device.task_runner``, as the in-process grid runs it), the budget stops
a run cleanly, and a device honours the label-noise parameters of ``label_counts``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.recipe import Recipe
from sdk_device.outputs import OUTPUTS, OutputContext, check_reports
from sdk_device.privacy import delta_l2
from sdk_device.protocol.errors import ProtocolError
from server_toolkit.assembly import aggregation_stack
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.models.zoo import model_spec
from server_toolkit.privacy.accountant import central_epsilon, local_epsilon
from server_toolkit.privacy.settings import PrivacySettings
from server_toolkit.rounds.inprocess_grid import InProcessGrid
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.rounds.loop import LoopConfig, NoUpdates, RoundLoop


def _loop(privacy: PrivacySettings, rounds: int, devices: int = 3) -> RoundLoop:
    data = load_dataset("digits", seed=0)
    fleet = [LocalDevice(DeviceInfo(f"d{i}", 40), data.x_train[i * 40:(i + 1) * 40],
                         data.y_train[i * 40:(i + 1) * 40]) for i in range(devices)]
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    method = method_class("fedavg")(spec, Recipe(epochs=1, batch_size=20, lr=0.05))
    loop = RoundLoop(method, InProcessGrid(fleet), LoopConfig(rounds=rounds, seed=0),
                     test_data=(data.x_test[:100], data.y_test[:100]),
                     aggregator=aggregation_stack(method, privacy=privacy))
    loop.start()
    return loop


def test_in_local_mode_each_device_clips_and_noises_its_own_delta():
    clip, z = 0.5, 1.0
    loop = _loop(PrivacySettings(clip=clip, noise_multiplier=z, mode="local"), rounds=1)
    row = loop.run()[0]
    for update in loop.last_updates:
        sent = update.instruction.weights
        assert (update.instruction.recipe.dp_clip, update.instruction.recipe.dp_noise) == (clip, z * clip)
        elements = sum(v.size for v in sent.values() if v.dtype.kind == "f")
        expected = math.sqrt(clip ** 2 + elements * (z * clip) ** 2)  # clipped delta + noise on every weight
        assert delta_l2(sent, update.weights) == pytest.approx(expected, rel=0.02)
    assert row["dp_epsilon"] == pytest.approx(local_epsilon(z, 1, 1e-5))


def test_a_spent_budget_stops_the_run_cleanly_before_the_round_that_would_exceed_it():
    rates = [1.0] * 3  # every device every round: no amplification
    budget = (central_epsilon(3.0, rates[:2], 1e-5) + central_epsilon(3.0, rates, 1e-5)) / 2
    loop = _loop(PrivacySettings(clip=1.0, noise_multiplier=3.0, epsilon_budget=budget), rounds=5)
    rows = loop.run()
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[-1]["dp_epsilon"] <= budget
    assert "privacy budget reached: round 3" in loop.stopped
    too_small = _loop(PrivacySettings(clip=1.0, noise_multiplier=3.0, epsilon_budget=0.01), rounds=2)
    with pytest.raises(NoUpdates, match="privacy budget"):  # a run that did no work is no success
        too_small.run()


def test_a_device_reports_noised_counts_of_every_class_when_asked_and_refuses_bad_parameters():
    params = check_reports({"label_counts": {"epsilon": 2.0, "classes": 10}}, {"model"})["label_counts"]
    y = np.array([0, 0, 1, 3] * 50)
    counts = OUTPUTS["label_counts"].compute(OutputContext(np.zeros((200, 1)), y, {}, 0), params)
    assert len(counts) == 10 and all(isinstance(c, int) and c >= 0 for c in counts)
    assert abs(counts[0] - 100) < 20 and abs(counts[3] - 50) < 20
    assert OUTPUTS["label_counts"].compute(OutputContext(np.zeros((4, 1)), y[:4], {}, 0), {}) == [2, 1, 0, 1]
    for bad in ({"epsilon": 0, "classes": 10}, {"epsilon": 1.0}, {"epsilon": 1.0, "classes": 10, "x": 1}):
        with pytest.raises(ProtocolError):
            check_reports({"label_counts": bad}, {"model"})


def test_simulate_refuses_an_unsupported_combination_in_one_line_before_starting(tmp_path):
    from click.testing import CliRunner

    from server_toolkit.cli.simulate import simulate

    result = CliRunner().invoke(simulate, ["--method", "pfedhn", "--dp-clip", "1", "--grid", "inprocess",
                                           "--runs-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: differential privacy is not supported by pfedhn")
    assert result.output.count("\n") == 1
    assert not any(tmp_path.iterdir())  # nothing started, no run directory
