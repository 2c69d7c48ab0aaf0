"""`fedsdk-server datasets list` and `datasets verify` (click's CliRunner), and the digests
behind verify."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from server_toolkit.cli import main
from server_toolkit.data.catalogue import FASHION_MNIST
from server_toolkit.data.idx import read_idx
from server_toolkit.data.verify import BY_CONTENT, BY_MD5, array_sha256, check_idx_file

from .dataset_helpers import idx_bytes, mirror_with_one_tampered_file, tiny_dataset


def _run(*args: str):
    return CliRunner().invoke(main, ["datasets", *args])


def _line(output: str, start: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(start))


def test_list_shows_where_each_dataset_was_found_its_format_and_sample_counts(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = {"x_train": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8), "y_train": np.arange(6),
              "x_test": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8), "y_test": np.arange(3)}
    np.savez(tmp_path / "mnist.npz", **images)
    tiny_dataset(tmp_path / "fashion-mnist")  # four IDX .gz files, 6 train and 3 test images
    result = _run("list", "--data-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert _line(result.output, "digits").split()[1:3] == ["bundled", "1797"]
    mnist = _line(result.output, "mnist ")
    assert mnist.split()[1] == "npz" and "6 train, 3 test" in mnist
    assert mnist.endswith(str(tmp_path / "mnist.npz"))
    fashion = _line(result.output, "fashion_mnist")
    assert fashion.split()[1] == "idx" and "6 train, 3 test" in fashion
    assert fashion.endswith(str(tmp_path / "fashion-mnist"))


def test_list_without_a_data_dir_finds_debians_fashion_mnist_and_says_how_to_get_mnist(
        fashion_mnist_dir: Path) -> None:
    result = _run("list")
    assert result.exit_code == 0, result.output
    fashion = _line(result.output, "fashion_mnist")
    assert fashion.split()[1] == "idx" and "60000 train, 10000 test" in fashion
    assert fashion.endswith(str(fashion_mnist_dir))
    mnist = _line(result.output, "mnist ")
    assert "not found (no --data-dir given)" in mnist
    assert "fedsdk-server datasets fetch mnist --to DIR" in mnist


def test_list_says_how_to_get_what_a_data_dir_lacks(tmp_path: Path) -> None:
    result = _run("list", "--data-dir", str(tmp_path))
    fashion = _line(result.output, "fashion_mnist")
    assert f"not found (looked in {tmp_path})" in fashion
    assert f"datasets fetch fashion_mnist --to {tmp_path}" in fashion
    assert "apt-get install dataset-fashion-mnist" in fashion


def test_verify_passes_debians_recompressed_fashion_mnist_by_content_sha256(fashion_mnist_dir: Path) -> None:
    result = _run("verify", "fashion_mnist")
    assert result.exit_code == 0, result.output
    assert f"fashion_mnist: idx at {fashion_mnist_dir}" in result.output
    for f in FASHION_MNIST.files:
        line = _line(result.output, f"  ok    {f.gz_name}")
        assert f"{BY_CONTENT} (re-compressed copy" in line
    assert "all 4 files verified" in result.output


def test_verify_fails_a_tampered_file_with_one_line_naming_it_and_exit_1(
        fashion_mnist_dir: Path, tmp_path: Path) -> None:
    mirror_with_one_tampered_file(fashion_mnist_dir, tmp_path, "t10k-labels-idx1-ubyte.gz")
    result = _run("verify", "fashion_mnist", "--data-dir", str(tmp_path))
    assert result.exit_code == 1
    failures = [line for line in result.output.splitlines() if "FAIL" in line]
    assert failures == [_line(result.output, f"  FAIL  {tmp_path / 't10k-labels-idx1-ubyte.gz'}: ")]
    assert "neither the .gz md5" in failures[0]
    assert result.output.count("  ok    ") == 3
    assert "fashion_mnist: 1 of 4 files failed verification" in result.output


def test_verify_checks_an_npz_copy_array_by_array(fashion_mnist_dir: Path, tmp_path: Path) -> None:
    arrays = {f.key: read_idx(fashion_mnist_dir / f.gz_name) for f in FASHION_MNIST.files}
    arrays["y_train"] = arrays["y_train"].astype(np.int64)  # the dtype does not matter, the values do
    np.savez(tmp_path / "fashion_mnist.npz", **arrays)
    result = _run("verify", "fashion_mnist", "--data-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.output.count(f"array {BY_CONTENT} (as ") == 4
    arrays["x_test"][-1, -1, -1] ^= 1
    np.savez(tmp_path / "fashion_mnist.npz", **arrays)
    result = _run("verify", "fashion_mnist", "--data-dir", str(tmp_path))
    assert result.exit_code == 1
    failures = [line for line in result.output.splitlines() if "FAIL" in line]
    assert len(failures) == 1 and failures[0].startswith("  FAIL  fashion_mnist.npz[x_test]: ")


def test_verify_of_a_missing_dataset_is_one_clear_error(tmp_path: Path) -> None:
    result = _run("verify", "mnist", "--data-dir", str(tmp_path))
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert result.output.startswith(f"Error: mnist not found: looked in {tmp_path}")
    unknown = _run("verify", "cifar10")
    assert unknown.exit_code == 1 and "known datasets: digits, mnist, fashion_mnist" in unknown.output
    bundled = _run("verify", "digits")
    assert bundled.exit_code == 0 and "no files to verify" in bundled.output


def test_a_byte_exact_gz_verifies_by_md5_and_a_plain_idx_file_by_content(tmp_path: Path) -> None:
    dataset = tiny_dataset(tmp_path)
    spec = dataset.file("y_test")
    assert check_idx_file(tmp_path / spec.gz_name, spec).how == BY_MD5
    plain = tmp_path / spec.name
    plain.write_bytes(gzip.decompress((tmp_path / spec.gz_name).read_bytes()))
    check = check_idx_file(plain, spec)
    assert check.ok and check.how == f"{BY_CONTENT} (plain IDX)"


def test_a_corrupt_or_oversized_gz_fails_verification_with_the_reason(tmp_path: Path) -> None:
    spec = tiny_dataset(tmp_path).file("x_train")
    path = tmp_path / spec.gz_name
    path.write_bytes(path.read_bytes()[:100])
    check = check_idx_file(path, spec)
    assert not check.ok and check.how.startswith("unreadable: ")
    path.write_bytes(gzip.compress(b"\0" * (spec.content_size + 1)))
    check = check_idx_file(path, spec)
    assert not check.ok and "more than the expected" in check.how


def test_an_arrays_digest_is_the_sha256_of_its_idx_encoding_whatever_its_integer_dtype() -> None:
    labels = np.array([3, 1, 4, 1, 5], np.uint8)
    expected = hashlib.sha256(idx_bytes(labels)).hexdigest()
    assert array_sha256(labels) == expected == array_sha256(labels.astype(np.int64))
    with pytest.raises(ValueError, match="0..255"):
        array_sha256(np.array([256]))
    with pytest.raises(ValueError, match="not an integer"):
        array_sha256(np.zeros(3, np.float32))
