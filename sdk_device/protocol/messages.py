"""Control messages of wire protocol v2: JSON objects with a schema version.

Every message is one flat JSON object::

    {"schema": 2, "type": "<type>", "msg_id": "<hex>", "sent_at": <unix seconds>, ...fields}

``decode`` validates the envelope and every field before anything else sees the message,
so the rest of the code only ever handles well-formed messages. Invalid input raises
``ProtocolError`` with a code the receiver sends back in an ``Error`` message.
"""

from __future__ import annotations

import functools
import json
import math
import time
import types
import typing
import uuid
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

from . import wire_json
from .bounds import MAX_SAMPLES as MAX_SAMPLES  # re-exported: results.py, hello.num_samples
from .bounds import check_fields
from .error_claim import says_error as says_error  # (messages.says_error, docs/protocol.md §5.2)
from .errors import ProtocolError

SCHEMA_VERSION = 2
MAX_CONTROL_BYTES = 64 * 1024  # a control message larger than this is rejected unread
MAX_STRING = 4096
MAX_REQUEST_INDICES = 64
MAX_RECORDS = 16  # named programs / array records per task or result


def new_id() -> str:
    """A random 32-hex-digit id for messages and tasks."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class BlobRef:
    """Names a blob: its sha256 (the id), its size in bytes and what it holds: ``kind`` "weights"
    (safetensors) or "program"; ``format`` "safetensors", "torchspec/1", "pte/1", ...."""

    id: str
    size: int
    kind: str
    format: str

    def __post_init__(self) -> None:
        if len(self.id) != 64 or any(c not in "0123456789abcdef" for c in self.id):
            raise ProtocolError("invalid_field", f"blob id must be 64 lowercase hex: {self.id!r}")
        if self.size < 0:
            raise ProtocolError("invalid_field", f"blob size must be >= 0, got {self.size}")


@dataclass(frozen=True)
class Message:
    """Base of all control messages; subclasses set ``TYPE``."""

    TYPE: ClassVar[str] = ""
    msg_id: str = field(default_factory=new_id, kw_only=True)
    sent_at: float = field(default_factory=time.time, kw_only=True)


@dataclass(frozen=True)
class Hello(Message):
    """Device -> server when the agent starts: who it is and what it can run."""

    TYPE: ClassVar[str] = "hello"
    device_id: str
    runtimes: list[str]
    num_samples: int  # 1 .. MAX_SAMPLES
    profile: dict

    def __post_init__(self) -> None:
        if not 0 < self.num_samples <= MAX_SAMPLES:
            raise ProtocolError("invalid_field", f"hello.num_samples must be in 1..{MAX_SAMPLES}, "
                                f"got {self.num_samples}")


@dataclass(frozen=True)
class Task(Message):
    """Server -> device: train the task's models as its ``config`` says (``protocol.task_plan``).

    ``programs``: per model, its training program in one or more formats (the device pulls the
    one its runtime runs); ``arrays``: per model, its weights (a safetensors blob), which may omit
    tensors that stay on the device (it keeps its own and returns exactly those received);
    ``config``: the steps, the models to return, the outputs to report. ``deadline``: unix s
    (server clock) after which no result is accepted; ``server_time``: the server's clock at
    publishing (null from older servers): a device has ``deadline - server_time`` s from arrival
    (``protocol.clock``). ``holdout``, ``holdout_model``, ``holdout_ensemble``, ``holdout_members``:
    the held-back split and what the device scores on it (``sdk_device.holdout``, protocol §5.4).
    """

    TYPE: ClassVar[str] = "task"
    task_id: str
    round: int
    programs: dict[str, list[BlobRef]]
    arrays: dict[str, BlobRef]
    config: dict
    deadline: float
    server_time: float | None = None
    holdout: float | None = None
    holdout_model: str | None = None
    holdout_ensemble: bool | None = None
    holdout_members: list[str] | None = None

    def __post_init__(self) -> None:
        if set(self.programs) != set(self.arrays) or not self.programs:
            raise ProtocolError("invalid_field", "task.programs and task.arrays must name the same models")
        if any(not refs for refs in self.programs.values()):
            raise ProtocolError("invalid_field", "task.programs lists a model without a program")


@dataclass(frozen=True)
class Result(Message):
    """Device -> server: array records (blobs the server pulls) and metrics.

    ``arrays``: the returned models' trained weights, plus array outputs the task asked for
    (``features``); ``metrics``: samples (int > 0), loss (or null), accuracy, wall_time_s,
    fetch_s, peak_rss_mb, runtime, and metric outputs the task asked for (``label_counts``).
    """

    TYPE: ClassVar[str] = "result"
    task_id: str
    round: int
    arrays: dict[str, BlobRef]
    metrics: dict


@dataclass(frozen=True)
class Ack(Message):
    """Server -> device: the result of task ``ref`` was accepted and persisted."""

    TYPE: ClassVar[str] = "ack"
    ref: str
    detail: str = ""


@dataclass(frozen=True)
class Error(Message):
    """Either way: something the peer sent was rejected; ``ref`` names it when known."""

    TYPE: ClassVar[str] = "error"
    code: str
    detail: str
    ref: str | None = None


@dataclass(frozen=True)
class Heartbeat(Message):
    """Device -> server: liveness and progress (0..1) of the current task."""

    TYPE: ClassVar[str] = "heartbeat"
    state: str
    task_id: str | None = None
    progress: float = 0.0


@dataclass(frozen=True)
class BlobRequest(Message):
    """Either way: please publish these chunks of blob ``blob`` (chunk size in bytes).
    At most MAX_REQUEST_INDICES indices per request."""

    TYPE: ClassVar[str] = "blob_request"
    blob: str
    indices: list[int]
    chunk_bytes: int

    def __post_init__(self) -> None:
        if not 0 < len(self.indices) <= MAX_REQUEST_INDICES:
            raise ProtocolError("invalid_field", f"blob_request needs 1..{MAX_REQUEST_INDICES} indices")


@dataclass(frozen=True)
class SecAgg(Message):
    """Either way: one stage of a secure-aggregation round (``sdk_device/secagg_client.py``).
    ``stage``: setup, keys, collect, unmask (server -> device); advertise, shares, masked,
    reveal (device -> server); ``data``: the stage's JSON record (keys and shares in base64)."""

    TYPE: ClassVar[str] = "secagg"
    round: int
    stage: str
    data: dict


