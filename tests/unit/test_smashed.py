"""Smashed-data blobs and the optional task/result fields that carry them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sdk_device.protocol import messages as m
from sdk_device.protocol.blobs import decode_tensors, encode_tensors
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.smashed import SmashedRequest, check_smashed, encode_smashed

REQUEST = SmashedRequest(samples=8, features=4, classes=3)
REF = m.BlobRef(id="a" * 64, size=10, kind="weights", format="safetensors")


def test_round_trip():
    x = np.arange(20, dtype=np.float64).reshape(5, 4)
    blob = encode_smashed(x, np.array([0, 1, 2, 1, 0]))
    assert len(blob) <= REQUEST.max_bytes()
    got_x, got_y = check_smashed(decode_tensors(blob), REQUEST)
    assert got_x.dtype == np.float32 and got_y.dtype == np.int64
    assert np.array_equal(got_x, x.astype(np.float32)) and got_y.tolist() == [0, 1, 2, 1, 0]


@pytest.mark.parametrize("tensors, code", [
    ({"x": np.zeros((2, 4), np.float32)}, "missing_tensor"),
    ({"x": np.zeros((2, 4), np.float32), "y": np.zeros(2, np.int64), "z": np.zeros(1)}, "unexpected_tensor"),
    ({"x": np.zeros((2, 5), np.float32), "y": np.zeros(2, np.int64)}, "shape_mismatch"),
    ({"x": np.zeros((2, 4), np.float64), "y": np.zeros(2, np.int64)}, "shape_mismatch"),
    ({"x": np.zeros((2, 4), np.float32), "y": np.zeros(3, np.int64)}, "shape_mismatch"),
    ({"x": np.zeros((2, 4), np.float32), "y": np.zeros(2, np.int32)}, "shape_mismatch"),
    ({"x": np.zeros((9, 4), np.float32), "y": np.zeros(9, np.int64)}, "shape_mismatch"),  # > 8 asked
    ({"x": np.zeros((0, 4), np.float32), "y": np.zeros(0, np.int64)}, "shape_mismatch"),
    ({"x": np.full((2, 4), np.nan, np.float32), "y": np.zeros(2, np.int64)}, "non_finite"),
    ({"x": np.zeros((2, 4), np.float32), "y": np.array([0, 3], np.int64)}, "invalid_field"),
    ({"x": np.zeros((2, 4), np.float32), "y": np.array([-1, 0], np.int64)}, "invalid_field"),
])
def test_bad_smashed_data_is_rejected(tensors, code):
    with pytest.raises(ProtocolError) as err:
        check_smashed(decode_tensors(encode_tensors(tensors)), REQUEST)
    assert err.value.code == code


def test_request_needs_positive_sizes():
    with pytest.raises(ValueError):
        SmashedRequest(samples=0, features=4, classes=3)


def test_task_and_result_fields_are_optional_and_checked():
    task = m.Task(task_id="t", round=1, programs=[REF], weights=REF, recipe={}, deadline=1.0, smashed=64)
    assert m.decode(m.encode(task)).smashed == 64
    result = m.Result(task_id="t", round=1, weights=REF, metrics={"samples": 1}, smashed=REF)
    assert m.decode(m.encode(result)).smashed == REF
    old_task = json.loads(m.encode(task))  # a v1 sender that knows nothing of smashed data
    del old_task["smashed"]
    assert m.decode(json.dumps(old_task).encode()).smashed == 0
    old_result = json.loads(m.encode(result))
    del old_result["smashed"]
    assert m.decode(json.dumps(old_result).encode()).smashed is None
    for bad in (-1, 1.5, "64", True):
        with pytest.raises(ProtocolError) as err:
            m.decode(json.dumps({**old_task, "smashed": bad}).encode())
        assert err.value.code == "invalid_field"
    with pytest.raises(ProtocolError):
        m.decode(json.dumps({**old_result, "smashed": {"id": "nothex"}}).encode())
