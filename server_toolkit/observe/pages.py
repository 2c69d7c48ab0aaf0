"""The dashboard's HTML, rendered on the server from a ``Snapshot``: header, the open round, the
fleet table and inline SVG charts (accuracy and loss per round, accuracy per tier / device key when
the rows have them; bytes and server seconds per stage). No CDN, no framework: the page's one small script
re-fetches ``fragment`` every ``POLL_S`` seconds and counts the deadline down. A model the quality
guard found diverged (``rounds/quality_guard.py``) gets a red line under the header."""

from __future__ import annotations

import time
from html import escape

from ..report import svg
from ..report.compare_html import CSS, PALETTE, format_bytes
from ..report.series import is_number, natural_key, numeric_keys, points
from ..rounds.grid import GONE, TRAINING, UPLOADING, LiveRound
from .fleet_view import DeviceRow
from .state import Snapshot

POLL_S = 2.0
STAGE_KEYS = ("time_configure_s", "time_aggregate_s", "time_evaluate_s")
MAIN_ACCURACY = ("accuracy", "personal_accuracy")  # the accuracy chart; the parts chart has the others

SCRIPT = """
const query = location.search;
function tick() {
  for (const el of document.querySelectorAll('[data-deadline]')) {
    const left = Math.max(0, Number(el.dataset.deadline) - Date.now() / 1000);
    el.textContent = left.toFixed(0) + ' s';
  }
}
async function refresh() {
  try {
    const response = await fetch('fragment' + query, {cache: 'no-store'});
    if (response.ok) { document.getElementById('live').innerHTML = await response.text(); tick(); }
  } catch (e) { /* the server stopped: keep the last view */ }
}
setInterval(refresh, %d);
setInterval(tick, 1000);
"""


def page(snap: Snapshot) -> str:
    """The whole page."""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>fedsdk dashboard</title>'
            f"<style>{CSS}.on{{color:#007a3d}}.off{{color:#b00020}}</style></head><body><main>"
            f'<div id="live">{fragment(snap)}</div></main>'
            f"<script>{SCRIPT % int(POLL_S * 1000)}</script></body></html>")


def fragment(snap: Snapshot) -> str:
    """Everything that changes: what ``refresh`` swaps in."""
    return "".join([_header(snap), _round_section(snap), _fleet_section(snap.fleet.devices),
                    _charts(snap.rows)])


def _header(snap: Snapshot) -> str:
    c = snap.config
    what = ", ".join(str(c[k]) for k in ("method", "dataset", "model") if c.get(k))
    planned = f" of {snap.planned_rounds}" if snap.planned_rounds else ""
    return (f"<h1>fedsdk: {escape(what or 'run')}</h1>"
            f'<p id="status">status <b>{escape(snap.status)}</b>; <span id="rounds-done">{len(snap.rows)}'
            f"</span>{planned} rounds done; {snap.fleet.online}/{len(snap.fleet.devices)} devices online; "
            f"up {_ago(snap.started_at)}</p>{_divergence(snap.rows)}")


def _divergence(rows: list[dict]) -> str:
    """A warning line when the quality guard found the model diverged (rows' ``divergence``)."""
    events = [r["divergence"] for r in rows if isinstance(r.get("divergence"), dict)]
    if not events:
        return ""
    last = events[-1]
    best = last.get("best_accuracy")
    shown = f"{best:.4f} at round {last.get('best_round')}" if is_number(best) else "none"
    text = (f"model diverged {len(events)} time(s); last at round {last.get('round')}: {last.get('metric')} "
            f"(best {shown}); {last.get('action')}")
    return f'<p id="divergence" class="off"><b>{escape(text)}</b></p>'


