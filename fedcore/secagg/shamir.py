"""Shamir secret sharing (t of n) of 32-byte secrets over GF(P), P = 2**521 - 1 (a Mersenne
prime, larger than any 32-byte secret). Share holders are numbered 1..n (the x coordinate);
any ``t`` shares give the secret back, fewer give nothing about it."""

from __future__ import annotations

import secrets

P = 2**521 - 1
SECRET_BYTES = 32
SHARE_BYTES = 66  # a field element, big-endian


def share(secret: bytes, threshold: int, holders: list[int]) -> dict[int, bytes]:
    """Shares of ``secret`` (32 bytes) for the x coordinates ``holders`` (distinct, 1..P-1):
    {x: 66-byte share}. ValueError when ``threshold`` is not in 1..len(holders)."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a secret is {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= threshold <= len(holders) or len(set(holders)) != len(holders):
        raise ValueError(f"threshold {threshold} needs 1..{len(holders)} distinct holders")
    coefficients = [int.from_bytes(secret, "big")] + [secrets.randbelow(P) for _ in range(threshold - 1)]
    out = {}
    for x in holders:
        y = 0
        for c in reversed(coefficients):  # Horner
            y = (y * x + c) % P
        out[x] = y.to_bytes(SHARE_BYTES, "big")
    return out


def reconstruct(shares: dict[int, bytes], threshold: int) -> bytes:
    """The secret from at least ``threshold`` shares {x: share} (Lagrange at 0); ValueError
    with fewer. More than ``threshold`` shares: the first ``threshold`` by x are used."""
    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} shares, {threshold} needed")
    points = sorted(shares.items())[:threshold]
    total, common = 0, 1  # the sum of the Lagrange terms as one fraction: a single inverse
    for i, (xi, yi) in enumerate(points):
        num = den = 1  # small integers: exact products, reduced once
        for j, (xj, _) in enumerate(points):
            if i != j:
                num *= -xj
                den *= xi - xj
        num, den = num % P, den % P
        total = (total * den + int.from_bytes(yi, "big") * num * common) % P
        common = common * den % P
    secret = total * pow(common, -1, P) % P
    if secret >= 2 ** (8 * SECRET_BYTES):
        raise ValueError("the shares do not belong to one 32-byte secret")
    return secret.to_bytes(SECRET_BYTES, "big")
