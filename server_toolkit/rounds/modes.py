"""The run's mode: synchronous rounds (``RoundLoop`` over ``MqttGrid``) or buffered asynchronous
aggregation (``AsyncLoop`` over ``AsyncMqttGrid``); ``run`` and ``simulate`` build both here."""

from __future__ import annotations

from ..methods.base import Method
from .async_loop import AsyncConfig, AsyncLoop
from .loop import LoopConfig, RoundLoop
from .mqtt_async import AsyncMqttGrid
from .mqtt_grid import MqttGrid

MODES = ("sync", "async")


def async_config(mode: str, buffer: int | None, max_staleness: int | None, concurrency: int | None,
                 server_lr: float | None, eval_every: int | None = None) -> AsyncConfig | None:
    """The async settings of ``mode`` ("async"), None for "sync" (ValueError for another mode)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "sync":
        return None
    defaults = AsyncConfig()
    return AsyncConfig(buffer=buffer if buffer is not None else defaults.buffer,
                       max_staleness=max_staleness if max_staleness is not None else defaults.max_staleness,
                       concurrency=concurrency, server_lr=server_lr if server_lr is not None else 1.0,
                       eval_every=eval_every if eval_every is not None else defaults.eval_every)


def mqtt_grid_class(settings: AsyncConfig | None) -> type[MqttGrid]:
    """The MQTT grid of the mode: ``AsyncMqttGrid`` for async settings, else ``MqttGrid``."""
    return MqttGrid if settings is None else AsyncMqttGrid


def make_loop(method: Method, grid: MqttGrid, config: LoopConfig, settings: AsyncConfig | None,
              **kwargs) -> RoundLoop:
    """The loop of the mode (``kwargs``: run_dir, test_data, on_round, evaluators)."""
    if settings is None:
        return RoundLoop(method, grid, config, **kwargs)
    if not isinstance(grid, AsyncMqttGrid):
        raise TypeError("--mode async needs the async MQTT grid")
    return AsyncLoop(method, grid, config, settings, **kwargs)
