"""`fedsdk-server datasets fetch` and data.fetch against a local HTTP server on 127.0.0.1
(nothing is downloaded from the internet)."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from server_toolkit.cli import main
from server_toolkit.data.catalogue import DIGITS
from server_toolkit.data.fetch import FetchError, fetch_dataset
from server_toolkit.data.verify import BY_CONTENT, BY_MD5

from .dataset_helpers import http_server, mirror_with_one_tampered_file, tiny_dataset


def _fetch(*args: str):
    return CliRunner().invoke(main, ["datasets", "fetch", *args])


def _error_line(result) -> str:
    """The one error line of a failed command (the progress bars print above it)."""
    lines = result.output.strip().splitlines()
    errors = [line for line in lines if line.startswith("Error:")]
    assert result.exit_code == 1 and len(errors) == 1 and lines[-1] == errors[0], result.output
    return errors[0]


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".part"))


def test_fetch_from_a_mirror_of_debians_files_succeeds_and_verifies_them_by_content(
        fashion_mnist_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "data"
    with http_server(fashion_mnist_dir) as (url, requests):
        result = _fetch("fashion_mnist", "--to", str(dest), "--mirror", url)
    assert result.exit_code == 0, result.output
    assert len(requests) == 4
    assert result.output.count(f"{BY_CONTENT} (re-compressed copy") == 4
    for path in fashion_mnist_dir.iterdir():
        assert (dest / path.name).read_bytes() == path.read_bytes()
    assert _leftovers(dest) == []
    verify = CliRunner().invoke(main, ["datasets", "verify", "fashion_mnist", "--data-dir", str(dest)])
    assert verify.exit_code == 0 and "all 4 files verified" in verify.output


def test_a_tampered_file_is_refused_and_nothing_of_it_is_left_behind(
        fashion_mnist_dir: Path, tmp_path: Path) -> None:
    tampered = "train-labels-idx1-ubyte.gz"
    mirror = mirror_with_one_tampered_file(fashion_mnist_dir, tmp_path / "mirror", tampered)
    dest = tmp_path / "data"
    with http_server(mirror) as (url, _):
        result = _fetch("fashion_mnist", "--to", str(dest), "--mirror", url)
    line = _error_line(result)
    assert line.startswith(f"Error: fashion_mnist: could not fetch {tampered}: {url}{tampered}: ")
    assert "failed verification" in line and "not kept" in line
    # the file before it verified and stays; the tampered one and any temporary file are gone
    assert sorted(p.name for p in dest.iterdir()) == ["train-images-idx3-ubyte.gz"]


def test_a_404_is_one_clear_line_and_leaves_no_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    dest = tmp_path / "data"
    with http_server(empty) as (url, _):
        result = _fetch("mnist", "--to", str(dest), "--mirror", url)
    assert _error_line(result) == (f"Error: mnist: could not fetch train-images-idx3-ubyte.gz: "
                                   f"{url}train-images-idx3-ubyte.gz: HTTP 404 File not found")
    assert list(dest.iterdir()) == []


def test_an_unreachable_host_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = _fetch("mnist", "--to", str(tmp_path), "--mirror", f"http://127.0.0.1:{port}/")
    assert f"cannot reach 127.0.0.1:{port}" in _error_line(result)
    assert _leftovers(tmp_path) == [] and list(tmp_path.iterdir()) == []


def test_a_server_that_never_answers_times_out_with_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (backlog) but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        result = _fetch("mnist", "--to", str(tmp_path), "--mirror", f"http://127.0.0.1:{port}",
                        "--timeout", "0.3")
    assert _error_line(result).endswith("timed out after 0.3 s")
    assert list(tmp_path.iterdir()) == []


def test_mirrors_are_tried_in_order_until_one_serves_a_verified_file(tmp_path: Path) -> None:
    dataset = tiny_dataset(tmp_path / "good")
    (tmp_path / "empty").mkdir()
    with http_server(tmp_path / "empty") as (bad, _), http_server(tmp_path / "good") as (good, _):
        dataset = dataclasses.replace(dataset, mirrors=(bad, good))
        fetched = fetch_dataset(dataset, tmp_path / "data")
    assert [f.url for f in fetched] == [good + f.gz_name for f in dataset.files]
    assert all(f.check.ok and f.check.how == BY_MD5 for f in fetched)  # byte-exact copies


def test_a_file_already_there_and_verified_is_kept_without_downloading_again(tmp_path: Path) -> None:
    dataset = tiny_dataset(tmp_path / "mirror")
    with http_server(tmp_path / "mirror") as (url, requests):
        first = fetch_dataset(dataset, tmp_path / "data", mirror=url)
        second = fetch_dataset(dataset, tmp_path / "data", mirror=url)
    assert len(requests) == 4
    assert all(f.url is not None for f in first) and all(f.url is None for f in second)
    assert all(f.check.ok for f in second)


def test_an_existing_file_that_does_not_verify_is_never_overwritten(tmp_path: Path) -> None:
    dataset = tiny_dataset(tmp_path / "mirror")
    other = tiny_dataset(tmp_path / "other", seed=1)  # another dataset's file of the same name
    dest = tmp_path / "data"
    dest.mkdir()
    foreign = (tmp_path / "other" / "train-images-idx3-ubyte.gz").read_bytes()
    (dest / "train-images-idx3-ubyte.gz").write_bytes(foreign)
    with http_server(tmp_path / "mirror") as (url, requests), pytest.raises(FetchError) as err:
        fetch_dataset(dataset, dest, mirror=url)
    assert other.name == dataset.name  # same names, different content
    assert "exists but is not tiny's train-images-idx3-ubyte" in str(err.value)
    assert "fetch into another directory" in str(err.value)
    assert (dest / "train-images-idx3-ubyte.gz").read_bytes() == foreign and requests == []


def test_a_server_sending_more_than_the_file_can_be_is_cut_off(tmp_path: Path) -> None:
    dataset = tiny_dataset(tmp_path / "mirror")
    (tmp_path / "mirror" / "train-images-idx3-ubyte.gz").write_bytes(b"\0" * (2 << 20))
    too_long = pytest.raises(FetchError, match="more than the file can be")
    with http_server(tmp_path / "mirror") as (url, _), too_long:
        fetch_dataset(dataset, tmp_path / "data", mirror=url)
    assert list((tmp_path / "data").iterdir()) == []


def test_a_mirror_must_be_an_http_https_or_file_url(tmp_path: Path) -> None:
    dataset = tiny_dataset(tmp_path / "mirror")
    with pytest.raises(FetchError, match="must start with http://, https:// or file://"):
        fetch_dataset(dataset, tmp_path / "data", mirror="ftp://example.org/mnist/")
    fetched = fetch_dataset(dataset, tmp_path / "data", mirror=(tmp_path / "mirror").as_uri())
    assert all(f.check.ok for f in fetched)


def test_fetching_the_bundled_digits_says_there_is_nothing_to_fetch(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="ships with scikit-learn"):
        fetch_dataset(DIGITS, tmp_path)
    result = _fetch("nope", "--to", str(tmp_path))
    assert result.exit_code == 1 and "unknown dataset 'nope'" in result.output
