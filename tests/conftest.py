"""Shared fixtures: a real mosquitto broker on a free loopback port (anonymous, or secured
with per-device accounts + ACL, optionally over TLS), and Debian's Fashion-MNIST files."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from server_toolkit.broker.mosquitto import MosquittoBroker
from server_toolkit.broker.secured import make_secured_broker
from server_toolkit.data.catalogue import FASHION_MNIST


def _require_mosquitto() -> None:
    if shutil.which("mosquitto") is None and not os.path.exists("/usr/sbin/mosquitto"):
        pytest.fail("mosquitto is not installed: apt-get install -y mosquitto (the README's test "
                    "command does this)")


@pytest.fixture
def mosquitto(tmp_path):
    """A fresh anonymous mosquitto process for one test (fails, with the fix, if not installed)."""
    _require_mosquitto()
    with MosquittoBroker(workdir=tmp_path / "mosquitto") as broker:
        yield broker


@pytest.fixture
def secured_mosquitto(tmp_path):
    """A mosquitto enforcing fedsdk's accounts and ACL for fleet "sec" (plain TCP, loopback).

    Yields a ``SecuredBroker``: ``.security`` grants/revokes device accounts (live at once),
    ``.security.server_credentials()``, ``.address``/``.url``, ``.fleet``.
    """
    _require_mosquitto()
    with make_secured_broker(tmp_path / "secured", "sec") as secured:
        yield secured


@pytest.fixture
def secured_mosquitto_tls(tmp_path):
    """Like ``secured_mosquitto``, but the only listener is TLS (``mqtts://``) with a CA made
    by ``certs.init_certs`` in ``<tmp>/secured/certs``; ``.ca_file`` is the CA to trust."""
    _require_mosquitto()
    with make_secured_broker(tmp_path / "secured", "sec", tls=True) as secured:
        yield secured


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> Path:
    """Debian's Fashion-MNIST directory (package dataset-fashion-mnist: the four IDX .gz files,
    re-compressed by Debian); fails, with the fix, if it is not installed."""
    directory = FASHION_MNIST.system_dirs[0]
    missing = [f.gz_name for f in FASHION_MNIST.files if not (directory / f.gz_name).is_file()]
    if missing:
        pytest.fail(f"Fashion-MNIST is not installed ({directory} lacks {', '.join(missing)}): "
                    f"apt-get install -y {FASHION_MNIST.package} (the README's test command does this)")
    return directory


@pytest.fixture(autouse=True)
def _quiet_paho():
    logging.getLogger("paho").setLevel(logging.WARNING)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's torch work on one thread: tiny tensors gain nothing from threads, and
    on a busy 2-core machine two threads oversubscribe (measured 10x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def cpp_device() -> Path:
    """The C++ device client binary (device_cpp/), built once per session (Release, -j2)."""
    from tests.integration.cpp_client import build_client

    return build_client()


# -- scheduling on xdist workers (``make test`` runs ``-n 2 --dist loadfile``) -------------------
# Files that share a session's expensive artefacts run on one worker, so the artefacts are made
# once while the other worker runs other files: the ExecuTorch runtimes' parity tests reuse the
# export parity matrix's programs (exported in the worker's session, ~4 min for the VGG alone).
SAME_WORKER = {"tests/unit/test_native_runtime.py": "tests/unit/test_export_parity.py"}

# Files of independent, long tests (1-5 min each, no module fixtures) whose tests are spread
# over the workers one by one: as one scope, test_every_method's 20 methods took 44 min of one
# worker (loaded machine), longer than the rest of the suite on the other.
PER_TEST = {"tests/integration/test_every_method.py"}

# The slowest files (measured with ``--durations``, summed per file) start first: a worker that
# picks one near the end of the run would finish long after the other.
SLOW_FIRST = [
    "tests/unit/test_export_parity.py",  # with test_native_runtime.py: every program exported
    "tests/integration/test_every_method.py",
    "tests/integration/test_java_device.py",
    "tests/integration/test_byo.py",
    "tests/integration/test_edges.py",
    "tests/integration/test_embedded_broker.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_runtime_choice.py",
    "tests/integration/test_cpp_client_parity.py",
    "tests/integration/test_pte_from_doc.py",
]


def pytest_collection_modifyitems(config, items):
    """Order the session: the ``SLOW_FIRST`` files first, each file's tests kept in order."""
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}

    def key(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return rank.get(SAME_WORKER.get(path, path), len(rank))

    items[:] = sorted(items, key=key)  # stable: the collection order within equal ranks


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the ``SAME_WORKER`` files grouped into one scope and the
    ``PER_TEST`` files' tests scheduled one by one."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # xdist would sort the scopes by their number of tests (putting every PER_TEST test last);
    # keep the collection order, which starts with SLOW_FIRST
    config.option.loadscopereorder = False

    class GroupedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return nodeid if path in PER_TEST else SAME_WORKER.get(path, path)

    return GroupedFiles(config, log)
