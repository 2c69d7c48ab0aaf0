"""Unit tests of one-time pairing codes (server_toolkit.fleet.pair_codes) on a real registry."""

from __future__ import annotations

import os
import stat
import time

import pytest

from sdk_device.protocol.errors import ProtocolError
from server_toolkit.fleet.pair_codes import ALPHABET, LockoutPolicy, PairCodes, new_code, normalize
from server_toolkit.fleet.registry import FleetRegistry


@pytest.fixture
def codes(tmp_path):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    yield PairCodes(registry, tmp_path, LockoutPolicy(max_failures=3, window_s=60.0, lockout_s=0.6))
    registry.close()


def _refused(codes: PairCodes, code: str, client: str = "c1") -> str:
    with pytest.raises(ProtocolError) as info:
        codes.claim(code, client)
    return info.value.code


def test_codes_look_right_and_typing_is_forgiving():
    code = new_code()
    assert len(code) == 9 and code[4] == "-" and all(c in ALPHABET for c in code.replace("-", ""))
    assert len({new_code() for _ in range(200)}) == 200
    assert normalize("k7qf m2xd") == "K7QFM2XD"
    assert normalize("O1IL-ABCD") == "0111ABCD"  # O->0, I/L->1
    assert normalize("K7QF-M2X") is None and normalize("K7QF-M2XU") is None  # short; U is not used


def test_only_hashes_are_stored_and_the_key_is_private(codes, tmp_path):
    code, _ = codes.issue(60)
    raw = (tmp_path / "registry.sqlite").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("registry.sqlite*")
    )
    assert normalize(code).encode() not in raw and code.encode() not in raw
    assert stat.S_IMODE(os.stat(tmp_path / "pairing.key").st_mode) == 0o600
    other = PairCodes(codes.registry, tmp_path)  # the same key: another process checks the same codes
    assert other.claim(code.lower(), "c1").code_id == 1


def test_a_code_works_once_and_the_same_client_may_retry(codes):
    code, _ = codes.issue(60)
    first = codes.claim(code, "c1")
    again = codes.claim(code, "c1")  # a retry by the same pairing client: a fresh session
    assert again.code_id == first.code_id and again.session != first.session
    assert codes.session(again.session)["used_by"] == "c1"
    with pytest.raises(ProtocolError, match="session_unknown"):
        codes.session(first.session)  # the old token no longer opens the session
    assert _refused(codes, code, "c2") == "code_used"
    codes.registry.finish_pair_code(first.code_id, "dev")
    assert _refused(codes, code, "c1") == "code_used"  # finished: not even its own client
    with pytest.raises(ProtocolError, match="session_unknown"):
        codes.session(again.session)


def test_expired_and_wrong_codes(codes):
    code, expires = codes.issue(0.2, tier="0.5")
    assert expires == pytest.approx(time.time() + 0.2, abs=1)
    time.sleep(0.3)
    assert _refused(codes, code) == "code_expired"
    assert _refused(codes, "ZZZZ-ZZZZ") == "code_wrong"
    assert _refused(codes, "not a code at all") == "code_wrong"
    assert len(codes.registry.pair_failures(since=0)) == 2  # only wrong codes count
    fresh, _ = codes.issue(60, tier="0.5")
    assert codes.claim(fresh, "c1").tier == "0.5"
    with pytest.raises(ValueError):
        codes.issue(0)


def test_a_burst_of_wrong_codes_locks_pairing_for_a_while(codes):
    good, _ = codes.issue(60)
    for guess in ("AAAA-AAAA", "BBBB-BBBB"):
        assert _refused(codes, guess) == "code_wrong"
    assert codes.locked_until() is None
    assert _refused(codes, "CCCC-CCCC") == "code_wrong"
    assert codes.locked_until() is not None
    assert _refused(codes, good) == "pairing_locked"  # even a right code
    assert _refused(codes, "DDDD-DDDD") == "pairing_locked"
    assert len(codes.registry.pair_failures(since=0)) == 3  # attempts while locked are not counted
    time.sleep(0.7)
    assert codes.locked_until() is None
    assert codes.claim(good, "c1").code_id == 1
