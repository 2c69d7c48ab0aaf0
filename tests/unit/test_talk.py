"""The server's one-line event log (server_toolkit/cli/talk.py): levels per command, the
line format, and per-device lines summarised when a fleet is large."""

from __future__ import annotations

import logging
import sys

from server_toolkit.cli import talk


def _record(msg: str, *args, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("server_toolkit.rounds.mqtt_grid", level, __file__, 1, msg, args, None)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_serving_commands_talk_at_info_and_others_keep_to_warnings():
    assert talk.level_for("run", 0, False) == logging.INFO
    assert talk.level_for("edge", 0, False) == logging.INFO
    assert talk.level_for("simulate", 0, False) == logging.WARNING
    assert talk.level_for("run", 0, True) == logging.WARNING
    assert talk.level_for("run", 1, False) == logging.DEBUG
    assert talk.level_for("simulate", 1, False) == logging.INFO
    assert talk.level_for("simulate", 5, False) == logging.DEBUG


def test_info_lines_go_to_stdout_and_warnings_to_stderr_one_line_each(capsys):
    handler = talk.TalkHandler(clock=Clock())
    handler.emit(_record("round %d opens: %d device(s) asked", 3, 2))
    handler.emit(_record("device %s went offline", "dev1", level=logging.WARNING))
    out, err = capsys.readouterr()
    assert out.endswith(" round 3 opens: 2 device(s) asked\n") and out.count("\n") == 1
    assert err.endswith(" warning: device dev1 went offline\n")


def test_a_round_of_fifty_devices_shows_every_device_line(capsys):
    handler = talk.TalkHandler(clock=Clock())
    for i in range(talk.PER_DEVICE_LINES):
        handler.emit(_record("device %s online: %d samples, runtimes %s", f"d{i}", 10, ["torch"]))
    handler.emit(_record("round %d opens: %d device(s) asked", 1, 50))
    out = capsys.readouterr().out
    assert out.count("online: 10 samples") == 50 and "more" not in out


def test_ten_thousand_hellos_become_fifty_lines_and_one_summary(capsys):
    clock = Clock()
    handler = talk.TalkHandler(clock=clock)
    for i in range(10_000):
        clock.now = i * 0.0005  # 5 s in all: one window
        handler.emit(_record("device %s online: %d samples, runtimes %s", f"d{i}", 10, ["torch"]))
        handler.emit(_record("round %d: accepted update from %s (%d samples)", 1, f"d{i}", 10))
    handler.emit(_record("round %d closed", 1))
    lines = capsys.readouterr().out.splitlines()
    assert sum("online: 10 samples" in line for line in lines) == 50
    assert sum("accepted update from d" in line for line in lines) == 50
    assert any('... 9,950 more "device … online" lines' in line for line in lines)
    assert any('... 9,950 more "round …: accepted update from" lines' in line for line in lines)
    assert lines[-1].endswith("round 1 closed")
    assert len(lines) == 103


def test_per_device_lines_show_again_in_the_next_window(capsys):
    clock = Clock()
    handler = talk.TalkHandler(clock=clock)
    for i in range(60):
        handler.emit(_record("device %s went offline", f"d{i}", level=logging.WARNING))
    clock.now = talk.WINDOW_S + 1
    handler.emit(_record("device %s went offline", "late", level=logging.WARNING))
    out, err = capsys.readouterr()
    assert '... 10 more "device … went offline" lines in 11 s' in out
    assert err.count("went offline") == 51 and err.splitlines()[-1].endswith("device late went offline")


def test_a_logged_exception_prints_its_traceback_under_the_line(capsys):
    handler = talk.TalkHandler(clock=Clock())
    try:
        min([])
    except ValueError:
        record = logging.LogRecord("server_toolkit.edge.aggregator", logging.ERROR, __file__, 1,
                                   "task %s failed", ("abc",), exc_info=sys.exc_info())
    handler.emit(record)
    err = capsys.readouterr().err
    assert " error: task abc failed\nTraceback (most recent call last):" in err
    assert err.rstrip().endswith("ValueError: min() arg is an empty sequence")
