"""Key agreement and encryption: X25519 key pairs, HKDF-SHA256 over the shared secret, and
AES-256-GCM boxes for the Shamir shares a device sends its neighbours through the server."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

MASK_INFO = b"fedsdk secagg pairwise mask v1"
BOX_INFO = b"fedsdk secagg share box v1"


def new_private() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The 32-byte raw public key."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_bytes(key: X25519PrivateKey) -> bytes:
    """The 32-byte raw private key (what a device Shamir-shares of its mask key)."""
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def private_from(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def agree(private: X25519PrivateKey, peer_public: bytes, info: bytes, context: bytes) -> bytes:
    """32 bytes both ends derive alike: HKDF-SHA256 of the X25519 shared secret; ``info``
    separates uses (masks, boxes), ``context`` binds the round."""
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(hashes.SHA256(), 32, salt=None, info=info + b"|" + context).derive(shared)


def seal(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """AES-256-GCM: 12-byte random nonce + ciphertext + tag."""
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def open_box(key: bytes, box: bytes, associated: bytes) -> bytes:
    """The plaintext of ``seal``; ``cryptography.exceptions.InvalidTag`` when forged."""
    return AESGCM(key).decrypt(box[:12], box[12:], associated)
