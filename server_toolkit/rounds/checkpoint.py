"""Checkpoints: the global weights (safetensors) and the round state (JSON) after a round."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.numpy import load_file, save_file

from ..methods.base import Weights


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
    state = json.loads(state_path.read_text())
    weights = load_file(str(run_dir / "checkpoints" / state["checkpoint"]))
    return int(state["round"]), weights, state
