"""Smashed-data blobs (the ``features`` output a task may ask for) and their checks."""

from __future__ import annotations

import numpy as np
import pytest

from sdk_device.protocol.blobs import decode_tensors, encode_tensors
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.smashed import SmashedRequest, check_smashed, encode_smashed

REQUEST = SmashedRequest(samples=8, features=4, classes=3)


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


def test_features_are_asked_through_the_task_report_and_checked_by_the_output_registry():
    from sdk_device.outputs import OUTPUTS, check_reports

    wanted = {"features": {"model": "model", "samples": 64}}
    assert check_reports({"features": {"samples": 64}}, {"model"}) == wanted
    for bad in ({"samples": 0}, {"samples": 1.5}, {"samples": 64, "model": "teacher"},
                {"samples": 64, "x": 1}):
        with pytest.raises(ProtocolError) as err:
            check_reports({"features": bad}, {"model"})
        assert err.value.code == "invalid_field"
    with pytest.raises(ProtocolError) as err:
        check_reports({"gradients": {}}, {"model"})
    assert err.value.code == "unsupported_task"
    assert OUTPUTS["features"].kind == "arrays" and OUTPUTS["label_counts"].kind == "metric"


def test_the_server_expects_the_feature_width_the_device_computes():
    """§12.4 / §20.1: F is the last layer's ``in`` when it is linear, else the class count
    (the features are then the final logits), on the device and in the server's check."""
    from fedcore import modelspec
    from fedcore.torch_model import build_model
    from fedcore.torch_train import predict_model

    head = [{"op": "conv2d", "in": 1, "out": 3, "k": 3}, {"op": "relu"}, {"op": "flatten"}]
    specs = [modelspec.make((1, 5, 5), 4, [*head, {"op": "linear", "in": 27, "out": 4}]),
             modelspec.make((1, 5, 5), 4, [*head, {"op": "linear", "in": 27, "out": 4}, {"op": "dropout"}]),
             modelspec.make((1, 5, 5), 4, [{"op": "conv2d", "in": 1, "out": 4, "k": 3}, {"op": "gap"},
                                           {"op": "flatten"}])]
    widths = []
    for spec in specs:
        _, features = predict_model(build_model(spec, seed=0), np.zeros((2, 1, 5, 5), np.float32))
        assert features.shape[1] == modelspec.feature_size(spec)
        widths.append(features.shape[1])
    assert widths == [27, 4, 4]