@dataclass(frozen=True)
class StatusRequest(Message):
    """Device -> server after each connect (docs/protocol.md §3.2); answered by ``ServerStatus``."""

    TYPE: ClassVar[str] = "status_request"


@dataclass(frozen=True)
class ServerStatus(Message):
    """Server -> device: online, with this epoch (the ``broadcast/epoch`` fields, §3.1; seconds)."""

    TYPE: ClassVar[str] = "server_status"
    epoch: str
    started_at: float = 0.0
    announce_window_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < len(self.epoch) <= 64 or any(c not in "0123456789abcdef" for c in self.epoch):
            raise ProtocolError("invalid_field", "server_status.epoch must be 1-64 lowercase hex digits")


# -- pairing (fleet-less topics fedsdk/v1/pair/<client id>/…; see docs/protocol.md §19) ------


@dataclass(frozen=True)
class PairCaRequest(Message):
    """Pairing client -> server, over a TLS connection not yet verified: send me your CA
    certificate (the client checks it against the fingerprint the user typed)."""

    TYPE: ClassVar[str] = "pair_ca_request"


@dataclass(frozen=True)
class PairCa(Message):
    """Server -> pairing client: the PEM of the CA that signed the broker's certificate."""

    TYPE: ClassVar[str] = "pair_ca"
    ca_pem: str


@dataclass(frozen=True)
class PairRequest(Message):
    """Pairing client -> server: a one-time code, the name the user wants and the static
    profile (arch, CPU, memory, OS, runtimes; no benchmark yet)."""

    TYPE: ClassVar[str] = "pair_request"
    code: str
    name: str
    profile: dict


@dataclass(frozen=True)
class PairOffer(Message):
    """Server -> pairing client: the code is good; time a training step of each model the
    fleet trains and confirm with ``session`` before ``expires_at`` (unix seconds).

    ``models`` maps each tier name ("" when the fleet has no tiers) to ``{"programs": [blob
    ids, one per offered format, torchspec/1 among them], "weights": blob id,
    "train_memory_mb": the server's estimate}``; ``blobs`` are those blobs' references (offered
    to the client); ``recipe`` gives the batch size and optimizer of a training step."""

    TYPE: ClassVar[str] = "pair_offer"
    session: str
    fleet: str
    blobs: list[BlobRef]
    models: dict
    recipe: dict
    expires_at: float


@dataclass(frozen=True)
class PairConfirm(Message):
    """Pairing client -> server: the name again and the full profile, with the measured
    step times under ``profile["bench"]``."""

    TYPE: ClassVar[str] = "pair_confirm"
    session: str
    name: str
    profile: dict


