"""The server's own data: an IID slice of the training set that no device gets.

Some methods tune server-side modules on a little labelled data (FedConv: 5 % of the
training set). ``take_server_slice`` cuts that slice, stratified by label and seeded, and
returns the rest, which is what gets partitioned among the devices. A method asks for the
slice by its ``server_fraction`` (see ``methods.base.Method``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .split import stratified_split


@dataclass(frozen=True)
class ServerSlice:
    """``server``: (x, y) the server keeps; ``rest``: (x, y) left for the devices."""

    server: tuple[np.ndarray, np.ndarray]
    rest: tuple[np.ndarray, np.ndarray]


def take_server_slice(x: np.ndarray, y: np.ndarray, fraction: float, seed: int = 0) -> ServerSlice:
    """Keep ``round(fraction * count)`` samples of every label for the server (at least one
    sample overall); ValueError if ``fraction`` is not in (0, 1)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"server data fraction must be in (0, 1), got {fraction}")
    rest, server = stratified_split(np.asarray(y), fraction, np.random.default_rng([seed, 5]))
    if len(server) == 0:
        raise ValueError(f"a server fraction of {fraction} of {len(y)} samples keeps no sample")
    return ServerSlice(server=(x[server], y[server]), rest=(x[rest], y[rest]))
