"""The tensors a device keeps to itself between tasks (protocol v2, "array records may omit
tensors"): a task's array record may leave out some of its program's tensors (e.g. BatchNorm
running statistics that MH-pFedHN keeps on the device). ``LocalTensors`` keeps the device's
own last values per program and fills the gaps; the device returns exactly the tensors it
received.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .protocol.blobs import decode_tensors, encode_tensors

Weights = dict[str, np.ndarray]


class LocalTensors:
    """The device's own last full weights per program (by program blob id), kept under
    ``root`` as safetensors so they survive agent restarts (``root`` None: memory only)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else None
        self._cache: dict[str, Weights] = {}

    def _path(self, program_id: str) -> Path | None:
        return None if self.root is None else self.root / f"{program_id}.safetensors"

    def get(self, program_id: str) -> Weights | None:
        if program_id not in self._cache:
            path = self._path(program_id)
            if path is None or not path.is_file():
                return None
            self._cache[program_id] = decode_tensors(path.read_bytes())
        return self._cache[program_id]

    def put(self, program_id: str, weights: Weights) -> None:
        self._cache[program_id] = weights
        path = self._path(program_id)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(encode_tensors(weights))
            tmp.replace(path)

    def complete(self, program_id: str, sent: Weights, current: Weights) -> Weights:
        """``sent`` plus, for the program's tensors it omits, this device's last values (or
        ``current``, the runtime's weights right after loading, the first time)."""
        missing = set(current) - set(sent)
        if not missing:
            return sent
        unknown = sorted(set(sent) - set(current))
        if unknown:
            raise KeyError(f"weights do not fit the program: unexpected {unknown[:5]}")
        own = self.get(program_id) or {}
        filled = {k: (own[k] if k in own and own[k].shape == current[k].shape else current[k])
                  for k in missing}
        return {**sent, **filled}

    def remember(self, program_id: str, sent: Weights, trained: Weights) -> Weights:
        """Keep ``trained`` (full) when the task sent a subset; return the tensors to upload:
        exactly the names that were sent."""
        if set(trained) != set(sent):
            self.put(program_id, trained)
        return {k: trained[k] for k in sent}
