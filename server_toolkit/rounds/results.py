"""What a result must look like: the pending task it answers, and the checks before and
after its blobs are pulled (used by ``MqttGrid``).

A result that fails a check is rejected. A rejection of the result message alone does not end
its task (garbage or a forged result on a device's topics cannot cost the device its round); a
rejection of the device's own data does (``check_pulled`` raises ``OwnDataError``): a record
pulled from the device that hashes to the id the device named, yet is no valid update or is a
replay of the device's earlier update. Then the device is resolved for the round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcore import modelspec
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import check_update, decode_tensors
from sdk_device.protocol.errors import OwnDataError, ProtocolError
from sdk_device.protocol.smashed import SmashedRequest, check_smashed

from ..methods.base import MODEL, TrainInstruction
from ..methods.records import FEATURES
from .bundle_results import check_result as check_bundle
from .bundle_results import is_bundle


def features_request(instruction: TrainInstruction) -> SmashedRequest | None:
    """What a ``features`` output asked by ``instruction`` must look like, or None."""
    params = instruction.reports.get(FEATURES)
    if params is None:
        return None
    spec = instruction.all_models()[params.get("model", MODEL)].spec
    return SmashedRequest(int(params["samples"]), modelspec.feature_size(spec), int(spec["num_classes"]))


@dataclass
class PendingTask:
    """A task of the open round: what it asked, and what its result must look like.
    ``answered``: a result of it was accepted (the first one wins); ``refused``: a result of it
    was rejected for the device's own data (it is not sent again, the device is resolved)."""

    task_id: str
    round: int
    instruction: TrainInstruction
    sent_bytes: dict[str, int]  # returned model -> bytes of the weights sent
    references: dict[str, dict]  # returned model -> {tensor name: (shape, dtype)} it must have
    features: SmashedRequest | None  # the features output asked for, if any
    answered: bool = False
    refused: bool = False
    task: msgs.Task | None = None  # the message sent (sent again: mqtt_presence.py)
    # the accepted result's array records as checked (record name -> tensors), until the round
    # takes them: decoding them again from the blob store cost the edge a tenth of its CPU per update
    decoded: dict[str, dict[str, np.ndarray]] | None = None


def check_records(result: msgs.Result, pending: PendingTask, max_update_factor: float) -> None:
    """Which array records a result may carry, and how large they may be (before pulling);
    and its sample count. Raises ProtocolError."""
    names = set(result.arrays)
    absent = set(pending.instruction.context["members"]) if is_bundle(pending.instruction) else set()
    missing = sorted(set(pending.references) - names - absent)  # a bundle's silent members: absent
    if missing:
        raise ProtocolError("missing_record", f"the result lacks the array records {missing}")
    allowed = set(pending.references) | ({FEATURES} if pending.features else set())
    if names - allowed:
        extra = sorted(names - allowed)
        raise ProtocolError("unexpected_record", f"the task asked for no array records {extra}")
    for name, ref in result.arrays.items():
        limit = (pending.features.max_bytes() if name == FEATURES else
                 int(pending.sent_bytes[name] * max_update_factor) + 65536)
        if ref.size > limit:
            raise ProtocolError("too_large", f"{name} of {ref.size} bytes; at most {limit} expected")
    samples = result.metrics.get("samples")
    if type(samples) is not int or not 0 < samples <= msgs.MAX_SAMPLES:
        raise ProtocolError("invalid_field", f"metrics.samples must be in 1..{msgs.MAX_SAMPLES}")
    if absent:
        check_bundle(pending.instruction, names, result.metrics)


def check_record(name: str, tensors: dict[str, np.ndarray], pending: PendingTask) -> None:
    """One pulled array record: shapes, dtypes, finite values (raises ProtocolError)."""
    if name == FEATURES:
        check_smashed(tensors, pending.features)
    else:
        check_update(tensors, pending.references[name])


def check_pulled(name: str, data: bytes, pending: PendingTask,
                 replay_of: str | None) -> dict[str, np.ndarray]:
    """One array record pulled from the device (verified against its id): decodable, then
    ``check_record``; ``replay_of``: the earlier task whose accepted update had these very bytes
    (None: none). Returns its tensors. Raises OwnDataError: the device's own data is bad."""
    if replay_of is not None:
        raise OwnDataError("replay", f"{name} is byte-identical to this device's update for task "
                                     f"{replay_of[:8]}")
    try:
        tensors = decode_tensors(data)
        check_record(name, tensors, pending)
    except ProtocolError as err:
        raise OwnDataError(err.code, err.detail) from None
    return tensors


def is_blob_id(ref: str | None) -> bool:
    """Whether an error's ``ref`` names a blob (64 hex digits; task ids have 32)."""
    return ref is not None and len(ref) == 64 and all(c in "0123456789abcdef" for c in ref)


def result_key(result: msgs.Result) -> tuple:
    """A result's identity: its task and the blobs it names (a QoS 1 duplicate has the same)."""
    return result.task_id, tuple(sorted((name, ref.id) for name, ref in result.arrays.items()))
