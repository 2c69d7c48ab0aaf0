"""Taking a device's result on the MQTT grid: pull its array records from the device,
check them, persist them, and only then acknowledge (the grid's fetch threads).

A result arrives as a control message naming its records (``msgs.Result``); ``MqttGrid``
queues ``_accept`` on a fetch thread, which pulls every record from the device itself
(``from_peer``: never a copy the server already holds, so a forged result cannot point at
another device's blob), one pull per blob id at a time (two edges' byte-identical records share
a partial file), and validates it (``results.check_pulled``: shapes, NaN, size, replays).
A rejection of the device's own data resolves the device for the round; any other leaves the
task open (the device may offer again). An unexpected error is logged with its traceback and
leaves the task open too: a bug in one pull never ends the server nor vanishes.
"""

from __future__ import annotations

import logging

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import OwnDataError, ProtocolError

from ..methods.base import MODEL
from .bundle_results import is_bundle
from .results import PendingTask, check_pulled
from .task_records import ARRAYS_KEY

log = logging.getLogger(__name__)


class ResultPulls:
    """The result-taking half of ``MqttGrid`` (a mixin: it uses the grid's registry, endpoint,
    lock, open-round state and ``_reject``/``_acknowledge``)."""

    def _cancel_pulls(self, reason: str) -> None:
        """Stop every result pull still queued or running (they end rejected as round_closed)."""
        with self._lock:
            pulls = list(self._pulls.values())
        for dev, result, future in pulls:
            future.cancel()
            for ref in result.arrays.values():
                self.endpoint.cancel_fetch(dev, ref.id, reason)

    def _accept(self, dev: str, result: msgs.Result, pending: PendingTask, key: tuple,
                comebacks: int = 0) -> None:
        """Pull, validate and persist one result's array records, then acknowledge it (fetch thread).
        ``comebacks``: the device's count of returns online when its result arrived."""
        try:
            decoded = self._pull_result(dev, result, pending)
        except ProtocolError as err:
            if err.code == "not_offered" and self.endpoint.comebacks.get(dev, 0) != comebacks:
                log.info("%s restarted: its result of task %s is gone; the task is sent again", dev,
                         result.task_id[:8])  # the offer died with the old process: not booked
                return
            self._reject(dev, result.task_id, err, pending.round,
                         tell=err.code != "not_offered",  # the device never sent it: not its fault
                         # an edge's bad member record leaves its bundle task open: the edge
                         # may answer again without that member (docs/protocol.md §10.2)
                         pending=pending if isinstance(err, OwnDataError)
                         and not is_bundle(pending.instruction) else None)
            return
        except Exception:  # a fetch thread's Future would swallow a bug silently
            log.exception("pulling the result of task %s from %s failed; its task stays open",
                          result.task_id[:8], dev)
            return
        finally:
            with self._lock:
                self._pulls.pop(key, None)
        with self._lock:
            if not self._task_open(pending):
                self._reject(dev, result.task_id, ProtocolError("round_closed", "the round closed meanwhile"),
                             pending.round)
                return
            if pending.answered:
                log.info("task %s of %s already has an accepted result", result.task_id[:8], dev)
                return
            pending.answered = True  # one result per task
            pending.decoded = decoded
            metrics = {k: v for k, v in result.metrics.items() if k != ARRAYS_KEY}  # the server's key
            metrics[ARRAYS_KEY] = {name: ref.id for name, ref in result.arrays.items() if name != MODEL}
            self.registry.add_update(pending.round, dev, result.task_id, result.arrays[MODEL].id,
                                     result.metrics["samples"], metrics)
            self._accepted.append(result.task_id)
            self._resolved.add(dev)
        self._acknowledge(dev, result.task_id)
        self.endpoint.withdraw(dev)
        log.info("round %d: accepted update from %s (%d samples)", pending.round, dev,
                 result.metrics["samples"])

    def _pull_result(self, dev: str, result: msgs.Result, pending: PendingTask) -> dict[str, dict]:
        """Pull and check every array record of ``result``; returns them decoded (record name ->
        tensors). Raises ProtocolError; OwnDataError when a record pulled from the device and
        matching its id is no valid update."""
        decoded = {}
        for name, ref in sorted(result.arrays.items()):
            if not self._task_open(pending):
                raise ProtocolError("round_closed", f"round {pending.round} closed during the pull")
            try:
                with self._blob_locks[hash(ref.id) % 64]:
                    data = self.endpoint.fetch(dev, ref, durable=True, timeout_s=self.fetch_timeout_s,
                                               from_peer=True)  # never a blob the server has (forgery)
            except TimeoutError as exc:
                raise ProtocolError("timeout", str(exc)) from None
            except ProtocolError as err:
                if err.code != "cancelled":
                    raise
                raise ProtocolError("round_closed", f"round {pending.round} closed during the pull") from None
            # an edge's bundle relays its members' updates (its own `model` record is empty, the
            # same bytes every round): the replay rule is for a device's own update
            replay_of = None if is_bundle(pending.instruction) else self.registry.replayed(
                dev, ref.id, result.task_id)
            decoded[name] = check_pulled(name, data, pending, replay_of)
        return decoded