def _round_section(snap: Snapshot) -> str:
    live = snap.live
    if live is None:
        last = snap.rows[-1] if snap.rows else None
        text = "no round open" + (f"; round {last['round']} closed: {last.get('accepted', 0)} accepted, "
                                  f"{last.get('rejected', 0)} rejected" if last else "")
        return f'<h2>Current round</h2><p id="round-none">{escape(text)}</p>'
    reasons = ", ".join(f"{code} × {n}" for code, n in sorted(live.rejections.items())) or "none"
    rows = [("round", str(live.round)), ("selected", f"{len(live.asked)}: {', '.join(live.asked)}")]
    if live.states:  # the grid reports each device's state
        rows += [(state, str(live.count(state))) for state in (TRAINING, UPLOADING)]
        rows.append(("trained", f"{live.trained()} (result in)"))
    rows += [("accepted", f"{len(live.accepted)}: {', '.join(live.accepted)}"),
             ("rejected", f"{sum(live.rejections.values())} ({reasons})")]
    if live.count(GONE):
        rows.append((GONE, str(live.count(GONE))))
    body = "".join(f'<tr><th class="label">{k}</th><td class="label">{escape(v)}</td></tr>' for k, v in rows)
    left = max(0.0, live.deadline - time.time())
    body += (f'<tr><th class="label">deadline in</th><td class="label" data-deadline="{live.deadline:.3f}">'
             f"{left:.0f} s</td></tr>")
    return f'<h2>Current round</h2><table id="round">{body}</table>{_round_devices(live)}'


def _round_devices(live: LiveRound) -> str:
    """One row per device asked: its state (``training 40 %`` when it reported its progress)."""
    if not live.states:
        return ""
    rows = []
    for dev, state in sorted(live.states.items(), key=lambda kv: natural_key(kv[0])):
        shown = f"{state} {live.progress[dev]:.0%}" if state == TRAINING and dev in live.progress else state
        rows.append(f'<tr><td class="label">{escape(dev)}</td><td class="label">{escape(shown)}</td></tr>')
    return ('<div class="scroll"><table id="round-devices"><thead><tr><th class="label">device</th>'
            f'<th class="label">state</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def _fleet_section(devices: list[DeviceRow]) -> str:
    header = ["device", "arch", "tier", "why this tier", "runtime", "last seen", "online", "accepted",
              "rejected", "last error"]
    head = "".join(f'<th class="label">{h}</th>' for h in header)
    rows = []
    for d in devices:
        online = '<span class="on">online</span>' if d.online else '<span class="off">offline</span>'
        seen = _ago(d.last_seen) + " ago" if d.last_seen else "–"
        cells = [escape(d.device), escape(d.arch or "–"), escape(d.tier or "–"),
                 escape(d.tier_reason[:200] or "–"), escape(d.runtime or "–"), seen, online,
                 str(d.accepted), str(d.rejected), escape(d.last_error[:160] or "–")]
        rows.append("<tr>" + "".join(f'<td class="label">{c}</td>' for c in cells) + "</tr>")
    return (f'<h2>Fleet</h2><div class="scroll"><table id="fleet"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _charts(rows: list[dict]) -> str:
    keys = numeric_keys(rows)
    loss = [k for k in keys if k == "loss" or k.startswith("loss_")]
    charts = [("accuracy", "Accuracy per round", "accuracy", [k for k in MAIN_ACCURACY if k in keys]),
              ("parts", "Accuracy per tier / device", "accuracy", part_keys(keys)),
              ("loss", "Loss per round", "loss", loss),
              ("bytes", "Bytes per round", "bytes", [k for k in ("bytes_down", "bytes_up") if k in keys]),
              ("stages", "Server seconds per stage", "seconds", [k for k in STAGE_KEYS if k in keys])]
    out = []
    for chart_id, title, y_label, chart_keys in charts:
        if chart_id == "parts" and not chart_keys:
            continue  # the rows have no per-tier / per-device keys
        lines = [svg.Line(key, PALETTE[i % len(PALETTE)],
                          [svg.Point(x, y, note=_note(key, x, y)) for x, y in points(rows, key)])
                 for i, key in enumerate(sorted(chart_keys, key=natural_key))]
        chart = svg.line_chart(lines, title=title, x_label="round", y_label=y_label, width=560, height=300)
        out.append(f'<figure id="{chart_id}-chart">{chart}</figure>')
    return '<h2>Rounds</h2><div class="grid">' + "".join(out) + "</div>"


def part_keys(keys: list[str]) -> list[str]:
    """The per-tier / per-exit / per-device accuracies among ``keys`` (``accuracy_strong``,
    ``accuracy_exit1``, ``personal_accuracy_<arch>``)."""
    return [k for k in keys if k.startswith(("accuracy_", "personal_accuracy_"))]


def _note(key: str, x: float, y: float) -> str:
    shown = format_bytes(y) if key.startswith("bytes_") else f"{y:.4g}"
    return f"{key}: {shown} at round {x:g}"


def _ago(at: float) -> str:
    seconds = max(0.0, time.time() - at) if is_number(at) else 0.0
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
