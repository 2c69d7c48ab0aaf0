"""Unit tests of the control messages of wire protocol v2 (sdk_device.protocol.messages)."""

from __future__ import annotations

import json

import pytest

from sdk_device.protocol import messages as m
from sdk_device.protocol.errors import ProtocolError

BLOB_A = "a" * 64
BLOB_B = "0123456789abcdef" * 4


def _ref(blob_id: str = BLOB_A, size: int = 10, kind: str = "weights", fmt: str = "safetensors") -> m.BlobRef:
    return m.BlobRef(id=blob_id, size=size, kind=kind, format=fmt)


EXAMPLES: list[m.Message] = [
    m.Hello(device_id="dev-1", runtimes=["torch"], num_samples=120,
            profile={"ram_mb": 512, "cpu": "arm", "nested": {"x": [1, 2.5]}}),
    m.Task(task_id="t" * 32, round=3, programs={"model": [_ref(BLOB_B, 99, "program", "torchspec/1")]},
           arrays={"model": _ref()}, deadline=1_700_000_000.25,
           config={"steps": [{"train": "model", "recipe": {"epochs": 1, "lr": 0.1}}]}),
    m.Result(task_id="t1", round=7, arrays={"model": _ref(size=0)}, metrics={"loss": 0.5, "accuracy": 0.75}),
    m.Ack(ref="t1", detail="stored"),
    m.Error(code="bad_task", detail="nope", ref="t1"),
    m.Heartbeat(state="training", task_id="t1", progress=0.5),
    m.StatusRequest(),
    m.ServerStatus(epoch="9f1c3a5e", started_at=1767225600.0, announce_window_s=1.0),
    m.SecAgg(round=3, stage="advertise", data={"c_pk": "AAAA", "s_pk": "AAAA"}),
    m.BlobRequest(blob=BLOB_A, indices=[0, 3, 7], chunk_bytes=1024),
]
PAIR_EXAMPLES: list[m.Message] = [  # pairing (docs/protocol.md §19)
    m.PairCaRequest(),
    m.PairCa(ca_pem="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
    m.PairRequest(code="K7QF-M2XD", name="pi-kitchen", profile={"arch": "aarch64", "memory_mb": 3790.5}),
    m.PairOffer(session="s" * 32, fleet="lab", blobs=[_ref(BLOB_B, 99, "program", "torchspec/1"), _ref()],
                models={"0.5": {"programs": [BLOB_B], "weights": BLOB_A, "train_memory_mb": 1.5}},
                recipe={"batch_size": 16}, expires_at=1_700_000_600.0),
    m.PairConfirm(session="s" * 32, name="pi-kitchen", profile={"bench": {"runtimes": []}}),
    m.PairAccept(device_id="pi-kitchen", username="pi-kitchen", password="p" * 32, fleet="lab",
                 broker_url="mqtts://server:8883", tier="0.5", tier_reason="fits", ca_pem=None),
    m.UnpairRequest(device_id="pi-kitchen", password="p" * 32),
]


def _raw(**body) -> bytes:
    return json.dumps(body).encode()


def _valid_body(message: m.Message) -> dict:
    return json.loads(m.encode(message))


def _code(payload: bytes) -> str:
    with pytest.raises(ProtocolError) as info:
        m.decode(payload)
    return info.value.code


# ---- round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize("message", EXAMPLES + PAIR_EXAMPLES, ids=lambda msg: msg.TYPE)
def test_round_trip_every_type(message):
    data = m.encode(message)
    body = json.loads(data)
    assert body["schema"] == m.SCHEMA_VERSION
    assert body["type"] == message.TYPE
    decoded = m.decode(data)
    assert type(decoded) is type(message)
    assert decoded == message  # includes msg_id and sent_at


def test_every_message_type_is_covered():
    assert {msg.TYPE for msg in EXAMPLES + PAIR_EXAMPLES} == set(m.MESSAGE_TYPES)


def test_blob_refs_are_rebuilt_as_blob_refs():
    task = m.decode(m.encode(EXAMPLES[1]))
    assert isinstance(task.arrays["model"], m.BlobRef)
    assert all(isinstance(p, m.BlobRef) for p in task.programs["model"])
    assert task.programs["model"][0].format == "torchspec/1"


def test_a_task_names_the_same_models_in_programs_and_arrays():
    body = _valid_body(EXAMPLES[1])
    body["arrays"] = {"model": body["arrays"]["model"], "teacher": body["arrays"]["model"]}
    assert _code(json.dumps(body).encode()) == "invalid_field"


def test_record_names_must_be_short_strings():
    body = _valid_body(EXAMPLES[2])
    body["arrays"] = {"x" * 65: body["arrays"]["model"]}
    assert _code(json.dumps(body).encode()) == "invalid_field"


def test_a_version_1_message_gets_unsupported_schema():
    old_task = {"schema": 1, "type": "task", "task_id": "t", "round": 1, "programs": [], "weights": {},
                "recipe": {}, "deadline": 1.0}
    with pytest.raises(ProtocolError) as info:
        m.decode(json.dumps(old_task).encode())
    assert info.value.code == "unsupported_schema" and "speaks 2" in info.value.detail


def test_msg_ids_are_fresh_hex():
    a, b = m.Ack(ref="x"), m.Ack(ref="x")
    assert a.msg_id != b.msg_id
    assert len(a.msg_id) == 32 and int(a.msg_id, 16) >= 0


def test_optional_fields_default():
    ack = m.decode(_raw(schema=2, type="ack", ref="r"))
    assert ack.detail == ""
    assert len(ack.msg_id) == 32 and isinstance(ack.sent_at, float)
    err = m.decode(_raw(schema=2, type="error", code="c", detail="d"))
    assert err.ref is None
    hb = m.decode(_raw(schema=2, type="heartbeat", state="idle"))
    assert hb.task_id is None and hb.progress == 0.0


def test_optional_none_accepted_explicitly():
    err = m.decode(_raw(schema=2, type="error", code="c", detail="d", ref=None))
    assert err.ref is None


def test_int_for_float_field_becomes_float():
    hb = m.decode(_raw(schema=2, type="heartbeat", state="s", progress=1, sent_at=5))
    assert hb.progress == 1.0 and isinstance(hb.progress, float)
    assert isinstance(hb.sent_at, float)


def test_unknown_extra_fields_are_ignored():
    ack = m.decode(_raw(schema=2, type="ack", ref="r", surprise=[1, 2]))
    assert ack.ref == "r"


# ---- rejections ------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", [
    b"not json", b"{", b"\xff\xfe", b"", b"[1, 2]", b'"text"', b"42", b"null",
])
def test_malformed_or_not_an_object(payload):
    assert _code(payload) == "malformed"