@dataclass(frozen=True)
class PairAccept(Message):
    """Server -> pairing client: the device is registered. ``username``/``password`` are its
    own broker credentials (username = device id); ``ca_pem`` is the CA to trust for
    ``mqtts://`` (null over plain TCP); ``tier`` is null when the fleet has no tiers."""

    TYPE: ClassVar[str] = "pair_accept"
    device_id: str
    username: str
    password: str
    fleet: str
    broker_url: str
    tier: str | None = None
    tier_reason: str = ""
    ca_pem: str | None = None


@dataclass(frozen=True)
class UnpairRequest(Message):
    """Pairing client -> server: revoke device ``device_id`` (proved by its password).
    Answered by an ``ack`` (ref = this message's id) or an ``error``."""

    TYPE: ClassVar[str] = "unpair_request"
    device_id: str
    password: str


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (Hello, Task, Result, Ack, Error, Heartbeat, BlobRequest, SecAgg, StatusRequest, ServerStatus,
                PairCaRequest, PairCa, PairRequest, PairOffer, PairConfirm, PairAccept, UnpairRequest)
}


def encode(message: Message) -> bytes:
    """Serialise a message to its JSON bytes (the MQTT payload)."""
    body = {"schema": SCHEMA_VERSION, "type": message.TYPE, **asdict(message)}
    try:
        data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as exc:  # NaN/Inf somewhere, e.g. in metrics
        raise ProtocolError("invalid_field", f"{message.TYPE}: {exc}") from None
    if len(data) > MAX_CONTROL_BYTES:
        raise ProtocolError("too_large", f"{message.TYPE} message is {len(data)} bytes")
    return data


def decode(payload: bytes) -> Message:
    """Parse and validate one control message; raises ProtocolError on anything wrong."""
    if len(payload) > MAX_CONTROL_BYTES:
        raise ProtocolError(
            "too_large", f"control message of {len(payload)} bytes > {MAX_CONTROL_BYTES}"
        )
    try:
        obj = wire_json.loads(payload)  # numbers out of range are malformed here (wire_json.py)
    except ValueError as exc:
        raise ProtocolError("malformed", f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("malformed", "a control message must be a JSON object")
    schema = obj.pop("schema", None)
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise ProtocolError(
            "unsupported_schema", f"schema {schema!r} is not supported (this side speaks {SCHEMA_VERSION})"
        )
    kind = obj.pop("type", None)
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}")
    return _build(cls, obj, kind)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, obj: dict, where: str) -> Any:
    hints = _hints(cls)
    values = {}
    for f in fields(cls):
        if f.name not in obj:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ProtocolError("invalid_field", f"{where}: missing field {f.name!r}")
            continue
        values[f.name] = _check(hints[f.name], obj[f.name], f"{where}.{f.name}")
    check_fields({k: v for k, v in values.items() if not is_dataclass(v)}, where)  # bounds.py
    try:
        return cls(**values)
    except TypeError as exc:
        raise ProtocolError("invalid_field", f"{where}: {exc}") from None


# What a scalar field's value must be, by its hint (one table: one per field was 5 % of an edge's time)
_SCALAR_OK = {str: lambda v: isinstance(v, str) and len(v) <= MAX_STRING,
              int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
              bool: lambda v: isinstance(v, bool), dict: lambda v: isinstance(v, dict)}


def _check(hint: Any, value: Any, where: str) -> Any:
    """Check ``value`` against a field's type hint; return it (BlobRefs are built)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        hint = next(h for h in options if h is not type(None))
        origin = typing.get_origin(hint)
    if is_dataclass(hint):  # a nested object: BlobRef
        if not isinstance(value, dict):
            raise ProtocolError("invalid_field", f"{where}: expected a {hint.__name__} object")
        return _build(hint, value, where)
    if origin is dict and typing.get_args(hint):  # {name: value}: names are short strings
        if not isinstance(value, dict) or len(value) > MAX_RECORDS:
            raise ProtocolError("invalid_field", f"{where}: expected an object of <= {MAX_RECORDS} entries")
        _, item = typing.get_args(hint)
        out = {}
        for key, entry in value.items():
            if not isinstance(key, str) or not 0 < len(key) <= 64:
                raise ProtocolError("invalid_field", f"{where}: keys must be strings of 1..64 characters")
            out[key] = _check(item, entry, f"{where}.{key}")
        return out
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError("invalid_field", f"{where}: expected a list")
        (item,) = typing.get_args(hint)
        return [_check(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not _SCALAR_OK[hint](value):
        raise ProtocolError("invalid_field", f"{where}: expected {hint.__name__}, got {value!r:.80}")
    return float(value) if hint is float else value

