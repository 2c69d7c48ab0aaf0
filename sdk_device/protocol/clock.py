"""The clock rule (docs/protocol.md §9.6): a task's deadline is read as a duration.

A device's wall clock can be off by hours (a board without a battery-backed clock before
NTP answers, a phone set by hand). Comparing the server's ``deadline`` (unix seconds, the
server's clock) with such a clock refuses every task as ``deadline_passed`` (clock fast) or
starts work the server will no longer accept (clock slow). So the server stamps every task
with its own time when it publishes it (``server_time``), and the device has
``deadline - server_time`` seconds, counted on its monotonic clock from the moment the task
arrived. Only the difference of two server readings is used: the device's wall clock
never enters. Time the task spent queued on the broker is not seen by the device; the
server stays the judge of lateness (it refuses results after its deadline, by its clock).

A task without ``server_time`` (from a server older than the rule) falls back to the old
rule: ``deadline`` minus the device's wall clock.

``FEDSDK_CLOCK_OFFSET_S`` (seconds, float) is a test hook: it shifts the wall clock this
module reports (``wall_clock``) to simulate a device whose clock is wrong.
"""

from __future__ import annotations

import os
import time

OFFSET_ENV = "FEDSDK_CLOCK_OFFSET_S"


def wall_clock() -> float:
    """This device's idea of the time, unix seconds (shifted by ``$FEDSDK_CLOCK_OFFSET_S``)."""
    return time.time() + float(os.environ.get(OFFSET_ENV) or 0.0)


def seconds_left(deadline: float, server_time: float | None, waited_s: float,
                 device_now: float | None = None) -> float:
    """Seconds left before a task's deadline (negative: late).

    ``deadline``, ``server_time``: the task's fields (unix seconds, server clock; ``server_time``
    None when the server did not send it); ``waited_s``: monotonic seconds since the task arrived
    on this device; ``device_now``: this device's wall clock (default ``wall_clock()``), only
    read by the fallback rule.
    """
    if server_time is None:
        return deadline - (wall_clock() if device_now is None else device_now)
    return deadline - server_time - waited_s
