"""The status request (docs/protocol.md §3.2): a device asks the server who it is after each
connect, the server answers from its epoch, and brokers without retained messages are named
with ``?retain=0`` — without a broker."""

from __future__ import annotations

import random

import pytest

from sdk_device.announce import STATUS_ATTEMPTS, Announcer
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.epoch import ServerEpoch
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint
from sdk_device.transport.mqtt_link import BrokerAddress

HELLO = msgs.Hello(device_id="d1", runtimes=["torch"], num_samples=10, profile={})


class Later:
    """A scheduler that keeps delayed calls for the test to run."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, object]] = []

    def __call__(self, delay_s, fn):
        self.calls.append((delay_s, fn))
        return self

    def cancel(self) -> None:
        pass

    def run_all(self) -> None:
        calls, self.calls = self.calls, []
        for _, fn in calls:
            fn()


def announcer() -> tuple[Announcer, list[msgs.Message], Later]:
    sent, later = [], Later()
    return Announcer(sent.append, HELLO, None, random.Random(0), later), sent, later


def kinds(sent: list[msgs.Message]) -> list[str]:
    return [m.TYPE for m in sent]


def test_the_start_hello_is_followed_by_a_status_request():
    a, sent, _ = announcer()
    a.say_hello()
    assert kinds(sent) == ["hello", "status_request"]


def test_an_unanswered_status_request_is_repeated_a_bounded_number_of_times():
    a, sent, later = announcer()
    a.say_hello()
    for _ in range(10):
        later.run_all()
    assert kinds(sent).count("status_request") == STATUS_ATTEMPTS
    assert later.calls == []


def test_an_answer_ends_the_repeats_and_a_reconnect_asks_again():
    a, sent, later = announcer()
    a.say_hello()
    a.on_event("epoch", ServerEpoch("aa", 1.0, 0.0), True)  # the server_status answer
    later.run_all()
    assert kinds(sent) == ["hello", "status_request"]
    a.on_event("connected", True, False)
    assert kinds(sent) == ["hello", "status_request", "status_request"]


def test_an_answer_naming_the_server_of_the_start_hello_brings_no_second_hello():
    a, sent, later = announcer()
    a.say_hello()
    a.on_event("epoch", ServerEpoch("aa", 1.0, 0.0), True)
    later.run_all()
    assert kinds(sent).count("hello") == 1


def test_an_answer_naming_a_new_server_brings_a_hello_within_its_window():
    a, sent, later = announcer()
    a.say_hello()
    a.on_event("epoch", ServerEpoch("aa", 1.0, 5.0), True)
    a.on_event("connected", True, False)  # reconnected after the server restarted unseen
    a.on_event("epoch", ServerEpoch("bb", 1.0, 5.0), True)  # its answer: someone new
    hello_delays = [d for d, fn in later.calls if "_ask_status" not in fn.__qualname__]
    assert len(hello_delays) == 1 and 0.0 <= hello_delays[0] <= 5.0
    later.run_all()
    assert kinds(sent).count("hello") == 2


def server_and_device_endpoints(tmp_path) -> tuple[Endpoint, Endpoint, list, list]:
    address = BrokerAddress("127.0.0.1", 1)  # never connected: the tests call the routing directly
    topics = FleetTopics("f")
    server = Endpoint(address, topics, BlobStore(tmp_path / "s"))
    device = Endpoint(address, topics, BlobStore(tmp_path / "d"), device_id="d1")
    published, events = [], []
    server.link.publish = lambda topic, payload, **kw: published.append((topic, payload))
    device.on_server_event = lambda kind, value, retained: events.append((kind, value, retained))
    return server, device, published, events


def test_the_server_answers_a_status_request_with_its_epoch_on_the_devices_topic(tmp_path):
    server, device, published, events = server_and_device_endpoints(tmp_path)
    epoch = ServerEpoch("9f1c", 1767225600.0, 2.5)
    server._on_message("fedsdk/v1/f/dev/d1/up", msgs.encode(msgs.StatusRequest()))
    assert published == []  # no epoch yet: nothing to say
    server.announce_epoch(epoch)
    server._on_message("fedsdk/v1/f/dev/d1/up", msgs.encode(msgs.StatusRequest()))
    [(topic, payload)] = published
    answer = msgs.decode(payload)
    assert topic == "fedsdk/v1/f/dev/d1/down" and isinstance(answer, msgs.ServerStatus)
    assert (answer.epoch, answer.started_at, answer.announce_window_s) == ("9f1c", 1767225600.0, 2.5)
    assert server.inbox.empty()  # answered on paho's thread: the round loop never sees it
    device._on_message("fedsdk/v1/f/dev/d1/down", payload)
    assert events == [("epoch", epoch, True), ("status", "online", True)]
    assert device.routes.control_topic(SERVER) == "fedsdk/v1/f/dev/d1/up"


@pytest.mark.parametrize("epoch", ["", "ABC", "x" * 3, "a" * 65])
def test_a_server_status_with_a_bad_epoch_is_invalid(epoch):
    body = b'{"schema":2,"type":"server_status","epoch":"%s"}' % epoch.encode()
    with pytest.raises(ProtocolError) as info:
        msgs.decode(body)
    assert info.value.code == "invalid_field"


def test_a_broker_url_says_when_the_broker_keeps_no_retained_messages():
    assert BrokerAddress.parse("mqtt://h:1883").retain
    plain = BrokerAddress.parse("mqtt://u:p@h:1884?retain=0")
    assert not plain.retain and plain.url == "mqtt://h:1884?retain=0"
    assert BrokerAddress.parse(plain.url) == BrokerAddress("h", 1884, retain=False)
    with pytest.raises(ValueError, match="retain=0"):
        BrokerAddress.parse("mqtt://h:1883?retain=no")


def test_a_broker_url_may_name_several_nodes_of_one_cluster_tried_in_order():
    address = BrokerAddress.parse("mqtt://u:p%40x@127.0.0.1:1884,127.0.0.1:1885,other?retain=0")
    assert address.nodes == [("127.0.0.1", 1884), ("127.0.0.1", 1885), ("other", 1883)]
    assert (address.username, address.password, address.retain) == ("u", "p@x", False)
    assert BrokerAddress.parse(address.url).nodes == address.nodes
    with pytest.raises(ValueError, match="mqtt://host:port"):
        BrokerAddress.parse("mqtt://a:1,b:notaport")
