"""Checkpoints: the global weights (safetensors) and the round state (JSON) after a round."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.numpy import load_file, save_file

from ..methods.base import Weights


class CheckpointError(ValueError):
    """A run's state.json or checkpoint file that cannot be read (the message names the file,
    what is wrong with it and what to do)."""


_FIX = "restore the file from a backup, or start a new run"


def check_checkpoint(run_dir: Path, state: dict) -> Path:
    """The checkpoint file ``state`` names, checked whole without loading it: its safetensors
    header parses and its tensors fit in the file. CheckpointError otherwise."""
    name = state.get("checkpoint")
    if not isinstance(name, str) or not isinstance(state.get("round"), int):
        raise CheckpointError(f"{run_dir / 'state.json'} has no round or checkpoint entry; {_FIX}")
    path = run_dir / "checkpoints" / name
    if not path.is_file():
        raise CheckpointError(f"{path} (named by {run_dir / 'state.json'}) is missing; {_FIX}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            if not 0 < length <= size - 8:
                raise ValueError("the header is cut off")
            header = json.loads(f.read(length))
            ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise CheckpointError(f"{path} is not a whole safetensors file ({exc}); {_FIX}") from None
    if 8 + length + max(ends, default=0) > size:
        raise CheckpointError(f"{path} is truncated ({size} bytes, its header needs "
                              f"{8 + length + max(ends)}); {_FIX}")
    return path


def save_checkpoint(run_dir: Path, round_number: int, weights: Weights, state: dict, keep: int = 3) -> Path:
    """Write ``checkpoints/global_r<NNNN>.safetensors`` then ``state.json`` (atomically);
    then delete all but the ``keep`` newest checkpoint files (a hypernetwork's weights are
    tens of MB a round)."""
    ckpt_dir = run_dir / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"global_r{round_number:04d}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file(weights, str(tmp))
    os.replace(tmp, path)
    body = {**state, "round": round_number, "checkpoint": path.name}
    tmp_state = run_dir / "state.json.tmp"
    tmp_state.write_text(json.dumps(body, indent=2))
    os.replace(tmp_state, run_dir / "state.json")
    for old in sorted(ckpt_dir.glob("global_r*.safetensors"))[:-max(1, keep)]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(run_dir: Path) -> tuple[int, Weights, dict] | None:
    """(last completed round, its global weights, state) or None when there is none."""
    state_path = run_dir / "state.json"
    if not state_path.is_file():
        return None
    try:
        state = json.loads(state_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{state_path} is damaged ({exc}); {_FIX}") from None
    weights = load_file(str(check_checkpoint(run_dir, state)))
    return int(state["round"]), weights, state
