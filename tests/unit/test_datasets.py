"""Unit tests of server_toolkit.sim.datasets (offline, fast, no torch)."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from server_toolkit.sim.datasets import (
    MNIST_IDX_FILES,
    Dataset,
    DatasetError,
    load_dataset,
    read_idx,
)


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits", seed=0)


# --------------------------------------------------------------------------- digits


def test_digits_shapes_dtypes_and_range(digits: Dataset) -> None:
    assert digits.name == "digits"
    assert digits.num_classes == 10
    assert digits.input_shape == (1, 8, 8)
    assert digits.x_train.dtype == np.float32 and digits.x_test.dtype == np.float32
    assert digits.y_train.dtype == np.int64 and digits.y_test.dtype == np.int64
    assert digits.x_train.shape[1:] == (1, 8, 8) and digits.x_test.shape[1:] == (1, 8, 8)
    assert len(digits.x_train) == len(digits.y_train)
    assert len(digits.x_test) == len(digits.y_test)
    assert len(digits.y_train) + len(digits.y_test) == 1797
    assert len(digits.y_test) == pytest.approx(0.2 * 1797, abs=10)
    for x in (digits.x_train, digits.x_test):
        assert x.min() == 0.0 and x.max() == 1.0


def test_digits_split_is_stratified(digits: Dataset) -> None:
    train_counts = np.bincount(digits.y_train, minlength=10)
    test_counts = np.bincount(digits.y_test, minlength=10)
    fractions = test_counts / (train_counts + test_counts)
    assert np.all(np.abs(fractions - 0.2) < 0.01)


def _rows(x: np.ndarray, y: np.ndarray) -> list[bytes]:
    flat = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    return sorted(row.tobytes() + bytes([int(label)]) for row, label in zip(flat, y, strict=True))


def test_digits_split_partitions_the_source_exactly(digits: Dataset) -> None:
    source = load_digits()
    expected = _rows(source.images / 16.0, source.target)
    got = _rows(np.concatenate([digits.x_train, digits.x_test]),
                np.concatenate([digits.y_train, digits.y_test]))
    assert got == expected  # every sample lands in exactly one of train/test


def test_digits_split_reproducible_and_seed_dependent(digits: Dataset) -> None:
    again = load_dataset("digits", seed=0)
    np.testing.assert_array_equal(again.x_train, digits.x_train)
    np.testing.assert_array_equal(again.y_test, digits.y_test)
    other = load_dataset("digits", seed=1)
    assert not np.array_equal(other.y_train, digits.y_train)
    assert sorted(other.y_test.tolist()) == sorted(digits.y_test.tolist())  # same class counts


def test_test_fraction_respected_and_validated() -> None:
    data = load_dataset("digits", test_fraction=0.5)
    assert abs(len(data.y_test) - len(data.y_train)) < 15
    with pytest.raises(DatasetError, match="test_fraction"):
        load_dataset("digits", test_fraction=1.0)


def test_unknown_dataset_lists_known_names() -> None:
    with pytest.raises(DatasetError) as err:
        load_dataset("cifar10")
    assert isinstance(err.value, ValueError)
    for known in ("digits", "mnist", "npz:"):
        assert known in str(err.value)


# --------------------------------------------------------------------------- IDX / MNIST


def _idx_bytes(array: np.ndarray) -> bytes:
    assert array.dtype == np.uint8
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def _write_mnist_idx(directory: Path, gz: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    arrays = {
        "x_train": rng.integers(0, 256, size=(6, 28, 28), dtype=np.uint8),
        "y_train": np.array([0, 1, 2, 3, 4, 9], dtype=np.uint8),
        "x_test": rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8),
        "y_test": np.array([5, 6, 7], dtype=np.uint8),
    }
    arrays["x_train"][0, 0, 0] = 255
    for key, base in MNIST_IDX_FILES.items():
        raw = _idx_bytes(arrays[key])
        if gz:
            (directory / f"{base}.gz").write_bytes(gzip.compress(raw))
        else:
            (directory / base).write_bytes(raw)
    return arrays


def test_read_idx_parses_header_and_data(tmp_path: Path) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "small-idx3-ubyte"
    path.write_bytes(_idx_bytes(array))
    np.testing.assert_array_equal(read_idx(path), array)


def test_read_idx_rejects_bad_magic_and_truncation(tmp_path: Path) -> None:
    raw = _idx_bytes(np.zeros((2, 3), dtype=np.uint8))
    bad_magic = tmp_path / "bad"
    bad_magic.write_bytes(b"\x01" + raw[1:])
    with pytest.raises(DatasetError, match="magic"):
        read_idx(bad_magic)
    truncated = tmp_path / "short"
    truncated.write_bytes(raw[:-1])
    with pytest.raises(DatasetError, match="data bytes"):
        read_idx(truncated)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_from_idx_files(tmp_path: Path, gz: bool) -> None:
    arrays = _write_mnist_idx(tmp_path, gz)
    data = load_dataset("mnist", data_dir=tmp_path)
    assert data.name == "mnist" and data.num_classes == 10
    assert data.x_train.shape == (6, 1, 28, 28) and data.x_test.shape == (3, 1, 28, 28)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert data.x_train.max() == 1.0 and data.x_train.min() >= 0.0
    np.testing.assert_allclose(data.x_test[:, 0], arrays["x_test"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_train, [0, 1, 2, 3, 4, 9])
    np.testing.assert_array_equal(data.y_test, [5, 6, 7])


def test_mnist_from_keras_npz(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    x_train = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    x_test = rng.integers(0, 256, size=(2, 28, 28), dtype=np.uint8)
    np.savez(tmp_path / "mnist.npz", x_train=x_train, y_train=np.arange(5, dtype=np.uint8),
             x_test=x_test, y_test=np.array([8, 9], dtype=np.uint8))
    data = load_dataset("mnist", data_dir=tmp_path)
    assert data.input_shape == (1, 28, 28)
    np.testing.assert_allclose(data.x_train[:, 0], x_train / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_test, [8, 9])
    assert data.y_test.dtype == np.int64


def test_mnist_missing_files_names_them_and_the_directory(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist", data_dir=tmp_path)
    text = str(err.value)
    assert str(tmp_path) in text
    assert "mnist.npz" in text
    for base in MNIST_IDX_FILES.values():
        assert base in text


def test_mnist_partial_idx_lists_missing_file(tmp_path: Path) -> None:
    _write_mnist_idx(tmp_path, gz=False)
    (tmp_path / MNIST_IDX_FILES["y_test"]).unlink()
    with pytest.raises(DatasetError, match=r"missing: t10k-labels-idx1-ubyte"):
        load_dataset("mnist", data_dir=tmp_path)


def test_mnist_without_data_dir() -> None:
    with pytest.raises(DatasetError, match="no data_dir"):
        load_dataset("mnist")


# --------------------------------------------------------------------------- generic npz


@pytest.mark.parametrize(
    ("shape", "expected"),
    [((40, 5, 6), (1, 5, 6)), ((40, 3, 5, 6), (3, 5, 6)), ((40, 7), (1, 1, 7))],
)
def test_generic_npz_is_normalised_to_nchw(tmp_path: Path, shape: tuple, expected: tuple) -> None:
    path = tmp_path / "data.npz"
    x = np.random.default_rng(0).random(shape)
    np.savez(path, x=x, y=np.repeat(np.arange(4), 10))
    data = load_dataset(f"npz:{path}", seed=2, test_fraction=0.3)
    assert data.input_shape == expected
    assert data.x_train.shape == (28, *expected) and data.x_test.shape == (12, *expected)
    np.testing.assert_array_equal(np.bincount(data.y_test, minlength=4), [3, 3, 3, 3])
    assert data.num_classes == 4 and data.x_train.dtype == np.float32


def test_generic_npz_split_reproducible(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, x=np.arange(100, dtype=np.float32).reshape(50, 2), y=np.arange(50) % 5)
    a = load_dataset(f"npz:{path}", seed=7)
    b = load_dataset(f"npz:{path}", seed=7)
    c = load_dataset(f"npz:{path}", seed=8)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, c.x_train)


def test_generic_npz_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(f"npz:{tmp_path / 'nope.npz'}")
    path = tmp_path / "float_labels.npz"
    np.savez(path, x=np.zeros((4, 2)), y=np.zeros(4))
    with pytest.raises(DatasetError, match="integer"):
        load_dataset(f"npz:{path}")
    path = tmp_path / "no_y.npz"
    np.savez(path, x=np.zeros((4, 2)))
    with pytest.raises(DatasetError, match="missing array"):
        load_dataset(f"npz:{path}")
