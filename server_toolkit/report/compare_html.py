"""The runs comparison page: one self-contained HTML file (inline CSS and SVG, no script, nothing
fetched) comparing series of runs setting by setting.

Sections: the inputs and how the page was made; then per setting an accuracy-per-round chart (mean
line and ± std band over each series' runs), a table of final accuracy and mean of the last k
rounds, the other accuracies (per exit, tier, architecture, strong/weak), cost per round (bytes,
seconds per server stage), every other numeric key, per-round charts of every key, and the runs
with their configs. Number formats are those of ``format_value``/``format_stat``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Sequence
from datetime import datetime
from html import escape
from pathlib import Path

from . import svg
from .runs import CONFIG_JSON, ReportInputError, Run
from .series import (
    MAIN_KEY,
    Series,
    Setting,
    Stat,
    config_differences,
    group_runs,
    is_accuracy_part,
    is_cumulative,
    is_time,
    natural_key,
    points,
)

# Okabe-Ito colours (told apart with the common colour-vision deficiencies), then a grey; series
# past the eighth reuse them dashed. One colour per series label on the whole page.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#7F7F7F")
DASHES = (None, "7 4", "2 3", "9 3 2 3")
MISSING = "–"
_LEFT = ' class="label"'

Styles = dict[str, tuple[str, str | None]]  # series label -> (colour, dash pattern or None)

CSS = """
body{margin:0;background:#f3f3f1;color:#222;font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,
 'DejaVu Sans',sans-serif}
