"""The MQTT grid's open round as a ``LiveRound`` (``MqttGrid.live``), kept apart from the grid's
message handling: who was asked, accepted, is being pulled (``uploading``), went offline, was
rejected, and the training progress the devices' heartbeats report."""

from __future__ import annotations

from typing import Any

from .grid import LiveRound, device_states


def live_round(grid: Any) -> LiveRound | None:
    """A copy of ``grid``'s (an ``MqttGrid``: not imported, it imports this module) open exchange,
    taken under its lock (None: no round open)."""
    with grid._lock:
        rnd, tasks, done = grid._open_round, list(grid._pending.values()), set(grid._accepted)
        if rnd is None:
            return None
        asked = sorted({t.instruction.device_id for t in tasks if t.round == rnd})
        accepted = sorted(t.instruction.device_id for t in tasks if t.task_id in done)
        uploading = {dev for dev, _result, _future in grid._pulls.values()}
        states = device_states(asked, accepted, uploading, set(grid._left), dict(grid._last_rejection))
        progress = {dev: grid.progress[dev] for dev in asked if dev in grid.progress}
        return LiveRound(rnd, asked, accepted, dict(grid._rejections), grid._deadline, states, progress)
