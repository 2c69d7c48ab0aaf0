"""A device on a network of its own (issue 28): a device process in a network namespace made
for the test, joined to the root namespace (broker and server) by a veth pair with addresses
only on that pair (tests/netns_link.py); its uplink shaped to 512 kbit/s with tbf (netem is not
in this kernel). The link goes down for 20 s while the server pulls the device's result: the
pull resumes where it stopped (no chunk fetched twice over) and the update is accepted in that
round. bench/netns.py measures more conditions (loss, bandwidth, flapping).

Needs root and ``ip netns`` (CI runs as root on this machine kind); elsewhere it is skipped with
the reason.
"""

from __future__ import annotations

import pytest

from ..netns_link import NetnsLink, available
from .netns_round import CHUNK_BYTES, far_round, outage_mid_pull

pytestmark = pytest.mark.integration

OUTAGE_S = 20.0


def test_a_link_down_for_20_s_mid_upload_resumes_the_pull_and_the_update_counts(tmp_path):
    if why := available():
        pytest.skip(why)
    with NetnsLink(tag=200) as net:
        net.uplink("512kbit")
        got = far_round(net, tmp_path, outage_mid_pull(net, tmp_path, OUTAGE_S))
    assert got["outage"].get("chunks_before", 0) >= 2, got["log"]
    assert got["accepted"] == 1, got["log"]
    assert got["blob_bytes"] > CHUNK_BYTES * 4
    # resumed: the chunks held before the outage were not fetched again (a restart would pull
    # about the whole blob once more)
    assert got["bytes_pulled"] < got["blob_bytes"] + CHUNK_BYTES * 16
    assert got["seconds"] >= OUTAGE_S
