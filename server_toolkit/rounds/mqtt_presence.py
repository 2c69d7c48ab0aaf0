"""Devices coming and going on the MQTT grid, and the open tasks sent again when they come back.

A task is one QoS-1 message. The broker keeps it for a device that is offline, but not when
it loses the device's session: a broker killed without persistence (or restored from an older
snapshot) lets the server publish a round's tasks before the devices have subscribed again,
and they never arrive. The server cannot see that loss, so it sends a device's open task again
(same ``task_id``, a new ``msg_id``) whenever the device may have missed it:

* the device's status turns ``online`` (it reconnected, or its process restarted and lost the
  task: its subscriptions are in place by then, it publishes ``online`` after subscribing),
  also while the server thinks it never left (a killed broker publishes no last wills);
* the server's own MQTT connection comes back (``MqttLink.connects``).

Only tasks of the open round (``_task_open``) not yet answered, of devices online that have
not refused or answered them, before their deadline. The device ignores a task id it already
has (``sdk_device/seen_tasks.py``), so a copy that was not needed costs one control message.
Decisions: no copy on a ``hello`` (a device may repeat hellos at any time, e.g. on every
server ``online``; a restarted process has said ``online`` first); no pacing for the copies
(``task_pacing.py``): they replace a lost first attempt. A device that does not deduplicate
may run a copy after its result was accepted, find the task's blobs withdrawn and refuse it:
a refusal of an answered task is logged, not booked (``_on_device_error``), like a refused
blob request (an ``error`` whose ``ref`` is a blob id): the pull that asked for the blob, if
still running, books it; one nobody waits for (e.g. requests queued for a process that died)
is nobody's rejection.

A device that goes ``offline`` leaves the open round at once, except one whose result the
server was pulling (or whose pull ended in ``timeout``/``checksum_mismatch``): its link may have
dropped mid-upload (the broker says ``offline`` ~1.5 keep-alives, 45 s, after the link went
silent) and it offers the same result again when it reconnects (protocol §9.5), the pull resuming
where it stopped. The round waits ``AWAY_GRACE_S`` more for it (within the deadline). Measured
before this (bench/netns.py ``down60two``): a device whose link was down 60 s mid-upload lost its
round as soon as the others were in, before its link was back, with the deadline far away.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import RETRYABLE_RESULT_CODES, ProtocolError

from ..methods.base import DeviceInfo
from ..methods.tiers import resolve_tier
from .results import is_blob_id

log = logging.getLogger(__name__)

AWAY_GRACE_S = 60.0  # a device gone offline while its result was pulled is waited for this long


class Presence:
    """``MqttGrid``'s handling of hellos and statuses (a mixin: it uses the grid's state)."""

    def _on_status(self, dev: str, status: str) -> None:
        """Last will / reconnect of a device: leave or rejoin the pool of selectable devices."""
        if status == "offline" and dev in self.devices:
            log.warning("device %s went offline", dev)
            self.devices.pop(dev, None)
            self._left.add(dev)
            self.registry.set_status(dev, "offline")
            if self._uploading(dev):  # its link dropped mid-upload: it may come back and offer again
                self._away[dev] = time.monotonic() + AWAY_GRACE_S
                log.info("device %s left while its result was being pulled: the round waits up to %.0f s "
                         "for it to come back", dev, AWAY_GRACE_S)
            else:
                self._resolved.add(dev)  # do not hold the round for it
        elif status == "online" and dev not in self.devices:
            known = self.registry.state(dev)  # in memory: no query
            if known and known.num_samples:  # it said hello before: it is back
                tier = resolve_tier(known.tier, known.profile)
                self.devices[dev] = DeviceInfo(dev, known.num_samples, tier, tuple(known.runtimes or ()),
                                               known.profile or {})
                self.registry.set_status(dev, "online")
                self._await_again(dev)
                log.info("device %s is back online", dev)
                self._resend_tasks({dev}, "it is back online")
        elif status == "online":  # it reconnected without the server noticing it left
            self._resend_tasks({dev}, "it reconnected")

    def _uploading(self, dev: str) -> bool:
        """Whether ``dev`` sent a result for its open task that is being pulled, or whose pull
        ended in an error that says nothing against its data (``timeout``, ``checksum_mismatch``)."""
        with self._lock:
            pending = self._pending.get(self._task_of.get(dev, ""))
            if pending is None or pending.answered or pending.refused or not self._task_open(pending):
                return False
            pulling = any(peer == dev for peer, _, _ in self._pulls.values())
            return pulling or self._last_rejection.get(dev) in RETRYABLE_RESULT_CODES

    def _check_away(self) -> None:
        """Stop waiting for devices that left mid-upload and did not come back in time."""
        now = time.monotonic()
        for dev, until in list(self._away.items()):
            if now >= until:
                del self._away[dev]
                if dev in self._left:
                    self._resolved.add(dev)
                    log.warning("device %s did not come back within %.0f s: the round stops waiting for it",
                                dev, AWAY_GRACE_S)

    def _await_again(self, dev: str) -> None:
        """A device back online may still deliver its open task's result: wait for it again."""
        self._away.pop(dev, None)
        if dev in self._left and any(p.instruction.device_id == dev and p.round == self._open_round
                                     and not (p.answered or p.refused) for p in self._pending.values()):
            self._left.discard(dev)
            self._resolved.discard(dev)

    def _on_hello(self, dev: str, hello: msgs.Hello) -> None:
        if hello.device_id != dev:
            if self._books(dev, "invalid_field"):  # garbage anyone on its topic could send: rate-limited
                err = ProtocolError("invalid_field", "hello names another device")
                self._reject(dev, None, err, self._open_round)
            return
        self.registry.record_hello(dev, hello.profile, hello.runtimes, hello.num_samples)
        tier = resolve_tier(self.registry.tier_of(dev), hello.profile)  # in memory: no query
        self.devices[dev] = DeviceInfo(dev, hello.num_samples, tier, tuple(hello.runtimes), hello.profile)
        self._await_again(dev)
        log.info("device %s online: %d samples, runtimes %s", dev, hello.num_samples, hello.runtimes)

    def _on_device_error(self, dev: str, error: msgs.Error) -> None:
        """A device's ``error``: recorded as ``device:<code>`` (its refusal of its open task ends
        the wait for it), except refused blob requests and refusals of answered tasks (above)."""
        task = self._pending.get(error.ref or "")
        own = task is not None and task.instruction.device_id == dev
        if is_blob_id(error.ref) or (own and task.answered):
            what = "blob" if is_blob_id(error.ref) else "a copy of task"
            log.info("device %s refused %s %s: %s (not booked)", dev, what, error.ref[:12], error.code)
            return
        if not own and not self._books(dev, "device:"):  # one key: a flood may make up any code
            return  # about no task of its own: garbage anyone on its topic could send, rate-limited
        if own and self._fall_back(dev, error, task):  # kernel_fallback.py: a portable task went out
            return
        log.warning("device %s reports %s: %s", dev, error.code, error.detail)
        if own:
            self._resolved.add(dev)  # it refused its task
        self._record_rejection(self._round_of(dev, error.ref), dev, error.ref, f"device:{error.code}",
                               error.detail)

    def _link_connects(self) -> int:
        """The server link's connects so far (0 for a grid built without a link: unit tests)."""
        link = getattr(self.endpoint, "link", None)
        return link.connects if link is not None else 0

    def _check_reconnect(self) -> None:
        """After the server's own reconnect, every online device's open task goes out again."""
        connects = self._link_connects()
        if connects != self._connects_seen:
            self._connects_seen = connects
            self._resend_tasks(set(self.devices), "the server reconnected to the broker")

    def _resend_tasks(self, devices: set[str], why: str) -> int:
        """Send the open, unanswered task of each of ``devices`` again (module docstring); how many."""
        now, sent = time.time(), 0
        for dev in devices:
            with self._lock:
                pending = self._pending.get(self._task_of.get(dev, ""))
                if (pending is None or pending.task is None or pending.answered or dev in self._resolved
                        or not self._task_open(pending) or pending.task.deadline <= now
                        or dev not in self.devices):
                    continue
            self.endpoint.send(dev, replace(pending.task, msg_id=msgs.new_id(), sent_at=now))
            sent += 1
            log.info("round %d: task %s sent to %s again (%s)", pending.round, pending.task_id[:8], dev, why)
        return sent
