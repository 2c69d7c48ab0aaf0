"""Secure aggregation maths shared by the device (``sdk_device/secagg_client.py``) and the
server (``server_toolkit/secagg/``): torch-free, ``numpy`` and ``cryptography`` only.

* ``shamir``: t-of-n secret sharing of 32-byte secrets over the prime field 2**521 - 1;
* ``crypto``: X25519 key pairs, HKDF-derived pairwise seeds and keys, AES-GCM boxes;
* ``masks``: the AES-CTR pseudo-random masks, expanded over uint64 (arithmetic mod 2**64);
* ``fixed_point``: floats <-> uint64 fixed point, and the range that keeps sums from wrapping;
* ``layout``: global coordinates, where a sub-model's tensors scatter into the global vector;
* ``graph``: the sparse neighbour graph (a randomly permuted Harary graph, SecAgg+).
"""
