"""``/metrics``: the run in Prometheus' text format, computed from a ``DashboardState`` at each scrape.

Names follow Prometheus' conventions: the ``fedsdk_`` prefix, ``_total`` for counters, base units
(seconds, bytes). The standard ``process_*`` metrics of the server process (CPU, RSS, open files)
come with them on Linux.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..report.series import is_number
from ..rounds.grid import TRAINING, UPLOADING
from .state import DashboardState

CONTENT_TYPE = CONTENT_TYPE_LATEST
STAGES = {"configure": "time_configure_s", "aggregate": "time_aggregate_s", "evaluate": "time_evaluate_s"}


def resident_bytes() -> float:
    """The server process's resident memory now (Linux: /proc; elsewhere its peak, from getrusage)."""
    statm = Path("/proc/self/statm")
    if statm.exists():
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS


class RunCollector:
    """A prometheus_client collector over one run's ``DashboardState``."""

    def __init__(self, state: DashboardState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        snap = self.state.snapshot()
        rows, fleet = snap.rows, snap.fleet
        yield GaugeMetricFamily("fedsdk_devices_online", "Devices online now.", value=fleet.online)
        yield GaugeMetricFamily("fedsdk_devices_registered", "Devices known to the server.",
                                value=len(fleet.devices))
        yield CounterMetricFamily("fedsdk_rounds_completed", "Rounds closed.", value=len(rows))
        yield CounterMetricFamily("fedsdk_updates_accepted", "Device updates accepted into aggregates.",
                                  value=sum(_number(r, "accepted") for r in rows))
        rejected = CounterMetricFamily("fedsdk_updates_rejected", "Results and messages rejected, by reason.",
                                       labels=["reason"])
        for reason, count in sorted(fleet.rejections_by_reason.items()):
            rejected.add_metric([reason], count)
        yield rejected
        yield SummaryMetricFamily("fedsdk_round_duration_seconds", "Wall-clock seconds per round.",
                                  count_value=len(rows), sum_value=sum(_number(r, "seconds") for r in rows))
        stage = CounterMetricFamily("fedsdk_server_stage_seconds", "Server seconds spent per round stage.",
                                    labels=["stage"])
        for name, key in STAGES.items():
            stage.add_metric([name], sum(_number(r, key) for r in rows))
        yield stage
        last = rows[-1] if rows else {}
        yield CounterMetricFamily("fedsdk_bytes_sent", "Bytes sent to devices.",
                                  value=_number(last, "bytes_down"))
        yield CounterMetricFamily("fedsdk_bytes_received", "Bytes received from devices.",
                                  value=_number(last, "bytes_up"))
        for key, text in (("accuracy", "Global model accuracy after the last round (0..1)."),
                          ("loss", "Global model loss after the last round.")):
            if is_number(last.get(key)):
                yield GaugeMetricFamily(f"fedsdk_{key}", text, value=float(last[key]))
        live = snap.live
        yield GaugeMetricFamily("fedsdk_round_open", "The round in progress (0: none).",
                                value=live.round if live else 0)
        yield GaugeMetricFamily("fedsdk_devices_training", "Devices of the open round still training.",
                                value=live.count(TRAINING) if live else 0)
        yield GaugeMetricFamily("fedsdk_devices_uploading",
                                "Devices of the open round whose result is being pulled.",
                                value=live.count(UPLOADING) if live else 0)
        yield GaugeMetricFamily("fedsdk_server_resident_memory_bytes", "Resident memory of the server.",
                                value=resident_bytes())


def _number(row: dict, key: str) -> float:
    value = row.get(key)
    return float(value) if is_number(value) else 0.0


def metrics_registry(state: DashboardState) -> CollectorRegistry:
    """A registry of its own (not the process-global one) holding the run's and the process's metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(state))
    ProcessCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The text a scrape gets."""
    return generate_latest(registry)
