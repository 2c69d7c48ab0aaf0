"""The device's local data file (sdk_device.data.npz)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdk_device.data.npz import DataError, load_npz, save_npz


def test_round_trip(tmp_path: Path) -> None:
    x = np.random.default_rng(1).random((7, 1, 8, 8))
    y = np.arange(7, dtype=np.int32)
    save_npz(tmp_path / "dev" / "data.npz", x, y)
    x2, y2 = load_npz(tmp_path / "dev" / "data.npz")
    assert x2.dtype == np.float32 and y2.dtype == np.int64
    np.testing.assert_allclose(x2, x.astype(np.float32))
    np.testing.assert_array_equal(y2, y)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((3, 2), np.float32), "y": np.zeros(2, np.int64)}, "shape"),
        ({"x": np.zeros((3, 2), np.float32), "y": np.zeros(3, np.float32)}, "integer"),
        ({"x": np.zeros((3, 2), np.float32), "y": np.zeros((3, 1), np.int64)}, "shape"),
        ({"x": np.zeros((3, 2), np.float32)}, "must hold arrays"),
        ({"x": np.array([{"a": 1}] * 3, dtype=object), "y": np.zeros(3, np.int64)}, "cannot read"),
    ],
)
def test_malformed_files_are_refused_with_a_reason(tmp_path: Path, arrays: dict, message: str) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=message):
        load_npz(path)


def test_missing_and_garbage_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no data file"):
        load_npz(tmp_path / "nope.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a zip archive")
    with pytest.raises(DataError, match="cannot read"):
        load_npz(garbage)
