"""Masks: a 32-byte seed expanded by AES-256-CTR into uint64 words (arithmetic mod 2**64).

A pairwise mask between devices u and v is added by the one with the smaller id and
subtracted by the other, so it cancels in the sum; a self mask is removed by the server
once it has reconstructed the seed."""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def expand(seed: bytes, length: int) -> np.ndarray:
    """``length`` pseudo-random uint64 words from a 32-byte seed (AES-256-CTR, zero IV)."""
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(b"\0" * 16)).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * length)), dtype="<u8")  # read-only view


def pairwise_sign(me: str, other: str) -> int:
    """+1 when ``me`` adds the pair's mask, -1 when it subtracts it."""
    if me == other:
        raise ValueError("no pairwise mask with oneself")
    return 1 if me < other else -1


def apply(vector: np.ndarray, seed: bytes, sign: int) -> None:
    """``vector += sign * expand(seed)`` in place, mod 2**64 (uint64 wraps)."""
    mask = expand(seed, len(vector))
    if sign > 0:
        vector += mask
    else:
        vector -= mask
