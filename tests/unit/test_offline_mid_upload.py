"""A device whose link drops while the server pulls its result is waited for a while: the broker
says ``offline`` 45 s into a silent link, and the device offers its result again when it is back
(``mqtt_presence.py``). One gone without a result in flight leaves the round at once."""

from __future__ import annotations

import time

from server_toolkit.rounds import mqtt_presence

from .test_task_resend import grid_with_open_tasks


def test_a_device_offline_after_its_pull_timed_out_is_awaited_then_given_up(tmp_path, monkeypatch):
    grid, _ = grid_with_open_tasks(tmp_path)
    grid._record_rejection(4, "a", grid._task_of["a"], "timeout", "no chunk for 25 s")  # link down mid-pull
    grid._on_status("a", "offline")
    grid._on_status("b", "offline")  # trained, never sent a result: nothing in flight
    assert "a" not in grid._resolved and "a" in grid._left
    assert "b" in grid._resolved
    monkeypatch.setattr(mqtt_presence.time, "monotonic", lambda: time.perf_counter() + 10 * 3600.0)
    grid._check_away()  # long past the grace: the round stops waiting
    assert "a" in grid._resolved and not grid._away


def test_a_device_back_within_the_grace_is_awaited_for_its_result(tmp_path):
    grid, endpoint = grid_with_open_tasks(tmp_path)
    grid._record_rejection(4, "a", grid._task_of["a"], "timeout", "no chunk for 25 s")
    grid.registry.record_hello("a", {}, ["torch"], 10)
    grid._on_status("a", "offline")
    grid._on_status("a", "online")
    grid._check_away()
    assert "a" not in grid._resolved and "a" not in grid._left and not grid._away
    assert [peer for peer, _ in endpoint.sent] == ["a"]  # its open task, again


def test_a_device_offline_after_a_rejection_of_its_own_data_leaves_at_once(tmp_path):
    grid, _ = grid_with_open_tasks(tmp_path)
    grid._record_rejection(4, "a", grid._task_of["a"], "non_finite", "NaN in conv1.weight")
    grid._on_status("a", "offline")
    assert "a" in grid._resolved and not grid._away