@pytest.mark.parametrize("schema", [None, 0, 1, 3, "2", [2]])
def test_wrong_schema_version(schema):
    body = {"type": "ack", "ref": "r"}
    if schema is not None:
        body["schema"] = schema
    assert _code(json.dumps(body).encode()) == "unsupported_schema"


def test_schema_true_is_not_a_version():
    assert _code(_raw(schema=True, type="ack", ref="r")) == "unsupported_schema"


@pytest.mark.parametrize("kind", ["nope", "", None, 5, ["ack"], "Ack"])
def test_unknown_type(kind):
    body = {"schema": 2, "ref": "r"}
    if kind is not None:
        body["type"] = kind
    assert _code(json.dumps(body).encode()) == "unknown_type"


@pytest.mark.parametrize("message", [e for e in EXAMPLES + PAIR_EXAMPLES[1:] if e.TYPE != "status_request"],
                         ids=lambda msg: msg.TYPE)  # (a status_request has no field)
def test_missing_required_field(message):
    body = _valid_body(message)
    required = {"hello": "device_id", "task": "arrays", "result": "metrics", "ack": "ref",
                "error": "code", "heartbeat": "state", "blob_request": "indices", "pair_ca": "ca_pem",
                "pair_request": "code", "pair_offer": "session", "pair_confirm": "profile",
                "pair_accept": "password", "unpair_request": "device_id", "secagg": "stage",
                "server_status": "epoch"}[message.TYPE]
    del body[required]
    with pytest.raises(ProtocolError) as info:
        m.decode(json.dumps(body).encode())
    assert info.value.code == "invalid_field"
    assert required in info.value.detail


@pytest.mark.parametrize("field,value", [
    ("round", "3"),            # string where int expected
    ("round", True),           # bool is not an int here
    ("round", 3.0),            # float is not an int
    ("deadline", True),        # bool is not a float
    ("deadline", "soon"),
    ("task_id", 12),
    ("task_id", None),         # not optional
    ("programs", []),          # list where an object of named program lists is expected
    ("programs", {"model": ["x"]}),  # list item is not a blob ref
    ("programs", {"model": []}),     # a model without a program
    ("arrays", {"model": "a" * 64}),  # string where a blob ref is expected
    ("config", []),            # list where dict expected
    ("task_id", "x" * (m.MAX_STRING + 1)),  # string too long
])
def test_wrong_field_type(field, value):
    body = _valid_body(EXAMPLES[1])
    body[field] = value
    with pytest.raises(ProtocolError) as info:
        m.decode(json.dumps(body).encode())
    assert info.value.code == "invalid_field"


