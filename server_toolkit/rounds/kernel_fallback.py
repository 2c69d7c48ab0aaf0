"""The portable program for a device whose runtime lacks a program's kernel set.

A ``pte/1`` program exported with the fused kernel set (metadata ``"kernels": "fused"``,
protocol §23.8) runs only where ``libfedsdk_kernels`` is loaded; a device whose runtime lacks
it (an older SDK, the C++ client without the library, no compiler) refuses the task with
``unsupported_kernels`` (§9.3). The grid then remembers the device and, while the task is open
and before its deadline, sends it a new task for the same work with the portable program
(today's lowering, which every ExecuTorch runtime runs); every later task of that device carries
the portable program too. Decisions: the refusal is booked in the registry
(``device:unsupported_kernels``) but is not one of the round's rejections (the device's work is
still asked for); the memory is this server instance's (after a restart the device refuses once
more and falls back again); a second such refusal (of the portable program) ends the wait for
the device as any refusal does.
"""

from __future__ import annotations

import logging
import time

from fedcore.recipe import Recipe
from sdk_device.protocol import messages as msgs
from sdk_device.runtimes.pte_contract import PORTABLE, UnsupportedKernels

from .results import PendingTask

log = logging.getLogger(__name__)

UNSUPPORTED_KERNELS = UnsupportedKernels.code


class KernelFallback:
    """``MqttGrid``'s fallback to portable programs (module doc). The grid provides
    ``programs`` (a ``ProgramCache``), ``registry``, ``devices``, ``_lock``, ``_task_open``
    and ``_send_task``; ``_portable_only`` is the set of devices that refused fused programs."""

    _portable_only: set[str]

    def programs_for(self, dev: str, spec: dict, recipe: Recipe) -> list[tuple[str, bytes]]:
        """The programs of (``spec``, ``recipe``) for ``dev``: portable pte/1 ones once it refused
        a fused one."""
        return self.programs.programs(spec, recipe, portable=dev in self._portable_only)

    def _fall_back(self, dev: str, error: msgs.Error, pending: PendingTask) -> bool:
        """True when ``error`` is ``dev``'s refusal of its open task ``pending`` for its kernels
        and a portable task for the same work went out instead."""
        if error.code != UNSUPPORTED_KERNELS or self.programs.kernels == PORTABLE:
            return False
        if dev in self._portable_only:  # it refused the portable program too
            return False
        self._portable_only.add(dev)
        log.warning("device %s cannot run %s-kernel programs (%s): it gets portable programs from now on",
                    dev, self.programs.kernels, error.detail)
        with self._lock:
            if (pending.answered or pending.task is None or not self._task_open(pending)
                    or pending.task.deadline <= time.time() or dev not in self.devices):
                return False  # nothing to send again: the refusal ends the wait for it, as any does
            self.registry.add_rejection(pending.round, dev, pending.task_id, f"device:{error.code}",
                                        error.detail)
            self._send_task(pending.round, pending.instruction, pending.task.deadline)
            self._task_replaced(pending)
        log.info("round %d: task %s of %s sent again with the portable program", pending.round,
                 pending.task_id[:8], dev)
        return True

    def _task_replaced(self, old: PendingTask) -> None:
        """Hook: the task just sent replaces ``old`` (the async grid moves its expiry)."""
