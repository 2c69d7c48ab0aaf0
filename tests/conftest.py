"""Shared fixtures: a real mosquitto broker on a free loopback port."""

from __future__ import annotations

import logging
import shutil

import pytest

from server_toolkit.broker.mosquitto import MosquittoBroker


@pytest.fixture
def mosquitto(tmp_path):
    """A fresh mosquitto process for one test (fails, with the fix, if it is not installed)."""
    if shutil.which("mosquitto") is None and not __import__("os").path.exists("/usr/sbin/mosquitto"):
        pytest.fail("mosquitto is not installed: apt-get install -y mosquitto (the README's test "
                    "command does this)")
    with MosquittoBroker(workdir=tmp_path / "mosquitto") as broker:
        yield broker


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
