"""Unit tests of the topic layout of the wire protocol (sdk_device.protocol.topics)."""

from __future__ import annotations

import pytest

from sdk_device.protocol.topics import PROTOCOL_VERSION, ROOT, FleetTopics, check_name

T = FleetTopics("lab")

BAD_NAMES = ["", "a/b", "+", "dev+", "#", "dev#", "x" * 65, "with space", "ü", "a\tb", None, 5]


def test_root():
    assert PROTOCOL_VERSION == 1
    assert ROOT == "fedsdk/v1"


def test_topic_strings():
    assert T.base == "fedsdk/v1/lab"
    assert T.server_status == "fedsdk/v1/lab/server/status"
    assert T.device_base("d1") == "fedsdk/v1/lab/dev/d1"
    assert T.device_status("d1") == "fedsdk/v1/lab/dev/d1/status"
    assert T.up("d1") == "fedsdk/v1/lab/dev/d1/up"
    assert T.down("d1") == "fedsdk/v1/lab/dev/d1/down"
    assert T.up_chunk("d1") == "fedsdk/v1/lab/dev/d1/up/chunk"
    assert T.down_chunk("d1") == "fedsdk/v1/lab/dev/d1/down/chunk"


def test_subscriptions():
    assert T.server_subscriptions == [
        "fedsdk/v1/lab/dev/+/up",
        "fedsdk/v1/lab/dev/+/up/chunk",
        "fedsdk/v1/lab/dev/+/status",
    ]
    assert T.device_subscriptions("d1") == [
        "fedsdk/v1/lab/dev/d1/down",
        "fedsdk/v1/lab/dev/d1/down/chunk",
        "fedsdk/v1/lab/broadcast/epoch",
        "fedsdk/v1/lab/server/status",
    ]
    # a device never subscribes to another device's subtree or to wildcards
    for sub in T.device_subscriptions("d1"):
        assert "+" not in sub and "#" not in sub


@pytest.mark.parametrize("name", ["a", "dev-01", "A_b.c", "0", "x" * 64, "..", "-"])
def test_valid_names(name):
    assert check_name("device id", name) == name
    assert FleetTopics(name).fleet == name
    assert T.up(name).endswith(f"/dev/{name}/up")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_device_id(name):
    with pytest.raises(ValueError, match="invalid device id"):
        T.up(name)
    with pytest.raises(ValueError):
        T.device_subscriptions(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_fleet_name(name):
    with pytest.raises(ValueError, match="invalid fleet name"):
        FleetTopics(name)


@pytest.mark.parametrize("method", ["device_base", "device_status", "up", "down", "up_chunk", "down_chunk"])
def test_every_device_topic_checks_the_id(method):
    with pytest.raises(ValueError):
        getattr(T, method)("a/b")


def test_trailing_newline_rejected():
    with pytest.raises(ValueError):
        check_name("device id", "dev1\n")


@pytest.mark.parametrize("rest", ["up", "up/chunk", "status", "down", ""])
def test_parse_device_topic(rest):
    topic = f"{T.device_base('dev-7')}/{rest}" if rest else T.device_base("dev-7")
    assert T.parse_device_topic(topic) == ("dev-7", rest)


def test_parse_round_trips_generated_topics():
    for make, rest in [(T.up, "up"), (T.up_chunk, "up/chunk"), (T.device_status, "status")]:
        assert T.parse_device_topic(make("abc")) == ("abc", rest)


@pytest.mark.parametrize("topic", [
    "fedsdk/v1/other/dev/d1/up",      # another fleet
    "fedsdk/v2/lab/dev/d1/up",        # another protocol version
    "fedsdk/v1/lab/server/status",    # not a device topic
    "fedsdk/v1/lab/dev/",             # empty device id
    "fedsdk/v1/lab/dev/+/up",         # wildcard as id
    "fedsdk/v1/lab/dev/#",
    "fedsdk/v1/lab/devices/d1/up",
    "xfedsdk/v1/lab/dev/d1/up",
    "",
])
def test_parse_device_topic_rejects(topic):
    with pytest.raises(ValueError):
        T.parse_device_topic(topic)


def test_fleet_prefix_is_not_confused_with_longer_fleet_name():
    with pytest.raises(ValueError):
        T.parse_device_topic("fedsdk/v1/lab2/dev/d1/up")
