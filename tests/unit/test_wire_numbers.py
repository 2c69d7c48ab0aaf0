"""Numbers a peer may not send: every receiver rejects them with one ProtocolError code
(``malformed`` while parsing, ``invalid_field`` for a field's range), never a traceback."""

from __future__ import annotations

import json
import struct

import pytest

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import CHUNK_MAGIC, decode_chunk
from sdk_device.protocol.epoch import ServerEpoch
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.wire_json import MAX_INT


def hello(num_samples: str = "600", sent_at: str = "1767225600.0", profile: str = "{}") -> bytes:
    return (f'{{"schema":2,"type":"hello","msg_id":"{"a" * 32}","sent_at":{sent_at},"device_id":"pi",'
            f'"runtimes":["torch"],"num_samples":{num_samples},"profile":{profile}}}').encode()


def code_of(payload: bytes) -> str:
    with pytest.raises(ProtocolError) as caught:
        msgs.decode(payload)
    return caught.value.code


def test_a_400_digit_number_in_a_hello_is_malformed():
    assert code_of(hello(num_samples="9" * 400)) == "malformed"
    assert code_of(hello(sent_at="1" + "0" * 399)) == "malformed"  # a float field: float() would overflow


def test_numbers_beyond_64_bits_or_a_double_are_malformed_wherever_they_are():
    assert code_of(hello(num_samples=str(10**30))) == "malformed"
    assert code_of(hello(profile=f'{{"cpu_count":{-(MAX_INT + 1)}}}')) == "malformed"
    assert code_of(hello(profile='{"memory_mb":1e400}')) == "malformed"
    assert code_of(hello(num_samples="9" * 5000)) == "malformed"  # beyond Python's own digit limit


def test_the_largest_64_bit_integer_still_parses():
    profile = msgs.decode(hello(profile=f'{{"x":{MAX_INT},"y":{-MAX_INT}}}')).profile
    assert profile == {"x": MAX_INT, "y": -MAX_INT}


@pytest.mark.parametrize("num_samples", ["-5", "0", str(msgs.MAX_SAMPLES + 1)])
def test_num_samples_out_of_range_is_an_invalid_field(num_samples):
    with pytest.raises(ProtocolError, match="num_samples") as caught:
        msgs.decode(hello(num_samples=num_samples))
    assert caught.value.code == "invalid_field"


def test_num_samples_at_the_cap_is_accepted():
    assert msgs.decode(hello(num_samples=str(msgs.MAX_SAMPLES))).num_samples == msgs.MAX_SAMPLES


def test_an_epoch_with_an_overflowing_number_is_malformed():
    payload = json.dumps({"epoch": "ab", "started_at": 1}).replace("1}", "1" + "0" * 400 + "}").encode()
    with pytest.raises(ProtocolError) as caught:
        ServerEpoch.decode(payload)
    assert caught.value.code == "malformed"


def test_a_chunk_header_with_an_overflowing_number_is_malformed():
    fields = {"blob": "ab" * 32, "sha256": "cd" * 32, "index": 0, "count": 1, "size": 7, "chunk_bytes": 4}
    header = json.dumps(fields).replace('"size": 7', '"size": ' + "9" * 400).encode()
    frame = CHUNK_MAGIC + struct.pack(">I", len(header)) + header + b"data"
    with pytest.raises(ProtocolError) as caught:
        decode_chunk(frame)
    assert caught.value.code == "malformed"
