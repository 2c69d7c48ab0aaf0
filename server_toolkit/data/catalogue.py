"""The datasets fedsdk knows by name: their files, canonical mirrors, checksums and licences.

Each MNIST-style dataset is four IDX files. Per file the catalogue holds two digests:

* ``gz_md5``: the MD5 of the canonical ``.gz`` file as published (a byte-exact copy);
* ``content_sha256``: the SHA-256 of the decompressed IDX bytes (header + data). It also
  holds for a re-compressed copy (Debian's ``dataset-fashion-mnist`` re-gzipped the files)
  and for the same arrays stored in an npz (see ``verify``).

The content digests were computed here from copies whose ``.gz`` MD5s matched the published
ones; sizes are in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import DatasetError

SPLIT_KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass(frozen=True)
class IdxFile:
    """One IDX file of a dataset: ``key`` (x_train, y_train, x_test, y_test), its canonical
    ``name`` without ``.gz``, and its digests and sizes (bytes)."""

    key: str
    name: str
    gz_md5: str
    gz_size: int
    content_sha256: str
    content_size: int

    @property
    def gz_name(self) -> str:
        return f"{self.name}.gz"


@dataclass(frozen=True)
class KnownDataset:
    """A dataset known by name.

    ``files``: its IDX files (empty for a bundled dataset); ``npz_name``: the npz holding
    x_train, y_train, x_test, y_test; ``mirrors``: base URLs serving the ``.gz`` files, tried in
    order; ``system_dirs``: where an OS package installs it (used when no data dir is given);
    ``package``: that Debian package; ``image_shape``: (H, W) of one image."""

    name: str
    title: str
    licence: str
    homepage: str
    num_classes: int = 10
    image_shape: tuple[int, int] = (28, 28)
    train_size: int = 0
    test_size: int = 0
    files: tuple[IdxFile, ...] = ()
    npz_name: str = ""
    mirrors: tuple[str, ...] = ()
    system_dirs: tuple[Path, ...] = ()
    package: str | None = None
    bundled: str | None = None

    @property
    def subdir_names(self) -> tuple[str, ...]:
        """Sub-directories of a data dir that may hold this dataset's files (one data dir
        can then hold several datasets whose IDX file names collide)."""
        return tuple(dict.fromkeys((self.name, self.name.replace("_", "-"))))

    def file(self, key: str) -> IdxFile:
        return next(f for f in self.files if f.key == key)

    def how_to_get(self, to: str = "DIR") -> str:
        """One sentence on how to obtain the files."""
        if self.bundled:
            return f"it ships with {self.bundled}"
        text = f"get it with `fedsdk-server datasets fetch {self.name} --to {to}`"
        if self.package:
            text += f" or `apt-get install {self.package}` (found without --data-dir)"
        return text


MNIST = KnownDataset(
    name="mnist",
    title="MNIST handwritten digits (LeCun, Cortes, Burges)",
    licence="CC BY-SA 3.0",
    homepage="http://yann.lecun.com/exdb/mnist/",
    train_size=60000,
    test_size=10000,
    files=(
        IdxFile("x_train", "train-images-idx3-ubyte", "f68b3c2dcbeaaa9fbdd348bbdeb94873", 9912422,
                "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db", 47040016),
        IdxFile("y_train", "train-labels-idx1-ubyte", "d53e105ee54ea40749a09fcbcd1e9432", 28881,
                "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5", 60008),
        IdxFile("x_test", "t10k-images-idx3-ubyte", "9fb629c4189551a2d022fa330f9573f3", 1648877,
                "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7", 7840016),
        IdxFile("y_test", "t10k-labels-idx1-ubyte", "ec29112dd5afa0611ce80d1b7f02629c", 4542,
                "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2", 10008),
    ),
    npz_name="mnist.npz",
    mirrors=(
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ),
)

FASHION_MNIST = KnownDataset(
    name="fashion_mnist",
    title="Fashion-MNIST (Zalando Research; Xiao, Rasul, Vollgraf 2017)",
    licence="MIT",
    homepage="https://github.com/zalandoresearch/fashion-mnist",
    train_size=60000,
    test_size=10000,
    files=(
        IdxFile("x_train", "train-images-idx3-ubyte", "8d4fb7e6c68d591d4c3dfef9ec88bf0d", 26421880,
                "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888", 47040016),
        IdxFile("y_train", "train-labels-idx1-ubyte", "25c81989df183df01b3e8a0aad5dffbe", 29515,
                "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9", 60008),
        IdxFile("x_test", "t10k-images-idx3-ubyte", "bef4ecab320f06d8554ea6380940ec79", 4422102,
                "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b", 7840016),
        IdxFile("y_test", "t10k-labels-idx1-ubyte", "bb300cfdad3c16e7a12a480ee83cd310", 5148,
                "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34", 10008),
    ),
    npz_name="fashion_mnist.npz",
    mirrors=(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "https://storage.googleapis.com/tensorflow/tf-keras-datasets/",
    ),
    system_dirs=(Path("/usr/share/datasets/fashion-mnist"),),
    package="dataset-fashion-mnist",
)

DIGITS = KnownDataset(
    name="digits",
    title="scikit-learn's 8x8 handwritten digits (UCI optdigits test set)",
    licence="CC BY 4.0 (UCI)",
    homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html",
    image_shape=(8, 8),
    bundled="scikit-learn",
)

CATALOGUE: dict[str, KnownDataset] = {d.name: d for d in (DIGITS, MNIST, FASHION_MNIST)}


def known_dataset(name: str) -> KnownDataset:
    """The catalogue entry of ``name`` ("fashion-mnist" is accepted for "fashion_mnist");
    DatasetError listing the known names otherwise."""
    key = name.strip().lower().replace("-", "_")
    if key not in CATALOGUE:
        raise DatasetError(f"unknown dataset {name!r}; known datasets: {', '.join(CATALOGUE)}")
    return CATALOGUE[key]
