"""The reference agent refuses, before it trains, a task whose privacy recipe it cannot honour
under secure aggregation: ``dp_secure_clip`` outside a secure round, ``dp_secure_clip`` or
local DP with a layout that weighs a tensor per class, ``dp_secure_clip`` at or below the
fixed-point rounding of the layout's elements; each as ``unsupported_task`` with its reason."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fedcore.recipe import Recipe
from fedcore.secagg.layout import CLASSES, Layout, Placement
from sdk_device.agent import AgentConfig, DeviceAgent
from sdk_device.data.npz import save_npz
from sdk_device.protocol import messages as msgs

REF = msgs.BlobRef(id="ab" * 32, size=10, kind="weights", format="safetensors")
FULL = Layout(6, {"w": Placement(0, (3, 2), ())}, per_element=False)
PER_CLASS = Layout(6, {"w": Placement(0, (3, 2), (), CLASSES)}, per_element=True)


class RecordingEndpoint:
    """What the agent sends; it must never be asked to fetch (the task is refused first)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, msgs.Message]] = []

    def send(self, peer: str, message: msgs.Message) -> None:
        self.sent.append((peer, message))

    def fetch(self, *args, **kwargs):
        raise AssertionError("a refused task loads nothing")


def _agent(tmp_path) -> tuple[DeviceAgent, RecordingEndpoint]:
    save_npz(tmp_path / "d.npz", np.zeros((4, 1, 2, 3), np.float32), np.arange(4) % 3)
    endpoint = RecordingEndpoint()
    config = AgentConfig("mqtt://127.0.0.1:1883", "lab", "d0", tmp_path / "d.npz", tmp_path / "work")
    return DeviceAgent(config, endpoint=endpoint), endpoint


def _task(recipe: Recipe) -> msgs.Task:
    config = {"steps": [{"train": "model", "recipe": recipe.to_dict()}], "return": ["model"], "report": {}}
    now = time.time()
    return msgs.Task(task_id=msgs.new_id(), round=3, programs={"model": [REF]}, arrays={"model": REF},
                     config=config, deadline=now + 60, server_time=now)


CASES = [
    (None, Recipe(dp_secure_clip=1.0), "no secure round was set up"),
    (PER_CLASS, Recipe(dp_secure_clip=1.0), "weighs a tensor per class"),
    (PER_CLASS, Recipe(dp_clip=1.0, dp_noise=0.5), "weighs a tensor per class"),
    (FULL, Recipe(dp_secure_clip=1e-9), "at or below the fixed-point rounding of 6 elements"),
]


@pytest.mark.parametrize(("layout", "recipe", "words"), CASES,
                         ids=["outside a secure round", "secure clip per class", "local DP per class",
                              "clip below the rounding"])
def test_the_agent_refuses_a_secure_privacy_recipe_it_cannot_honour_before_training(tmp_path, layout, recipe,
                                                                                    words):
    agent, endpoint = _agent(tmp_path)
    if layout is not None:
        agent.secagg.setups[3] = {"layout": layout.to_json()}
    task = _task(recipe)
    agent._run_task(task, time.monotonic())
    [(peer, error)] = endpoint.sent
    assert isinstance(error, msgs.Error) and error.ref == task.task_id
    assert error.code == "unsupported_task" and words in error.detail, error.detail
    assert agent._trained == 0


def test_a_secure_round_setup_without_a_layout_is_refused_with_its_reason(tmp_path):
    agent, endpoint = _agent(tmp_path)
    agent.secagg.setups[3] = {}
    agent._run_task(_task(Recipe(dp_secure_clip=1.0)), time.monotonic())
    [(_, error)] = endpoint.sent
    assert error.code == "unsupported_task" and "setup has no layout" in error.detail
