"""The task pacer (rounds/task_pacing.py) and the endpoint's serve queue (transport/serve_queue.py)."""

from __future__ import annotations

import time

import pytest

from sdk_device.protocol import messages as msgs
from sdk_device.transport.serve_queue import ServeQueue
from server_toolkit.rounds.task_pacing import TaskPacer


class ServedBlobs:
    """An endpoint stand-in: which (device, blob) pulls got their last chunk."""

    def __init__(self) -> None:
        self.done: set[tuple[str, str]] = set()

    def served(self, peer: str, blob_id: str) -> bool:
        return (peer, blob_id) in self.done


def test_the_pacer_holds_the_next_task_until_a_loading_device_got_its_blobs_or_was_resolved():
    pacer, endpoint, resolved = TaskPacer(window=2, recheck_s=0.0), ServedBlobs(), set()
    pacer.begin()
    pacer.sent("a", ["w1", "w2"])
    assert pacer.has_room(endpoint, resolved)
    pacer.sent("b", ["w1"])
    assert not pacer.has_room(endpoint, resolved)
    endpoint.done.add(("a", "w1"))
    assert not pacer.has_room(endpoint, resolved)  # a still pulls w2
    endpoint.done.add(("a", "w2"))
    assert pacer.has_room(endpoint, resolved) and pacer.loading() == 1
    pacer.sent("c", ["w1"])
    resolved.add("b")  # b refused its task (or went offline, or its result was accepted)
    assert pacer.has_room(endpoint, resolved) and pacer.loading() == 1


def test_a_device_that_never_pulls_stops_counting_after_the_load_timeout():
    pacer = TaskPacer(window=1, load_timeout_s=0.05)
    pacer.begin()
    pacer.sent("a", ["w"])
    assert not pacer.has_room(ServedBlobs(), set())
    time.sleep(0.1)
    assert pacer.has_room(ServedBlobs(), set())


def test_a_full_window_is_looked_at_again_only_after_the_recheck_interval():
    pacer, endpoint = TaskPacer(window=1, recheck_s=0.2), ServedBlobs()
    pacer.begin()
    pacer.sent("a", ["w"])
    assert not pacer.has_room(endpoint, set())
    endpoint.done.add(("a", "w"))
    assert not pacer.has_room(endpoint, set())  # asked again at once: not looked at yet
    time.sleep(0.25)
    assert pacer.has_room(endpoint, set())


def test_a_window_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        TaskPacer(window=0)


def test_the_serve_queue_drops_a_repeat_of_a_waiting_request_but_not_of_one_being_served():
    queue, ask = ServeQueue(), msgs.BlobRequest(blob="b" * 64, indices=[0, 1], chunk_bytes=1024)
    queue.put(("dev", ask))
    queue.put(("dev", ask))  # asked again while the first waits: dropped
    queue.put(("other", ask))  # another peer's request is its own
    assert queue.dropped == 1
    assert queue.get() == ("dev", ask)
    queue.put(("dev", ask))  # the first is being served; its chunks may be lost: queued again
    queue.put(None)
    assert [queue.get(), queue.get(), queue.get()] == [("other", ask), ("dev", ask), None]
