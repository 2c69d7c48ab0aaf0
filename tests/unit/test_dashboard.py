"""The dashboard without a run: its live-round section, token rules, bind errors and the end of a run."""

from __future__ import annotations

import socket
import time

import pytest

from server_toolkit.observe import pages
from server_toolkit.observe.access import DashboardError, authorized, decide_token, parse_bind
from server_toolkit.observe.fleet_view import DeviceRow, FleetView
from server_toolkit.observe.server import DashboardServer
from server_toolkit.observe.state import DashboardState
from server_toolkit.rounds.grid import Grid, LiveRound
from tests.report_dom import page_tables


class OpenRoundGrid(Grid):
    """A grid in the middle of round 4: three devices asked, one accepted, two rejections."""

    def online(self):
        return []

    def exchange(self, round_number, instructions, deadline, quorum):
        raise NotImplementedError

    def live(self):
        return LiveRound(4, ["a", "b", "c"], ["b"], {"timeout": 1, "non_finite": 1}, time.time() + 42)


def _fleet() -> FleetView:
    return FleetView([DeviceRow("a", "1.0", "torch", time.time() - 5, True, 3, 1, "timeout: too slow"),
                      DeviceRow("b", "0.5", "onnxruntime", None, False)], {"timeout": 1})


def test_the_current_round_shows_who_was_asked_accepted_rejections_by_reason_and_the_deadline():
    state = DashboardState()
    state.begin({"method": "fedavg", "rounds": 10})
    state.watch(_fleet, OpenRoundGrid())
    html = pages.page(state.snapshot())
    tables = page_tables(html)
    round_table = {row[0]: row[1] for row in tables["round"]}
    assert round_table["round"] == "4"
    assert round_table["selected"] == "3: a, b, c"
    assert round_table["accepted"] == "1: b"
    assert round_table["rejected"] == "2 (non_finite × 1, timeout × 1)"
    assert round_table["deadline in"] in ("41 s", "42 s")
    fleet = tables["fleet"]
    assert fleet[1][:5] == ["a", "–", "1.0", "–", "torch"]
    assert fleet[1][6:] == ["online", "3", "1", "timeout: too slow"]
    assert fleet[2][5:7] == ["–", "offline"]
    assert "<script src" not in html and "http" not in html.split("<script>")[1]  # nothing fetched from a CDN


def test_once_the_run_has_ended_no_device_counts_as_online():
    state = DashboardState()
    state.watch(_fleet, OpenRoundGrid())
    assert state.snapshot().fleet.online == 1
    state.finish("failed")
    snap = state.snapshot()
    assert snap.status == "failed" and snap.fleet.online == 0 and len(snap.fleet.devices) == 2


def test_a_token_is_generated_off_loopback_only_and_checked_from_header_or_query():
    assert decide_token(parse_bind("127.0.0.1:8080"), None) is None
    assert decide_token(parse_bind("[::1]:8080"), None) is None
    made = decide_token(parse_bind("0.0.0.0:8080"), None)
    assert made and len(made) >= 20 and made != decide_token(parse_bind("0.0.0.0:8080"), None)
    assert decide_token(parse_bind("192.0.2.7:80"), "given") == "given"
    assert authorized(None, None, None)
    assert authorized("s3cret", "Bearer s3cret", None) and authorized("s3cret", None, "s3cret")
    assert not authorized("s3cret", None, None)
    assert not authorized("s3cret", "Bearer wrong", "s3cret")  # a header, when sent, is what counts
    assert not authorized("s3cret", None, "s3cre")


def test_a_bad_address_or_a_port_in_use_is_a_one_line_error():
    with pytest.raises(DashboardError, match="expected HOST:PORT"):
        parse_bind("localhost:http")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(DashboardError) as caught:
            DashboardServer(DashboardState(), parse_bind(f"127.0.0.1:{port}"), None).start()
    assert str(caught.value) == f"--dashboard 127.0.0.1:{port} is in use"


def test_every_metric_the_grafana_dashboard_queries_is_exported_with_prometheus_conventions():
    import json
    import re
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    from server_toolkit.observe.prometheus_metrics import exposition, metrics_registry

    state = DashboardState()
    state.begin({"rounds": 2})
    state.watch(_fleet, OpenRoundGrid())
    state.add_round({"round": 1, "accepted": 2, "seconds": 1.5, "bytes_down": 10, "bytes_up": 7,
                     "accuracy": 0.5, "loss": 1.0, "time_configure_s": 0.1, "time_aggregate_s": 0.2,
                     "time_evaluate_s": 0.3})
    text = exposition(metrics_registry(state)).decode()
    samples = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    dashboard = (Path(__file__).resolve().parents[2] / "docs" / "grafana-fedsdk.json").read_text()
    queried = set(re.findall(r"fedsdk_[a-z_]+", json.dumps(json.loads(dashboard)["panels"])))
    assert queried and queried <= samples, queried - samples
    counters = [f for f in text_string_to_metric_families(text) if f.name.startswith("fedsdk_")
                and f.type == "counter"]
    assert {f.name for f in counters} >= {"fedsdk_rounds_completed", "fedsdk_updates_accepted"}
    assert all(s.name.endswith("_total") for f in counters for s in f.samples)
    assert 'fedsdk_updates_rejected_total{reason="timeout"} 1.0' in text
