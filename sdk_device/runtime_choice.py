"""Which runtime a device trains with: the fastest one that passed parity on its own program.

When a task offers programs that more than one installed runtime can train, the agent runs
the self-test (``runtimes/selftest.py``: one SGD step compared with torch autograd, then
timed steps) once per architecture, keeps the fastest runtime that passed, and remembers
the choice in ``<work dir>/runtime_choice.json`` (keyed by the torchspec program's id).
``fedsdk bench`` runs the same self-test on the last task's programs and prints the table.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from fedcore.recipe import Recipe

from .benchmark import trainable
from .protocol import messages as msgs
from .protocol.blobs import decode_tensors

log = logging.getLogger(__name__)

REFERENCE = "torchspec/1"


def trainable_offers(programs: list[msgs.BlobRef], allowed: list[str] | None) -> dict[str, str]:
    """runtime -> format, for each installed (allowed) runtime that can train one of ``programs``
    (a model's programs in several formats)."""
    return trainable({p.format for p in programs}, allowed)


class RuntimeChooser:
    """Remembers, per architecture, the runtime the self-test picked."""

    def __init__(self, work_dir: Path) -> None:
        self.path = Path(work_dir) / "runtime_choice.json"
        self.last_task_path = Path(work_dir) / "last_task.json"
        self.choices: dict[str, dict] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def remember_task(self, task: msgs.Task) -> None:
        """Keep the last task's program and weight references for ``fedsdk bench``."""
        self.last_task_path.parent.mkdir(parents=True, exist_ok=True)
        self.last_task_path.write_text(msgs.encode(task).decode())

    def choose(self, programs: list[msgs.BlobRef], weights: msgs.BlobRef, recipe: Recipe,
               offers: dict[str, str], fetch, x: np.ndarray, y: np.ndarray) -> str | None:
        """The runtime to train a model (its ``programs`` in several formats, its ``weights``,
        by ``recipe``) with, or None to use the preference order.

        ``fetch(ref) -> bytes`` pulls a blob. Runs the self-test when several runtimes can
        train the model and this architecture has not been tested yet.
        """
        reference = next((p for p in programs if p.format == REFERENCE), None)
        if len(offers) < 2 or reference is None or "torch" not in offers:
            return None
        known = self.choices.get(reference.id)
        if known is not None:
            return known["runtime"]
        from .runtimes.selftest import fastest_passing, format_table, run_selftest

        built = {p.format: fetch(p) for p in programs if p.format in set(offers.values())}
        rows = run_selftest(built, decode_tensors(fetch(weights)), x, y, recipe, steps=3,
                            runtimes=list(offers))
        chosen = fastest_passing(rows)
        log.info("runtime self-test on this program:\n%s\nchosen: %s", format_table(rows), chosen)
        if chosen is not None:
            self.choices[reference.id] = {"runtime": chosen, "rows": [r.to_dict() for r in rows]}
            self.path.write_text(json.dumps(self.choices, indent=2))
        return chosen
