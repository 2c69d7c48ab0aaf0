"""A swarm device's answer: the sent weights plus a small seeded delta, in the protocol's shapes."""

from __future__ import annotations

import numpy as np

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import decode_tensors, encode_chunk, encode_tensors, sha256_hex
from sdk_device.protocol.topics import FleetTopics
from server_toolkit.swarm.counters import Counters
from server_toolkit.swarm.device import SwarmDevice, perturbed

SENT = {"conv.weight": np.ones((4, 1, 3, 3), np.float32), "bn.count": np.array(7, np.int64)}


def test_a_perturbed_update_keeps_names_shapes_and_dtypes_and_moves_only_a_little():
    update = perturbed(SENT, seed=3)
    layout = {k: (v.shape, v.dtype) for k, v in SENT.items()}
    assert {k: (v.shape, v.dtype) for k, v in update.items()} == layout
    assert update["bn.count"] == 7
    delta = update["conv.weight"] - SENT["conv.weight"]
    assert 0 < np.abs(delta).max() < 0.1
    assert np.array_equal(perturbed(SENT, seed=3)["conv.weight"], update["conv.weight"])
    assert not np.array_equal(perturbed(SENT, seed=4)["conv.weight"], update["conv.weight"])


def test_a_swarm_device_pulls_the_weights_answers_and_serves_its_update():
    topics, sent = FleetTopics("f"), []
    device = SwarmDevice("d1", topics, Counters(), heartbeat_s=0)
    device.publish = lambda topic, payload, qos=1: sent.append((topic, payload))
    blob = encode_tensors(SENT)
    ref = msgs.BlobRef(id=sha256_hex(blob), size=len(blob), kind="weights", format="safetensors")
    config = {"steps": [{"train": "model", "recipe": {"epochs": 1, "batch_size": 8, "lr": 0.1, "seed": 5}}]}
    task = msgs.Task(task_id="t" * 32, round=1, programs={"model": [ref]}, arrays={"model": ref},
                     config=config, deadline=1e12)
    device.on_message(topics.down("d1"), msgs.encode(task))
    request = msgs.decode(sent[-1][1])
    assert isinstance(request, msgs.BlobRequest) and request.blob == ref.id
    device.on_message(topics.down_chunk("d1"), encode_chunk(ref.id, 0, len(blob), request.chunk_bytes, blob))
    result = msgs.decode(sent[-1][1])
    assert isinstance(result, msgs.Result) and result.metrics["samples"] == device.num_samples
    answer = result.arrays["model"]
    device.on_message(topics.down("d1"), msgs.encode(msgs.BlobRequest(blob=answer.id, indices=[0],
                                                                      chunk_bytes=1 << 20)))
    topic, frame = sent[-1]
    assert topic == topics.up_chunk("d1")
    assert sha256_hex(frame[-answer.size:]) == answer.id
    assert decode_tensors(frame[-answer.size:]).keys() == SENT.keys()
