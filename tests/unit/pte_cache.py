"""A pytest fixture that exports ExecuTorch programs once and keeps them across test runs.

Programs live in the program store the server uses (``export/program_store.py``:
``$FEDSDK_CACHE_DIR/programs`` or ``~/.cache/fedsdk/programs``), under the server's own keys,
so a program a test exported is the one a server started later in the session offers, and the
reverse. The key covers the spec, loss, batch, kernel set and the exporter's source and
versions (a change to the exporter re-exports); deleting the directory forces fresh exports.
To use it, import ``cached_programs`` into a test module and ask for the ``program_for`` fixture.
"""

from __future__ import annotations

import pytest

from export.executorch import export_training_program
from export.program_store import ProgramStore
from export.programs import program_key, store_key

FORMAT = "pte/1"


@pytest.fixture(scope="session", name="program_for")
def cached_programs():
    """program_for(spec, loss, batch, kernels="portable") -> .pte bytes (exported once, then
    read from disk)."""
    store = ProgramStore()

    def get(spec: dict, loss: dict, batch: int, kernels: str = "portable") -> bytes:
        key = store_key(program_key(spec, FORMAT, loss, batch), kernels)
        data, _ = store.get_or_make(
            key, FORMAT, lambda: export_training_program(spec, loss, batch, kernels=kernels))
        return data

    return get
