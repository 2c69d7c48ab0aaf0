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
