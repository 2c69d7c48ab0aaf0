"""Loading datasets by name: digits, MNIST-style datasets from npz or IDX files, generic npz."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from server_toolkit.data.catalogue import FASHION_MNIST, MNIST, KnownDataset
from server_toolkit.data.datasets import Dataset, load_dataset
from server_toolkit.data.errors import DatasetError
from server_toolkit.data.idx import read_idx, read_idx_dims


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
    for known in ("digits", "mnist", "fashion_mnist", "npz:"):
        assert known in str(err.value)


# --------------------------------------------------------------------------- IDX files


def _idx_bytes(array: np.ndarray) -> bytes:
    assert array.dtype == np.uint8
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def _small_arrays(seed: int, first_label: int = 0) -> dict[str, np.ndarray]:
    """Six train and three test 28x28 uint8 images with labels (first_label + i) % 10."""
    rng = np.random.default_rng(seed)
    arrays = {
        "x_train": rng.integers(0, 256, size=(6, 28, 28), dtype=np.uint8),
        "y_train": ((first_label + np.arange(6)) % 10).astype(np.uint8),
        "x_test": rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8),
        "y_test": ((first_label + np.arange(6, 9)) % 10).astype(np.uint8),
    }
    arrays["x_train"][0, 0, 0] = 255
    return arrays


def _write_idx(directory: Path, arrays: dict[str, np.ndarray], gz: bool,
               dataset: KnownDataset = MNIST) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in dataset.files:
        raw = _idx_bytes(arrays[f.key])
        if gz:
            (directory / f.gz_name).write_bytes(gzip.compress(raw))
        else:
            (directory / f.name).write_bytes(raw)


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_read_idx_parses_header_and_data(tmp_path: Path) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "small-idx3-ubyte"
    path.write_bytes(_idx_bytes(array))
    np.testing.assert_array_equal(read_idx(path), array)
    assert read_idx_dims(path) == (2, 3, 4)


def test_read_idx_detects_gzip_by_content_not_by_name(tmp_path: Path) -> None:
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    gzipped_without_suffix = tmp_path / "labels"
    gzipped_without_suffix.write_bytes(gzip.compress(_idx_bytes(array)))
    plain_with_suffix = tmp_path / "labels.gz"
    plain_with_suffix.write_bytes(_idx_bytes(array))
    np.testing.assert_array_equal(read_idx(gzipped_without_suffix), array)
    np.testing.assert_array_equal(read_idx(plain_with_suffix), array)
    assert read_idx_dims(gzipped_without_suffix) == (3, 4)


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


# --------------------------------------------------------------------------- MNIST and Fashion-MNIST


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_loads_from_a_data_dir_of_idx_files(tmp_path: Path, gz: bool) -> None:
    arrays = _small_arrays(3)
    _write_idx(tmp_path, arrays, gz)
    data = load_dataset("mnist", data_dir=tmp_path)
    assert data.name == "mnist" and data.num_classes == 10
    assert data.x_train.shape == (6, 1, 28, 28) and data.x_test.shape == (3, 1, 28, 28)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert data.x_train.max() == 1.0 and data.x_train.min() >= 0.0
    np.testing.assert_allclose(data.x_test[:, 0], arrays["x_test"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_train, [0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(data.y_test, [6, 7, 8])


def test_mnist_loads_from_a_keras_layout_npz(tmp_path: Path) -> None:
    arrays = _small_arrays(4)
    _write_npz(tmp_path / "mnist.npz", arrays)
    data = load_dataset("mnist", data_dir=tmp_path)
    assert data.input_shape == (1, 28, 28)
    np.testing.assert_allclose(data.x_train[:, 0], arrays["x_train"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_test, [6, 7, 8])
    assert data.y_test.dtype == np.int64


@pytest.fixture(scope="module")
def debian_fashion(fashion_mnist_dir: Path) -> Dataset:
    return load_dataset("fashion_mnist")


def test_fashion_mnist_loads_from_the_debian_package_directory_without_a_data_dir(
        debian_fashion: Dataset, fashion_mnist_dir: Path) -> None:
    data = debian_fashion
    assert data.name == "fashion_mnist" and data.num_classes == 10 and data.input_shape == (1, 28, 28)
    assert data.x_train.shape == (60000, 1, 28, 28) and data.x_test.shape == (10000, 1, 28, 28)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert data.x_train.min() == 0.0 and data.x_train.max() == 1.0
    np.testing.assert_array_equal(np.bincount(data.y_train), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(data.y_test), [1000] * 10)
    labels = read_idx(fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz")
    np.testing.assert_array_equal(data.y_test, labels)
    first = read_idx(fashion_mnist_dir / "t10k-images-idx3-ubyte.gz")[0]
    np.testing.assert_array_equal(np.rint(data.x_test[0, 0] * 255).astype(np.uint8), first)


def test_fashion_mnist_loads_the_same_from_an_npz_as_from_the_idx_files(
        debian_fashion: Dataset, fashion_mnist_dir: Path, tmp_path: Path) -> None:
    # the real test split, stored as both splits of an npz (keeps the file small)
    x = read_idx(fashion_mnist_dir / "t10k-images-idx3-ubyte.gz")
    y = read_idx(fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    _write_npz(tmp_path / "fashion_mnist.npz", {"x_train": x, "y_train": y, "x_test": x, "y_test": y})
    from_npz = load_dataset("fashion_mnist", data_dir=tmp_path)
    np.testing.assert_array_equal(from_npz.x_test, debian_fashion.x_test)
    np.testing.assert_array_equal(from_npz.y_train, debian_fashion.y_test)


def test_fashion_mnist_loads_from_a_data_dir_of_small_idx_files(tmp_path: Path) -> None:
    arrays = _small_arrays(5, first_label=4)
    _write_idx(tmp_path, arrays, gz=True, dataset=FASHION_MNIST)
    data = load_dataset("fashion-mnist", data_dir=tmp_path)  # the hyphenated name works too
    assert data.name == "fashion_mnist"
    np.testing.assert_array_equal(data.y_train, [4, 5, 6, 7, 8, 9])
    np.testing.assert_allclose(data.x_train[:, 0], arrays["x_train"] / 255.0, rtol=1e-6)


def test_a_data_dir_holding_both_datasets_gives_each_its_own_npz(tmp_path: Path) -> None:
    _write_npz(tmp_path / "mnist.npz", _small_arrays(1, first_label=0))
    _write_npz(tmp_path / "fashion_mnist.npz", _small_arrays(2, first_label=3))
    assert load_dataset("mnist", tmp_path).y_train[0] == 0
    assert load_dataset("fashion_mnist", tmp_path).y_train[0] == 3


def test_idx_files_in_subdirectories_named_after_each_dataset_are_found(tmp_path: Path) -> None:
    _write_idx(tmp_path / "mnist", _small_arrays(1, first_label=1), gz=True)
    _write_idx(tmp_path / "fashion-mnist", _small_arrays(2, first_label=7), gz=False)
    assert load_dataset("mnist", tmp_path).y_train[0] == 1
    assert load_dataset("fashion_mnist", tmp_path).y_train[0] == 7


def test_a_missing_dataset_is_one_line_saying_where_it_looked_and_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        load_dataset("fashion_mnist", data_dir=tmp_path)
    text = str(err.value)
    assert "\n" not in text
    assert str(tmp_path) in text and "fashion_mnist.npz" in text
    for f in FASHION_MNIST.files:
        assert f.name in text
    assert f"fedsdk-server datasets fetch fashion_mnist --to {tmp_path}" in text
    assert "apt-get install dataset-fashion-mnist" in text


def test_mnist_without_a_data_dir_says_to_pass_one_and_how_to_fetch() -> None:
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist")
    text = str(err.value)
    assert "no data dir given" in text and "--data-dir" in text
    assert "fedsdk-server datasets fetch mnist --to DIR" in text and "\n" not in text


def test_a_partial_set_of_idx_files_names_the_missing_one(tmp_path: Path) -> None:
    _write_idx(tmp_path, _small_arrays(3), gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetError, match=r"lacks t10k-labels-idx1-ubyte"):
        load_dataset("mnist", data_dir=tmp_path)


def test_a_corrupt_gz_file_is_an_error_naming_that_file(tmp_path: Path) -> None:
    _write_idx(tmp_path, _small_arrays(3), gz=True)
    broken = tmp_path / "train-images-idx3-ubyte.gz"
    broken.write_bytes(broken.read_bytes()[:200])  # truncated gzip stream
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte\.gz: cannot read"):
        load_dataset("mnist", data_dir=tmp_path)


def test_a_file_that_is_not_idx_is_an_error_naming_that_file(tmp_path: Path) -> None:
    _write_idx(tmp_path, _small_arrays(3), gz=False)
    (tmp_path / "t10k-images-idx3-ubyte").write_text("<html>not found</html>")
    with pytest.raises(DatasetError, match=r"t10k-images-idx3-ubyte: not an IDX file"):
        load_dataset("mnist", data_dir=tmp_path)


def test_images_of_the_wrong_shape_are_refused_naming_the_file(tmp_path: Path) -> None:
    arrays = _small_arrays(3)
    arrays["x_test"] = np.zeros((3, 32, 32), np.uint8)
    _write_npz(tmp_path / "fashion_mnist.npz", arrays)
    with pytest.raises(DatasetError, match=r"fashion_mnist\.npz: x_test must be \(N, 28, 28\) images"):
        load_dataset("fashion_mnist", data_dir=tmp_path)


def test_labels_out_of_range_or_miscounted_are_refused_naming_the_file(tmp_path: Path) -> None:
    arrays = _small_arrays(3)
    arrays["y_train"] = np.array([0, 1, 2, 3, 4, 10], np.uint8)
    _write_idx(tmp_path, arrays, gz=False)
    with pytest.raises(DatasetError, match=r"train-labels-idx1-ubyte: y_train: labels must be < 10"):
        load_dataset("mnist", data_dir=tmp_path)
    arrays["y_train"] = np.array([0, 1, 2], np.uint8)
    _write_npz(tmp_path / "mnist.npz", arrays)
    with pytest.raises(DatasetError, match=r"mnist\.npz: y_train has 3 labels for 6 images"):
        load_dataset("mnist", data_dir=tmp_path)


def test_an_npz_holding_pickled_objects_is_refused_without_unpickling(tmp_path: Path) -> None:
    arrays: dict[str, np.ndarray] = dict(_small_arrays(3))
    arrays["y_train"] = np.array([{"not": "data"}] * 6, dtype=object)
    _write_npz(tmp_path / "mnist.npz", arrays)
    with pytest.raises(DatasetError, match="without pickles"):
        load_dataset("mnist", data_dir=tmp_path)


def test_a_corrupt_npz_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "mnist.npz").write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(DatasetError, match=r"mnist\.npz is not an npz file"):
        load_dataset("mnist", data_dir=tmp_path)


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
