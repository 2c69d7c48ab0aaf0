"""What ``fedsdk-server`` says while it works: one line per event, on any output.

``run`` and ``edge`` log at INFO by default, the other commands at WARNING (``simulate``
keeps its progress bar and round table clean); ``-q`` lowers every command to warnings,
each ``-v`` adds a level (``run -v``: debug lines, with the logger's name). INFO lines go to
stdout, warnings and errors to stderr, each as ``HH:MM:SS text`` (``HH:MM:SS warning: text``),
looked up at each line so a live progress bar keeps them above itself, and flushed at once
(a log file shows a line when it happens).

A fleet of thousands must not drown its operator: per-device lines (a device online,
offline, back online; an update accepted or rejected; a repeated result) are shown for the
first ``PER_DEVICE_LINES`` of each kind within ``WINDOW_S`` seconds; beyond that they are
counted, and one summary line per kind (``... 9,950 more "device … online" lines in 10 s``)
comes before the next other line or when the window has passed. A round of up to 50 devices
thus shows every device's lines.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

TALKATIVE = {"run", "edge"}  # commands that serve and say what happens at INFO
PER_DEVICE_LINES = 50  # per kind and window
WINDOW_S = 10.0
OURS = ("server_toolkit", "sdk_device", "fedcore", "export")
# The log templates (``record.msg``) that speak of one device, by their first words.
PER_DEVICE = (
    "device %s online", "device %s is back online", "device %s went offline", "device %s reports",
    "round %d: accepted update from", "rejected result from", "result of task %s from",
    "ignoring a second result", "task %s of %s already", "device %s left while",
    "device %s did not come back",
)


def level_for(command: str | None, verbose: int, quiet: bool) -> int:
    """The logging level of ``command``: INFO for serving commands, WARNING for the rest;
    ``quiet``: WARNING; each ``verbose`` one level lower (down to DEBUG)."""
    if quiet:
        return logging.WARNING
    base = logging.INFO if command in TALKATIVE else logging.WARNING
    return max(logging.DEBUG, base - 10 * verbose)


class TalkHandler(logging.Handler):
    """Writes records as one line each (see the module docstring); ``clock``: seconds, for tests."""

    def __init__(self, detailed: bool = False, clock=time.monotonic) -> None:
        super().__init__()
        self.detailed = detailed
        self.clock = clock
        self._kinds: dict[str, int] = {}  # per-device kind -> lines in this window
        self._window_started = clock()
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            kind = per_device_kind(record)
            with self._guard:
                lines = self._summaries(force=kind is None)
                shown = True
                if kind is not None:
                    self._kinds[kind] = self._kinds.get(kind, 0) + 1
                    shown = self._kinds[kind] <= PER_DEVICE_LINES
                if shown:
                    lines.append((record.levelno, self._line(record)))
            for level, line in lines:
                stream = sys.stderr if level >= logging.WARNING else sys.stdout
                stream.write(line + "\n")
                stream.flush()
        except Exception:
            self.handleError(record)

    def _summaries(self, force: bool) -> list[tuple[int, str]]:
        """The summary lines owed now (the window passed, or ``force``), and a new window."""
        now = self.clock()
        if not (force or now - self._window_started >= WINDOW_S):
            return []
        out = []
        for kind, count in self._kinds.items():
            if count > PER_DEVICE_LINES:
                out.append((logging.INFO, f"{_clock()} ... {count - PER_DEVICE_LINES:,} more \"{kind}\" "
                            f"lines in {now - self._window_started:.0f} s"))
        if out or now - self._window_started >= WINDOW_S:
            self._kinds, self._window_started = {}, now
        return out

    def _line(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        if self.detailed:
            return f"{_clock()} {record.levelname} {record.name}: {text}"
        tag = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        return f"{_clock()} {tag}{text}"


def per_device_kind(record: logging.LogRecord) -> str | None:
    """The kind of a per-device line (its template with ``…`` for values), or None."""
    template = str(record.msg)
    for prefix in PER_DEVICE:
        if template.startswith(prefix):
            return prefix.replace("%s", "…").replace("%d", "…")
    return None


def set_up(command: str | None, verbose: int, quiet: bool) -> None:
    """Install the one-line handler on the root logger at ``command``'s level (debug lines
    of this project's packages only: a library's debug chatter, e.g. matplotlib's fonts, stays out)."""
    level = level_for(command, verbose, quiet)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, TalkHandler)]:
        root.removeHandler(old)
    root.addHandler(TalkHandler(detailed=level <= logging.DEBUG))
    root.setLevel(max(level, logging.INFO))
    for package in OURS:
        logging.getLogger(package).setLevel(level if level < logging.INFO else logging.NOTSET)


def _clock() -> str:
    return time.strftime("%H:%M:%S")
