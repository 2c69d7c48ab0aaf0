"""One-time pairing codes: issue, check, lock out guessers.

A code is 8 characters of Crockford's base32 (no I, L, O, U), shown as ``K7QF-M2XD``:
40 random bits. Typing is forgiving: case, spaces and dashes do not matter, and O/I/L are
read as 0/1/1. The registry stores only ``HMAC-SHA256(key, code)`` with the fleet's key
(``pairing.key``, 0600, next to the fleet's file: ``fleet/fleet_store.py``), so the file
alone does not reveal live codes; a check compares the candidate's hash with every recent
code's hash using ``hmac.compare_digest``.

A code is single-use (claimed atomically by the first client that presents it) and expires
after its TTL. Wrong codes are recorded; ``max_failures`` wrong codes within ``window_s``
lock pairing for ``lockout_s`` seconds for everyone (client ids are free to choose, so a
per-client limit would not stop a guesser); while locked, even a right code is refused and
attempts are not counted. With 40-bit codes and the defaults (5 per 5 minutes), guessing a
code within its 10-minute life has a chance of about 1 in 10^10.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from sdk_device.protocol.errors import ProtocolError

from .membership import FleetMembers

log = logging.getLogger(__name__)

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford's base32
CODE_LENGTH = 8
KEEP_S = 7 * 24 * 3600  # used/expired codes are kept this long to say "used"/"expired"
SESSION_S = 600.0  # a claimed code's pairing must finish within this (benchmarking included)


@dataclass(frozen=True)
class LockoutPolicy:
    """``max_failures`` wrong codes within ``window_s`` seconds lock pairing for ``lockout_s``."""

    max_failures: int = 5
    window_s: float = 300.0
    lockout_s: float = 300.0


def new_code() -> str:
    """A fresh random code, formatted ``XXXX-XXXX``."""
    raw = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))
    return f"{raw[:4]}-{raw[4:]}"


def normalize(code: str) -> str | None:
    """The canonical 8 characters of a typed code, or None if it cannot be one."""
    cleaned = code.upper().replace("-", "").replace(" ", "")
    cleaned = cleaned.translate(str.maketrans({"O": "0", "I": "1", "L": "1"}))
    if len(cleaned) != CODE_LENGTH or any(c not in ALPHABET for c in cleaned):
        return None
    return cleaned


def load_key(key_dir: Path) -> bytes:
    """The fleet's pairing key in ``key_dir`` (32 random bytes), created 0600 on first use."""
    path = Path(key_dir) / "pairing.key"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return path.read_bytes()


def sha256_text(secret: str) -> str:
    """Hex sha256 of a high-entropy secret (session tokens, device passwords)."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    """A code that a client presented successfully: its row id and tier (None = auto)."""

    code_id: int
    tier: str | None
    session: str  # the secret token the client must present to finish
    session_expires: float  # unix seconds


class PairCodes:
    """Issue and check codes stored in ``registry`` (hashed with the key in ``key_dir``, the
    fleet's directory)."""

    def __init__(self, registry: FleetMembers, key_dir: Path, policy: LockoutPolicy | None = None) -> None:
        self.registry = registry
        self.key = load_key(key_dir)
        self.policy = policy or LockoutPolicy()

    def _hash(self, canonical: str) -> str:
        return hmac.new(self.key, canonical.encode(), hashlib.sha256).hexdigest()

    def issue(self, ttl_s: float, tier: str | None = None) -> tuple[str, float]:
        """Make a code valid for ``ttl_s`` seconds; returns (code, expiry in unix seconds)."""
        if ttl_s <= 0:
            raise ValueError(f"the code's lifetime must be > 0 s, got {ttl_s}")
        self.registry.forget_pair_codes(before=time.time() - KEEP_S)
        code = new_code()
        expires_at = time.time() + ttl_s
        self.registry.add_pair_code(self._hash(normalize(code)), tier, expires_at)
        return code, expires_at

    def locked_until(self, now: float | None = None) -> float | None:
        """Unix time pairing is locked until, or None when it is open."""
        now = time.time() if now is None else now
        p = self.policy
        recent = self.registry.pair_failures(since=now - p.window_s - p.lockout_s)
        if len(recent) < p.max_failures:
            return None
        last = recent[0]
        in_window = [t for t in recent if t >= last - p.window_s]
        until = last + p.lockout_s
        return until if len(in_window) >= p.max_failures and now < until else None

    def claim(self, typed: str, client_id: str) -> Claim:
        """Check a code a client typed and claim it for that client.

        Raises ProtocolError: ``pairing_locked``, ``code_wrong`` (counted towards the lock),
        ``code_expired``, ``code_used``. The same client presenting its own claimed code again
        (a retry) gets a fresh session for it.
        """
        now = time.time()
        until = self.locked_until(now)
        if until is not None:
            raise ProtocolError(
                "pairing_locked",
                f"too many wrong codes: pairing is locked for "
                f"{until - now:.0f} s more (until {time.strftime('%H:%M:%S', time.localtime(until))})",
            )
        canonical = normalize(typed)
        candidate = self._hash(canonical) if canonical else ""
        match = None
        for row in self.registry.pair_codes(since=now - KEEP_S):
            if hmac.compare_digest(row["code_hash"], candidate) and match is None:
                match = row  # keep comparing: the time taken does not depend on which code matched
        if match is None:
            self.registry.add_pair_failure(client_id, "wrong code")
            failures = len(self.registry.pair_failures(since=now - self.policy.window_s))
            log.warning(
                "pairing: wrong code from %s (%d of %d allowed in %.0f s)",
                client_id,
                failures,
                self.policy.max_failures,
                self.policy.window_s,
            )
            if self.locked_until() is not None:
                log.error("pairing: locked for %.0f s after %d wrong codes", self.policy.lockout_s, failures)
            raise ProtocolError("code_wrong", "this pairing code is not valid (check it and try again)")
        session = secrets.token_hex(16)
        session_expires = now + SESSION_S
        if match["used_at"] is not None:
            if match["used_by"] == client_id and match["device_id"] is None:
                self.registry.renew_pair_session(match["id"], sha256_text(session), session_expires)
                return Claim(match["id"], match["tier"], session, session_expires)
            raise ProtocolError("code_used", "this pairing code was already used (a code works once)")
        if match["expires_at"] < now:
            raise ProtocolError(
                "code_expired",
                f"this pairing code expired at "
                f"{time.strftime('%H:%M:%S', time.localtime(match['expires_at']))}",
            )
        if not self.registry.claim_pair_code(match["id"], client_id, sha256_text(session), session_expires):
            raise ProtocolError("code_used", "this pairing code was just used by another device")
        return Claim(match["id"], match["tier"], session, session_expires)

    def session(self, session: str) -> dict:
        """The claimed code row of a live ``session``; ProtocolError ``session_unknown`` else."""
        now = time.time()
        wanted = sha256_text(session)
        found = None
        for row in self.registry.pair_codes(since=now - KEEP_S):
            if row["session_hash"] and hmac.compare_digest(row["session_hash"], wanted) and found is None:
                found = row
        if found is None or found["session_expires"] < now or found["device_id"] is not None:
            raise ProtocolError(
                "session_unknown",
                "no open pairing session with this token "
                "(it expired or already finished): pair again with a new code",
            )
        return found