def test_bool_in_int_list_rejected():
    body = _valid_body(EXAMPLES[-1])
    body["indices"] = [0, True]
    with pytest.raises(ProtocolError, match="invalid_field"):
        m.decode(json.dumps(body).encode())


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("where", ["field", "nested"])
def test_nan_and_infinity_literals_rejected(literal, where):
    if where == "field":
        text = '{"schema":2,"type":"heartbeat","state":"s","progress":LIT}'
    else:
        text = ('{"schema":2,"type":"result","task_id":"t","round":1,"arrays":{"model":{"id":"ID","size":1,'
                '"kind":"weights","format":"safetensors"}},"metrics":{"loss":LIT}}').replace("ID", BLOB_A)
    text = text.replace("LIT", literal)
    assert _code(text.encode()) == "malformed"


def test_overflowing_float_rejected_in_float_field():
    # 1e400 is refused while parsing, before any field is looked at
    assert _code(b'{"schema":2,"type":"heartbeat","state":"s","progress":1e400}') == "malformed"


@pytest.mark.parametrize("bad_id", [
    "a" * 63, "a" * 65, "A" * 64, "g" * 64, "", " " + "a" * 63,
])
def test_bad_blob_ref_id(bad_id):
    body = _valid_body(EXAMPLES[2])
    body["arrays"]["model"]["id"] = bad_id
    assert _code(json.dumps(body).encode()) == "invalid_field"


def test_bad_blob_ref_fields():
    body = _valid_body(EXAMPLES[2])
    body["arrays"]["model"]["size"] = -1
    assert _code(json.dumps(body).encode()) == "invalid_field"
    body = _valid_body(EXAMPLES[2])
    del body["arrays"]["model"]["format"]
    assert _code(json.dumps(body).encode()) == "invalid_field"
    body = _valid_body(EXAMPLES[2])
    body["arrays"]["model"]["size"] = "10"
    assert _code(json.dumps(body).encode()) == "invalid_field"


def test_blob_ref_constructor_validates():
    with pytest.raises(ProtocolError, match="invalid_field"):
        m.BlobRef(id="xyz", size=1, kind="weights", format="safetensors")
    with pytest.raises(ProtocolError, match="invalid_field"):
        m.BlobRef(id=BLOB_A, size=-5, kind="weights", format="safetensors")


# ---- size limits ------------------------------------------------------------------------------

def test_encode_too_large():
    big = m.Hello(device_id="d", runtimes=["torch"], num_samples=1,
                  profile={"blob": "x" * (m.MAX_CONTROL_BYTES + 1)})
    with pytest.raises(ProtocolError) as info:
        m.encode(big)
    assert info.value.code == "too_large"


def test_encode_just_under_limit_passes():
    base = len(m.encode(m.Ack(ref="", detail="", msg_id="0" * 32, sent_at=1.0)))
    fits = m.Ack(ref="", detail="x" * (m.MAX_CONTROL_BYTES - base), msg_id="0" * 32, sent_at=1.0)
    assert len(m.encode(fits)) == m.MAX_CONTROL_BYTES
    over = m.Ack(ref="", detail="x" * (m.MAX_CONTROL_BYTES - base + 1), msg_id="0" * 32, sent_at=1.0)
    with pytest.raises(ProtocolError, match="too_large"):
        m.encode(over)


def test_decode_too_large_is_rejected_unread():
    payload = b"x" * (m.MAX_CONTROL_BYTES + 1)  # not even JSON: the size check comes first
    assert _code(payload) == "too_large"
    padded = _raw(schema=2, type="ack", ref="r", pad="y" * m.MAX_CONTROL_BYTES)
    assert _code(padded) == "too_large"


# ---- bugs -----------------------------------------------------------------------------------

def test_deeply_nested_json_is_malformed():
    assert _code(b"[" * 20000) == "malformed"


def test_encode_nan_metric_raises_protocol_error():
    result = m.Result(task_id="t", round=1, arrays={"model": _ref()}, metrics={"loss": float("nan")})
    with pytest.raises(ProtocolError):
        m.encode(result)


def test_the_error_claim_reads_exactly_what_a_control_message_may_be():
    from sdk_device.protocol.error_claim import MAX_CLAIM_BYTES

    assert MAX_CLAIM_BYTES == m.MAX_CONTROL_BYTES
    assert m.says_error(b'{"schema":1,"type":"error"}') and not m.says_error(b'{"type":"hello"}')