main{max-width:1180px;margin:0 auto;padding:18px 28px 48px;background:#fff}
h1{font-size:23px;margin:6px 0 10px}
h2{font-size:19px;margin:40px 0 8px;padding-bottom:4px;border-bottom:2px solid #d8d8d8}
h3{font-size:15px;margin:24px 0 6px}
p{margin:6px 0}
.note{color:#555;font-size:13px}
.scroll{overflow-x:auto}
table{border-collapse:collapse;margin:6px 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d2d2d2;padding:4px 9px;text-align:right;vertical-align:top}
th{background:#efefec;font-weight:600}
th.label,td.label{text-align:left}
tbody tr:nth-child(even){background:#f9f9f8}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px;vertical-align:-1px}
.grid{display:flex;flex-wrap:wrap;gap:10px}
figure{margin:8px 0}
figcaption{color:#555;font-size:13px;max-width:720px}
details{margin:4px 0}
summary{cursor:pointer}
pre{font-size:12px;background:#f6f6f4;padding:8px;margin:4px 0;max-height:380px;overflow:auto;text-align:left}
code{font-size:13px}
"""


def format_bytes(value: float) -> str:
    """Bytes with SI units: ``512 B``, ``166.3 kB``, ``6.17 MB``, ``1.25 GB``."""
    size = abs(value)
    if size < 1e3:
        return f"{value:.0f} B"
    if size < 1e6:
        return f"{value / 1e3:.1f} kB"
    if size < 1e9:
        return f"{value / 1e6:.2f} MB"
    return f"{value / 1e9:.2f} GB"


def format_value(key: str, value: float) -> str:
    """One number of per-round key ``key`` as the page shows it: accuracies with 4 decimals, bytes
    keys with SI units, seconds with 3 decimals, anything else with 4 significant digits (whole
    numbers from 10 000 up)."""
    if key == MAIN_KEY or is_accuracy_part(key):
        return f"{value:.4f}"
    if is_cumulative(key):
        return format_bytes(value)
    if is_time(key):
        return f"{value:.3f} s"
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def format_stat(key: str, stat: Stat | None) -> str:
    """``mean ± std`` of ``key`` (just the mean for one run; ``–`` when there is nothing)."""
    if stat is None:
        return MISSING
    if stat.std is None:
        return format_value(key, stat.mean)
    return f"{format_value(key, stat.mean)} ± {format_value(key, stat.std)}"


def seeds_text(series: Series) -> str:
    """``3 (0, 1, 2)``: how many runs, and their seeds (``?`` when a run has none); repeats of
    one run show once with their count, ``3 (0 ×2, 1)``."""
    seeds = []
    for repeats in series.replicates():
        seed = repeats[0].seed
        seeds.append(("?" if seed is None else str(seed)) + (f" ×{len(repeats)}" if len(repeats) > 1 else ""))
    return f"{len(series.runs)} ({', '.join(seeds)})"


def rounds_text(series: Series) -> str:
    """The runs' round counts: ``4``, or ``3–4`` when they differ."""
    counts = series.rounds()
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}–{high}"


def build_page(runs: Sequence[Run], *, inputs: Sequence[str] = (), last_k: int = 5, command: str = "",
               made_at: datetime | None = None) -> str:
    """The whole HTML page comparing ``runs`` (``last_k`` >= 1 rounds for the "last k" means);
    ``inputs`` are the paths as given and ``command``/``made_at`` go in the "how made" line."""
    if last_k < 1:
        raise ValueError(f"last_k must be >= 1, got {last_k}")
    made_at = made_at or datetime.now().astimezone()
    settings = group_runs(runs)
    styles: Styles = {}
    for setting in settings:
        for series in setting.series:
            if series.label not in styles:
                i = len(styles)
                styles[series.label] = (PALETTE[i % len(PALETTE)], DASHES[(i // len(PALETTE)) % len(DASHES)])
    body = [_inputs_section(runs, settings, inputs, command, made_at)]
    body += [_setting_section(i, setting, styles, last_k) for i, setting in enumerate(settings, start=1)]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>fedsdk runs compared ({len(runs)} runs)</title>\n<style>{CSS}</style>\n</head>\n"
            "<body>\n<main>\n<h1>Federated runs compared</h1>\n" + "\n".join(body)
            + "\n</main>\n</body>\n</html>\n")


def write_page(html: str, out: Path) -> Path:
    """Write the page to ``out`` (through a temporary file next to it, then renamed);
    ReportInputError with a one-line reason if it cannot be written."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise ReportInputError(f"cannot write {out}: {err.strerror or err}") from None
    return out


def _inputs_section(runs: Sequence[Run], settings: list[Setting], inputs: Sequence[str], command: str,
                    made_at: datetime) -> str:
    n_series = sum(len(setting.series) for setting in settings)
    out = ['<section id="inputs">', "<h2>Inputs</h2>"]
    if inputs:
        out.append("<p>Given: " + ", ".join(f"<code>{escape(str(p))}</code>" for p in inputs) + "</p>")
    out.append(f"<p>{len(runs)} runs in {len(settings)} settings, {n_series} series: "
               + ", ".join(f'<a href="#setting-{i}">{escape(s.label)}</a>' for i, s in enumerate(settings, 1))
               + ".</p>")
    how = f"<code>{escape(command)}</code> on " if command else ""
    out.append(f'<p class="how">Made by {how}{made_at.strftime("%Y-%m-%d %H:%M %Z").strip()}.</p>')
    rows = [[_td(str(run.path), True), _td(run.setting, True), _td(run.label, True),
             _td(MISSING if run.seed is None else str(run.seed)), _td(str(len(run.rows)))] for run in runs]
    out.append(_table("runs", ["run directory", "setting", "series", "seed", "rounds"], rows, left=(0, 1, 2)))
    out.append("</section>")
    return "\n".join(out)


def _setting_section(index: int, setting: Setting, styles: Styles, last_k: int) -> str:
    sid = f"setting-{index}"
    return "\n".join([f'<section class="setting" id="{sid}">',
                      f"<h2>Setting {index}: {escape(setting.label)}</h2>",
                      f'<p class="note">{len(setting.series)} series, {len(setting.runs)} runs.</p>',
                      _accuracy_block(sid, setting, styles, last_k),
                      _privacy_chart(setting, styles),
                      _key_tables(sid, setting, styles, last_k),
                      _key_charts(setting, styles),
                      _runs_block(sid, setting, styles),
                      "</section>"])


def _accuracy_block(sid: str, setting: Setting, styles: Styles, last_k: int) -> str:
    """The accuracy chart, the final / last-k table, and notes on replicates that differ."""
    lines = [_line(series, MAIN_KEY, styles) for series in setting.series]
    chart = svg.line_chart(lines, title=f"{MAIN_KEY} per round", x_label="round", y_label=MAIN_KEY)
    out = ["<figure>" + chart
           + f"<figcaption>The rows' <code>{MAIN_KEY}</code> per round: each series' mean over its "
           "replicates (seeds); the band is ± one standard deviation where it has two or more."
           "</figcaption></figure>",
           f"<h3>{escape(MAIN_KEY.capitalize())}</h3>"]
    rows = [[_label_td(series, styles), _td(seeds_text(series)), _td(rounds_text(series)),
             _td(format_stat(MAIN_KEY, series.final(MAIN_KEY))),
             _td(format_stat(MAIN_KEY, series.last_k(MAIN_KEY, last_k)))] for series in setting.series]
    out.append(_table(f"{sid}-accuracy", ["series", "runs (seeds)", "rounds", f"final {MAIN_KEY}",
                                          f"mean of last {last_k} rounds"], rows))
    out.append('<p class="note">mean ± sample standard deviation over the series\' replicates (its '
               "seeds: runs of one seed and configuration are repeats, counted once as their mean); "
               f"a run with fewer than {last_k} rounds counts all of them.</p>")
    notes = [f"<li>{escape(series.label)}: runs differ in <code>{escape(key)}</code> "
             f"({escape(', '.join(values))}), yet count as replicates.</li>"
             for series in setting.series for key, values in config_differences(series).items()]
    notes += [f"<li>{escape(series.label)}: runs {escape(', '.join(run.name for run in repeats))} repeat "
              f"seed {repeats[0].seed} with the same configuration: one replicate, their mean.</li>"
              for series in setting.series for repeats in series.replicates() if len(repeats) > 1]
    if notes:
        out.append('<ul class="note">' + "".join(notes) + "</ul>")
    return "\n".join(out)


def _privacy_chart(setting: Setting, styles: Styles) -> str:
    """Final accuracy against the final ``dp_epsilon``, one line per method, when the setting's
    runs used differential privacy (``--dp-clip``); ε = ∞ (clipping, no noise) is drawn at
    1.5 x the largest finite ε."""
    found: dict[str, list[tuple[float, Series]]] = {}
    for series in setting.series:
        config = series.runs[0].config or {}
        spent = series.final("dp_epsilon")
        if not (config.get("privacy") or {}).get("clip"):
            continue
        found.setdefault(str(config.get("method")), []).append((spent.mean if spent else math.inf, series))
    finite = [e for members in found.values() for e, _ in members if math.isfinite(e)]
    if not finite:
        return ""
    lines = []
    for method, members in found.items():
        pts = []
        for eps, series in sorted(members, key=lambda m: m[0]):
            acc = series.final(MAIN_KEY)
            if acc is not None:
                pts.append(svg.Point(eps if math.isfinite(eps) else 1.5 * max(finite), acc.mean, acc.std,
                                     f"{series.label}: epsilon {eps:.3g}, {format_stat(MAIN_KEY, acc)}"))
        lines.append(svg.Line(method, styles[members[0][1].label][0], pts))
    chart = svg.line_chart(lines, title=f"final {MAIN_KEY} vs epsilon", x_label="dp_epsilon",
                           y_label=MAIN_KEY, integer_x=False)
    return ("<figure>" + chart + "<figcaption>Each method's final accuracy against the epsilon its runs "
            "reported (mean ± std over runs); the rightmost point, at 1.5 × the largest finite epsilon, "
            "is epsilon = ∞ (clipping without noise).</figcaption></figure>")


def _key_tables(sid: str, setting: Setting, styles: Styles, last_k: int) -> str:
    """Tables of the other keys: accuracies by part, cost per round, everything else."""
    keys = setting.keys()
    parts = sorted((k for k in keys if is_accuracy_part(k)), key=natural_key)
    costs = ([k for k in keys if is_cumulative(k)] + [k for k in keys if k == "seconds"]
             + sorted((k for k in keys if is_time(k) and k != "seconds"), key=natural_key))
    others = [k for k in keys if k != MAIN_KEY and k not in parts and k not in costs]
    last = f"mean of last {last_k} rounds"

    def last_mean(series: Series, key: str) -> Stat | None:
        return series.last_k(key, last_k)

    out = []
    if parts:
        out.append("<h3>Accuracy by exit, tier, architecture, role</h3>")
        out.append(_key_table(f"{sid}-parts", setting, parts, styles, last_mean, last))
    if costs:
        out.append("<h3>Cost per round</h3>")
        out.append(_key_table(f"{sid}-cost", setting, costs, styles, Series.per_round, "mean per round"))
        out.append('<p class="note"><code>bytes_*</code> are cumulative counters: a round\'s amount is the '
                   "difference from the previous row.</p>")
    if others:
        out.append("<h3>Other metrics</h3>")
        out.append(_key_table(f"{sid}-other", setting, others, styles, last_mean, last))
    return "\n".join(out)


def _key_charts(setting: Setting, styles: Styles) -> str:
    """A folded grid of small per-round charts, one per key other than the main one."""
    keys = [k for k in setting.keys() if k != MAIN_KEY]
    if not keys:
        return ""
    charts = [svg.line_chart([_line(series, key, styles) for series in setting.series],
                             title=f"{key} per round" + (" (difference)" if is_cumulative(key) else ""),
                             x_label="round", y_label=key, width=372, height=240, legend=False)
              for key in keys]
    return (f"<details><summary>Every other per-round key ({len(keys)} charts, colours as above)</summary>"
            f'<div class="grid">{"".join(charts)}</div></details>')


def _runs_block(sid: str, setting: Setting, styles: Styles) -> str:
    """The setting's runs: directory name (path on hover), series, seed, rounds, final accuracy, config."""
    rows = []
    for series in setting.series:
        for run in series.runs:
            final = [value for _, value in points(run.rows, MAIN_KEY)]
            config = (f"<details><summary>{CONFIG_JSON}</summary><pre>"
                      f"{escape(json.dumps(run.config, indent=2))}</pre></details>"
                      if run.config is not None else f"no {CONFIG_JSON}")
            rows.append([f'<td class="label" title="{escape(str(run.path))}">{escape(run.name)}</td>',
                         _label_td(series, styles), _td(MISSING if run.seed is None else str(run.seed)),
                         _td(str(len(run.rows))),
                         _td(format_value(MAIN_KEY, final[-1]) if final else MISSING),
                         f'<td class="label">{config}</td>'])
    return "<h3>Runs</h3>\n" + _table(f"{sid}-runs", ["run", "series", "seed", "rounds", f"final {MAIN_KEY}",
                                                      "config"], rows, left=(0, 1, 5))


def _line(series: Series, key: str, styles: Styles) -> svg.Line:
    colour, dash = styles[series.label]
    pts = [svg.Point(round_no, stat.mean, stat.std,
                     f"{series.label}, round {round_no}: {format_stat(key, stat)} (n={stat.n})")
           for round_no, stat in series.curve(key)]
    return svg.Line(series.label, colour, pts, dash)


def _key_table(table_id: str, setting: Setting, keys: list[str], styles: Styles,
               stat_of, what: str) -> str:
    """Rows = keys, columns = series; each cell ``stat_of(series, key)``."""
    header = [f"key ({what})"] + [_label_th(series, styles) for series in setting.series]
    rows = [[_td(key, True)] + [_td(format_stat(key, stat_of(series, key))) for series in setting.series]
            for key in keys]
    return _table(table_id, header, rows, raw_header=True)


def _td(text: str, label: bool = False) -> str:
    return f'<td class="label">{escape(text)}</td>' if label else f"<td>{escape(text)}</td>"


def _swatch(series: Series, styles: Styles) -> str:
    return f'<span class="swatch" style="background:{styles[series.label][0]}"></span>'


def _label_td(series: Series, styles: Styles) -> str:
    return f'<td class="label">{_swatch(series, styles)}{escape(series.label)}</td>'


def _label_th(series: Series, styles: Styles) -> str:
    return f'<th class="label">{_swatch(series, styles)}{escape(series.label)}</th>'


def _table(table_id: str, header: list[str], rows: list[list[str]], left: Sequence[int] = (0,),
           raw_header: bool = False) -> str:
    """A table; ``header`` cells are text (or ready ``<th>`` markup if ``raw_header``), ``rows`` ready
    ``<td>`` markup; the header cells of columns ``left`` are left-aligned."""
    if raw_header:
        head = "".join(cell if cell.startswith("<th") else f'<th class="label">{escape(cell)}</th>'
                       for cell in header)
    else:
        head = "".join(f"<th{_LEFT if i in left else ''}>{escape(cell)}</th>"
                       for i, cell in enumerate(header))
    body = "\n".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return (f'<div class="scroll"><table id="{escape(table_id)}"><thead><tr>{head}</tr></thead>\n'
            f"<tbody>\n{body}\n</tbody></table></div>")
